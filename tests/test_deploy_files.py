"""What an operator looks for: license, changelog, examples, container and systemd files.

The Containerfiles are built and run by integration/test_container_images.py (marker images);
this checks, without podman, that they install the extras pyproject.toml has from the context
build.sh makes, and that the commands they run parse with the real parsers. The systemd units
pass ``systemd-analyze verify`` where systemd's tools are installed.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from workerset_admission import cli
from workerset_admission.errors import ViewDirectoryUnavailable

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib
from workerset_admission.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
CONTAINERFILES = sorted((ROOT / "deploy" / "container").glob("Containerfile.*"))


def test_the_license_is_the_apache_2_0_text_pyproject_names() -> None:
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()


def test_the_changelog_names_the_version_the_package_has() -> None:
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    assert f"## {version.group(1)} " in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_the_sample_settings_file_loads_as_it_is() -> None:
    settings = load_settings(config_file=ROOT / "examples" / "settings.toml", env={})
    assert settings.nats_servers == ("nats://127.0.0.1:4222",)


def _unit_command(unit: Path) -> list[str]:
    (line,) = [x for x in unit.read_text().splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_a_systemd_unit_runs_a_command_and_flags_that_exist(unit: Path) -> None:
    argv = _unit_command(unit)
    assert argv[0].endswith("/workerset-admission")
    args = cli.build_parser().parse_args(argv[1:])
    assert cli.COMMANDS[args.command].runs_until_stopped
    text = unit.read_text()
    # A bad setting (2) or refused credentials (5) is not cured by restarting; a view directory
    # read-only or full for now (4) may be, so it is restarted.
    assert f"RestartPreventExitStatus={cli.EXIT_USAGE} {cli.EXIT_CREDENTIALS}" in text
    assert cli.exit_status(ViewDirectoryUnavailable("read-only")) == cli.EXIT_FAILED


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_a_systemd_unit_is_watched_by_the_watchdog_its_command_pings(unit: Path) -> None:
    # serve and bridge both say READY=1 and ping WATCHDOG=1 while their work goes on: a unit
    # of another type would never restart one that is alive but stuck.
    text = unit.read_text()
    assert re.search(r"^Type=notify$", text, re.M)
    assert re.search(r"^NotifyAccess=main$", text, re.M)
    watchdog = re.search(r"^WatchdogSec=(\d+)$", text, re.M)
    assert watchdog is not None
    # Pings come every second; a loop stands still 20 s before it counts as stuck.
    assert 10 <= int(watchdog.group(1)) <= 60


def _json_array(text: str, instruction: str) -> list[str]:
    found = re.search(rf"^{instruction} (\[.*\])$", text, re.M)
    assert found is not None, instruction
    value: list[str] = json.loads(found.group(1))
    return value


@pytest.mark.parametrize("path", CONTAINERFILES, ids=[p.name for p in CONTAINERFILES])
def test_a_containerfile_copies_what_the_package_needs_and_runs_what_exists(path: Path) -> None:
    text = path.read_text()
    # build.sh's context: the dependencies' wheels, then the project's with its extras.
    assert "COPY deps /wheels/deps" in text
    assert "COPY project /wheels/project" in text
    assert "--no-index" in text
    extras = re.search(r"py3-none-any\.whl\[([a-z,]+)\]", text)
    assert extras is not None
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(extras.group(1).split(",")) <= set(optional)
    entry, command = _json_array(text, "ENTRYPOINT"), _json_array(text, "CMD")
    if entry == ["workerset-admission"]:
        args = cli.build_parser().parse_args(command)
        assert args.command == "serve"
    else:
        assert entry[:3] == ["python", "-m", "dynamo.frontend"]
        assert "DYN_FRONTEND_ROUTE_EXTENSIONS=workerset-admission" in text
        # The real 1.6.1 frontend's parser.
        frontend = pytest.importorskip(
            "dynamo.frontend.main", reason="needs ai-dynamo==1.6.1 (the dynamo extra)"
        )
        parse_args = frontend.parse_args

        saved = sys.argv
        sys.argv = ["dynamo.frontend", *entry[3:], *command]
        try:
            config = parse_args()[0]
        finally:
            sys.argv = saved
        assert (config.http_port, config.discovery_backend) == (8000, "file")


def _verify(units: list[Path]) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here (Debian's systemd package has it)")
    return subprocess.run(
        [analyze, "verify", *map(str, units)], capture_output=True, text=True, timeout=60
    )


def test_the_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # Copies whose ExecStart names this environment's workerset-admission: verify checks that
    # the command exists, and /opt/workerset-admission is the install the units' comment asks for.
    script = Path(sys.executable).parent / "workerset-admission"
    assert script.is_file()
    copies = []
    for unit in UNITS:
        copy = tmp_path / unit.name
        copy.write_text(
            unit.read_text().replace("/opt/workerset-admission/bin/", f"{script.parent}/")
        )
        copies.append(copy)
    done = _verify(copies)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    # And it does find faults here: an unknown key is reported.
    copies[0].write_text(copies[0].read_text().replace("[Service]", "[Service]\nRestartt=always"))
    assert "Unknown key" in _verify(copies[:1]).stderr


def test_the_prestop_hook_is_a_command_that_exists_with_nothing_for_a_shell_to_expand() -> None:
    yaml = pytest.importorskip("yaml", reason="needs pyyaml (the dynamo extra)")
    manifest = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "worker-prestop.yaml").read_text())
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    # The kubelet expands $(VAR) in command and args only, never in a lifecycle hook.
    assert not any("$" in word for word in command)
    assert command[0] == "workerset-admission"
    args = cli.build_parser().parse_args(command[1:])
    assert (args.command, args.host_from_env, args.wait) == ("drain", "POD_IP", True)
    # The port names this pod's worker where pods share one IP (hostNetwork).
    assert args.port_from_env == "DYN_TCP_RPC_PORT"
    assert {"POD_IP", "DYN_TCP_RPC_PORT"} <= {env["name"] for env in container["env"]}
    # The pod outlives the drain's timeout plus its grace.
    assert pod["terminationGracePeriodSeconds"] > args.timeout + args.grace
    worker_image = (ROOT / "deploy" / "kubernetes" / "Containerfile.worker").read_text()
    for folder in ("plugin", "adapters", "telemetry"):
        assert f"COPY {folder} /opt/workerset-admission-src/{folder}" in worker_image
    # The worker image's own ENTRYPOINT is kept.
    assert not re.search(r"^ENTRYPOINT", worker_image, flags=re.MULTILINE)


def test_the_frontend_recipe_runs_serve_on_the_frontends_store_with_a_liveness_probe() -> None:
    yaml = pytest.importorskip("yaml", reason="needs pyyaml (the dynamo extra)")
    recipe = ROOT / "deploy" / "kubernetes" / "frontend-with-serve.yaml"
    pod = yaml.safe_load(recipe.read_text())["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    frontend, serve = containers["frontend"], containers["serve"]
    assert frontend["command"][:3] == ["python", "-m", "dynamo.frontend"]
    assert "--discovery-backend" in frontend["command"]
    assert frontend["command"][frontend["command"].index("--discovery-backend") + 1] == "file"
    args = cli.build_parser().parse_args(serve["command"][1:])
    assert args.command == "serve"
    # serve writes where the frontend reads: the same volume, at the frontend's DYN_FILE_KV.
    store = {e["name"]: e.get("value") for e in frontend["env"]}["DYN_FILE_KV"]
    assert str(args.view_dir) == store
    mounts = {m["name"]: m["mountPath"] for m in frontend["volumeMounts"]}
    assert {m["name"]: m["mountPath"] for m in serve["volumeMounts"]} == mounts
    # The view outlives a restart, and the probe restarts a stuck serve long before it ends.
    probe = serve["livenessProbe"]
    assert probe["httpGet"] == {"path": "/livez", "port": args.health_port}
    assert float(args.view_horizon) > probe["periodSeconds"] * probe["failureThreshold"] + 60
    assert "readinessProbe" not in serve
