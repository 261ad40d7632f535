"""The consumers' side: one proxy address that rotates through the live pool for them
(``ppf serve``), in three rooms, each calling only the one below it:

- ``connection/``: the client's bytes. HTTP, CONNECT and SOCKS5 read into one
  ``Request`` (``link/request.py``), answers and refusals written back, the client's
  deadlines.
- ``router/``: who may ask (the door), which upstream carries a request (the pool),
  hedged opens and retries, and what a site's answers teach.
- ``link/``: one upstream connection: opened, sent on, relayed; the idle ones kept.

A lower room never imports a higher one: where it must be heard from on the hot path,
it declares the callbacks it calls (``link.uplink.Client``, ``router.forwarding.Answering``)
and the room above implements them. ``feed.py`` and ``share.py`` feed the router's pool
and logins from the gateways."""
