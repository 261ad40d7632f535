"""Logging setup, the Axiom tap and its dashboards."""
