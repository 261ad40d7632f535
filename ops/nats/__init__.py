"""The embedded nats-server and a cluster of them (the log's client is ``eventlog/``)."""
