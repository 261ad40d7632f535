"""Benchmarks (`ppf bench ...`) and their synthetic load."""
