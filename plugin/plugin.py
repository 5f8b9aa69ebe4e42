"""Where ``create_service`` was first imported from; it lives in ``service/factory.py`` now."""

from __future__ import annotations

from workerset_admission.service.factory import create_service

__all__ = ["create_service"]
