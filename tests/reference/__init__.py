"""Differential tests against the reference implementation (make test-reference)."""
