"""The status table printed by ``workerset-admission status``."""

from __future__ import annotations

import re
from typing import Any

from workerset_admission.cli.serve import render_status_table


def _group(**fields: Any) -> dict[str, Any]:
    """One ready group of the status reply, with ``fields`` on top."""
    return {
        "model": "m",
        "namespace": "ns",
        "component": "backend",
        "endpoint": "generate",
        "model_types": [],
        "worker_type": "decode",
        "incumbent": "a" * 64,
        "status": "ready",
        "generation": 4,
        "admitted": [26],
        **fields,
    }


def test_the_status_table_names_rejected_cohorts_and_missing_roles() -> None:
    status = {
        "health": "healthy",
        "groups": [
            _group(
                cohorts=[
                    {"checksum": "a" * 64, "members": [26]},
                    {"checksum": "b" * 64, "members": [1, 2]},
                ]
            )
        ],
        "rejections": [
            {
                "model": "m",
                "namespace": "ns",
                "component": "backend",
                "endpoint": "generate",
                "rejected_checksum": "b" * 64,
                "differences": [
                    {"field": "kv_cache_block_size", "incumbent": "16", "rejected": "32"},
                    {"field": "aliases", "incumbent": "[]", "rejected": '["x"]'},
                ],
            }
        ],
        "readiness": [
            {"model": "m", "namespace": "ns", "ready": False, "present": [], "missing": ["prefill"]}
        ],
    }
    table = render_status_table(status)
    row = table.splitlines()[1]
    assert "bbbbbbbbbbbb (1,2)" in row
    assert "missing prefill" in row
    # Instance ids print as integers, as in the status JSON: 26, not its hex spelling 1a.
    assert re.search(r" ready +4 +26 +bbbb", row)
    assert row.startswith("m @ ns/backend/generate [decode]")
    assert table.splitlines()[-1] == (
        "rejected bbbbbbbbbbbb in m @ ns/backend/generate: differs in: "
        'kv_cache_block_size 16 -> 32; aliases [] -> ["x"]'
    )


def test_the_status_table_names_drained_workers_and_who_drained_them() -> None:
    group = _group(
        cohorts=[{"checksum": "a" * 64, "members": [26]}],
        drained=[{"instance_id": 27, "by": "preStop:pod/w-1", "at": 1.0}],
    )
    table = render_status_table({"health": "healthy", "groups": [group]})
    assert table.splitlines()[-1] == (
        "drained 27 in m @ ns/backend/generate by preStop:pod/w-1 (out of routing; safe to stop "
        "once drain --wait says so)"
    )
    # A brief reply counts drained workers only: the table then names none.
    brief = render_status_table({"health": "healthy", "groups": [group | {"drained": 1}]})
    assert "drained 27" not in brief
