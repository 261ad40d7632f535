"""The link room: one upstream connection, opened through the proxy, a request sent on
it and its answer relayed; the idle ones kept for the next request. Imports nothing of
the rooms above (``router/``, ``connection/``)."""
