"""The test lab: real proxy servers, interceptors and TLS material for tests and benchmarks."""
