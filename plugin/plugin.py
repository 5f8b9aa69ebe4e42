"""Where ``create_service`` was first imported from; it lives in ``wiring/compose.py`` now."""

from __future__ import annotations

from workerset_admission.wiring.compose import create_service

__all__ = ["create_service"]
