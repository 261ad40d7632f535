"""The log below the gateway: the NATS adapter. What the projections, the gateway and
the agents need of the log (``protocol.py``: its Protocol, errors and message form), the
JetStream client (``client.py``), the lean stream reader (``stream.py``, its frames in
C where built), object buckets, connections. Imports ``events/`` and nothing of
``projections/``, ``gateway/``, ``agents/`` or ``ops/``."""
