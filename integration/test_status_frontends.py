"""``status`` with several frontends: one by name, every one, and a pipe closed early."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest
from natsfixture import NatsServer
from workerset_admission import cli
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import Settings
from workerset_admission.wiring.compose import create_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CLI = [sys.executable, "-m", "workerset_admission.cli"]


def settings_for(url: str, bucket: str, frontend: str) -> Settings:
    return Settings(
        nats_servers=(url,),
        discovery_bucket=bucket,
        admission_bucket=f"{bucket}-adm",
        status_subject=f"status.{bucket}",
        frontend_id=frontend,
        tracing=False,
        metrics=False,
    )


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}


async def _shell(command: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        "bash", "-o", "pipefail", "-c", command, stdout=-1, stderr=-1, env=_env()
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


class InProcess:
    """The command line run on a thread of its own (its own event loop), its output captured."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self._capsys.readouterr()
        code = await asyncio.to_thread(cli.main, list(argv))
        out, err = self._capsys.readouterr()
        return code, out, err


async def test_status_answers_from_the_frontend_named_or_from_every_live_one(
    nats_server: NatsServer, bucket_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _run = InProcess(capsys)
    started: list[AdmissionService] = []
    try:
        for frontend in ("fe-1", "fe-2"):
            service = await create_service(settings_for(nats_server.url, bucket_name, frontend))
            started.append(service)
            await service.wait_synced(30)
        flags = [
            *("--nats-server", nats_server.url, "--subject", f"status.{bucket_name}"),
            *("--admission-bucket", f"{bucket_name}-adm"),
        ]
        for _ in range(4):
            code, out, err = await _run("status", *flags, "--frontend", "fe-2", "--json")
            assert code == 0, err
            assert json.loads(out)["frontend"] == "fe-2", out[:600]

        # Every live frontend, once its heartbeat is in the admission bucket.
        answers: list[Any] = []
        for _ in range(50):
            code, out, err = await _run("status", *flags, "--all-frontends", "--json")
            if code == 0:
                answers = json.loads(out)["frontends"]
                if len(answers) == 2:
                    break
            await asyncio.sleep(0.2)
        assert [a["frontend"] for a in answers] == ["fe-1", "fe-2"]
        assert [a["status"]["frontend"] for a in answers] == ["fe-1", "fe-2"]
        code, out, err = await _run("status", *flags, "--all-frontends")
        assert code == 0, err
        assert out.startswith("== frontend fe-1\n")
        assert "\n== frontend fe-2\n" in out

        code, out, err = await _run("status", *flags, "--frontend", "fe-9")
        assert code == 3
        assert "frontend 'fe-9' does not answer" in err

        # A frontend that went away is named, and the command says it did not hear from all.
        await started.pop().stop()
        code, out, err = await _run("status", *flags, "--all-frontends", "--timeout", "1")
        if code == 3:  # fe-2's heartbeat may still be live in the bucket: it is asked and silent
            assert "did not answer: fe-2" in err
            assert "== frontend fe-2\nno answer on" in out
        else:
            assert code == 0, err
        assert out.startswith("== frontend fe-1\n")

    finally:
        for service in started:
            await service.stop()


async def test_status_piped_into_head_ends_with_status_0_against_a_healthy_server(
    nats_server: NatsServer, bucket_name: str
) -> None:
    service = await create_service(settings_for(nats_server.url, bucket_name, "fe-1"))
    try:
        await service.wait_synced(30)
        flags = ["--nats-server", nats_server.url, "--subject", f"status.{bucket_name}"]
        flags += ["--admission-bucket", f"{bucket_name}-adm"]
        # A reader that takes one line and leaves, under pipefail: not an outage.
        command = " ".join([*(f"'{part}'" for part in (*CLI, "status", *flags)), "| head -1"])
        for _ in range(2):
            code, out, err = await _shell(command)
            assert (code, err) == (0, "")
            assert out.split()[:2] == ["group", "incumbent"]
    finally:
        await service.stop()
