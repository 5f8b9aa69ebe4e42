"""Bundled replay traces."""
