"""Operations: the CLI (cli/), NATS (nats/), benchmarks (bench/), the test lab (lab/),
logging and the Axiom tap (telemetry/), generated schemas."""
