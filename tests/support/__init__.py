"""Builders and fakes shared by the unit tests (and importable from the integration tests)."""
