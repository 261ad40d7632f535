"""Agents (worker, checker, seed node) and their shared engine. Built in issue 4."""
