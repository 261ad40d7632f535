"""Agents (worker and checker; the seed node to come) and their engine: fetch, extract, check."""
