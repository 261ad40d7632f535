"""The router room: the door (logins, limits, revocation), the pool and its picks, hedged
opens, retries, and what sites' answers teach. Hands requests down to the link room;
hears the connection room only through the callbacks it declares (``Answering``)."""
