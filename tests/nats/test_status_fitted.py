"""A status reply always fits one NATS message, whatever the service holds."""

from __future__ import annotations

import json

from workerset_admission.adapters.nats.status import fitted

MAX_PAYLOAD = 64 * 1024


def _render(groups: int, invalid: int) -> object:
    def render(brief: bool) -> bytes:
        group = {"model": "m" * 40, "admitted": 3 if brief else list(range(300))}
        return json.dumps(
            {
                "frontend": "f" * 5000,
                "health": "healthy",
                "invalid_total": invalid,
                "groups": [group] * groups,
                "recent_invalid": [{"key": "k", "detail": "d" * 400}] * min(invalid, 50),
            }
        ).encode()

    return render


def test_a_small_status_is_sent_whole() -> None:
    render = _render(3, 1)
    assert fitted(render, MAX_PAYLOAD) == render(False)  # type: ignore[operator]


def test_a_large_status_is_sent_brief_then_as_a_summary_that_always_fits() -> None:
    brief = _render(100, 5)
    assert fitted(brief, MAX_PAYLOAD) == brief(True)  # type: ignore[operator]
    for groups in (1_000, 100_000):
        body = fitted(_render(groups, 10**6), MAX_PAYLOAD)  # type: ignore[arg-type]
        assert len(body) < 2048
        summary = json.loads(body)
        assert summary["groups"] == []
        assert summary["groups_count"] == groups
        assert summary["invalid_total"] == 10**6
        assert summary["recent_invalid_count"] == 50
        assert summary["health"] == "healthy"
        assert len(summary["frontend"]) == 200
        assert "max_payload" in summary["truncated"]
