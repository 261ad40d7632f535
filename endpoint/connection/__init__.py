"""The connection room: a client's bytes. HTTP (httptools), CONNECT and SOCKS5 are read
into one request and handed to the router; answers and refusals are written back; a
slow or silent client is cut (``deadlines.py``)."""
