"""Embedded nats-server, the JetStream client (the log) and the stream reader."""
