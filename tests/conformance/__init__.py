"""Comparisons with the real Dynamo 1.6.1 runtime (skipped when it is not installed)."""
