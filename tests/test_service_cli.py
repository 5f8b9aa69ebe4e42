"""The status table printed by ``workerset-admission status``."""

from __future__ import annotations

import re

from workerset_admission.service_cli import render_status_table


def test_the_status_table_names_rejected_cohorts_and_missing_roles() -> None:
    status = {
        "health": "healthy",
        "groups": [
            {
                "model": "m",
                "worker_set": '["ns","backend","generate","","decode"]',
                "incumbent": "a" * 64,
                "status": "ready",
                "generation": 4,
                "admitted": [26],
                "cohorts": [
                    {"checksum": "a" * 64, "members": [26]},
                    {"checksum": "b" * 64, "members": [1, 2]},
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
