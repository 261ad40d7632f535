"""Operations: the ppf CLI, embedded NATS, the JetStream client, benchmarks."""
