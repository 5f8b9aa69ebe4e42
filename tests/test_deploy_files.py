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
# The images that carry the package (the mocker image is Dynamo's worker alone).
CONTAINERFILES = [
    ROOT / "deploy" / "container" / f"Containerfile.{n}" for n in ("frontend", "tools")
]


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


def test_the_mocker_image_runs_the_frontend_images_dynamo_off_the_path() -> None:
    text = (ROOT / "deploy" / "container" / "Containerfile.mocker").read_text()
    assert "COPY --from=dynamo /opt/workerset-admission /opt/dynamo" in text
    assert _json_array(text, "ENTRYPOINT") == ["/opt/dynamo/bin/python", "-m", "dynamo.mocker"]
    assert not re.search(r"^ENV PATH", text, flags=re.MULTILINE)
    assert sorted(p.name for p in (ROOT / "deploy" / "container").glob("Containerfile.*")) == [
        "Containerfile.frontend", "Containerfile.mocker", "Containerfile.tools"
    ]  # fmt: skip


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


# Dynamo 1.7's worker shutdown budget (withdraw, a router grace, drain, cleanup) defaults to
# 30 s; its operator refuses a pod whose grace period is below that budget plus 5 s, and the
# preStop hook's time counts against the grace period.
DYNAMO_17_SHUTDOWN_TOTAL = 30.0
DYNAMO_17_OPERATOR_MARGIN = 5.0


def _grace_room(manifest: dict[str, object]) -> float:
    """Seconds the pod's grace period leaves after its preStop hook and 1.7's SIGTERM budget."""
    pod = manifest["spec"]["template"]["spec"]  # type: ignore[index]
    (container,) = pod["containers"]
    args = cli.build_parser().parse_args(container["lifecycle"]["preStop"]["exec"]["command"][1:])
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    budget = float(env.get("DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS") or DYNAMO_17_SHUTDOWN_TOTAL)
    hook = float(args.timeout) + float(args.grace)
    grace_period = float(pod["terminationGracePeriodSeconds"])
    return grace_period - hook - budget - DYNAMO_17_OPERATOR_MARGIN


def test_the_worker_grace_period_leaves_room_for_the_hook_and_dynamo_17s_shutdown_budget() -> None:
    yaml = pytest.importorskip("yaml", reason="needs pyyaml (the dynamo extra)")
    text = (ROOT / "deploy" / "kubernetes" / "worker-prestop.yaml").read_text()
    manifest = yaml.safe_load(text)
    assert _grace_room(manifest) >= 0
    # The arithmetic reads the file: a longer drain timeout with the same grace period fails.
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    longer = command.index("--timeout") + 1
    command[longer] = str(float(command[longer]) + _grace_room(manifest) + 1)
    assert _grace_room(manifest) < 0
    # So does a worker that sets a larger budget of its own.
    manifest = yaml.safe_load(text)
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    container["env"].append({"name": "DYN_WORKER_SHUTDOWN_TOTAL_TIMEOUT_SECS", "value": "600"})
    assert _grace_room(manifest) < 0


def test_the_worker_image_is_built_offline_from_build_sh_wheels_and_keeps_its_entrypoint() -> None:
    worker_image = (ROOT / "deploy" / "kubernetes" / "Containerfile.worker").read_text()
    # build.sh's context: the dependencies' wheels and the project's, installed with no index.
    assert "COPY deps /wheels/deps" in worker_image
    assert "COPY project /wheels/project" in worker_image
    installs = [line for line in worker_image.splitlines() if "pip install" in line]
    assert installs
    assert all("--no-index" in line for line in installs), installs
    # No source tree copied in to be built at image build time.
    assert not re.search(r"^COPY (plugin|adapters|telemetry|pyproject\.toml)", worker_image, re.M)
    # The worker image's own ENTRYPOINT is kept, and its python is not shadowed.
    assert not re.search(r"^(ENTRYPOINT|CMD|ENV PATH)", worker_image, flags=re.MULTILINE)
    build = (ROOT / "deploy" / "container" / "build.sh").read_text()
    assert "deploy/kubernetes/Containerfile.worker" in build
    assert "--network=none" in build


def test_the_drains_pages_excerpt_of_the_prestop_recipe_is_the_manifests_pod() -> None:
    """docs/drains.md shows the worker pod of worker-prestop.yaml, with its values as they are."""
    yaml = pytest.importorskip("yaml", reason="needs pyyaml (the dynamo extra)")
    manifest = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "worker-prestop.yaml").read_text())
    pod = manifest["spec"]["template"]["spec"]
    page = (ROOT / "docs" / "drains.md").read_text(encoding="utf-8")
    (excerpt,) = re.findall(r"^```yaml\n(.*?)^```$", page, flags=re.MULTILINE | re.DOTALL)
    shown = yaml.safe_load(excerpt)["spec"]
    assert shown["terminationGracePeriodSeconds"] == pod["terminationGracePeriodSeconds"]
    (container,) = pod["containers"]
    (shown_container,) = shown["containers"]
    for field in ("name", "image", "env", "lifecycle"):
        assert shown_container[field] == container[field], field


def _build_sh_images() -> set[str]:
    """The image names build.sh makes (without registry or tag)."""
    build = (ROOT / "deploy" / "container" / "build.sh").read_text()
    return set(re.findall(r"\blocalhost/(workerset-admission(?:-[a-z]+)?)\b", build)) - {
        "workerset-admission-base"
    }


KUBERNETES = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))


@pytest.mark.parametrize("path", KUBERNETES, ids=[p.name for p in KUBERNETES])
def test_every_manifest_names_images_build_sh_makes(path: Path) -> None:
    yaml = pytest.importorskip("yaml", reason="needs pyyaml (the dynamo extra)")
    made = _build_sh_images()
    assert {"workerset-admission", "workerset-admission-frontend"} <= made
    pod = yaml.safe_load(path.read_text())["spec"]["template"]["spec"]
    for container in pod["containers"]:
        name = container["image"].rsplit("/", 1)[-1].split(":")[0]
        assert name in made, f"{path.name}: {container['name']} names {name}, not in {made}"


def _baked_in(containerfile: str) -> dict[str, str]:
    """The ENV settings of a Containerfile's final stage (PATH aside), continued lines joined."""
    text = re.sub(r"\\\n\s*", " ", containerfile)
    final = text[text.rindex("\nFROM ") :]
    found: dict[str, str] = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            for word in shlex.split(line[4:]):
                name, _, value = word.partition("=")
                found[name] = value
    found.pop("PATH", None)
    return found


@pytest.mark.parametrize("path", KUBERNETES, ids=[p.name for p in KUBERNETES])
def test_a_manifest_states_every_setting_its_frontend_image_bakes_in(path: Path) -> None:
    """The baked-in settings are for a plain ``podman run``: a manifest says each again."""
    yaml = pytest.importorskip("yaml", reason="needs pyyaml (the dynamo extra)")
    baked = _baked_in((ROOT / "deploy" / "container" / "Containerfile.frontend").read_text())
    assert {"DYN_FILE_KV", "WORKERSET_ADMISSION_VIEW_DIR", "DYN_FRONTEND_ROUTE_EXTENSIONS"} <= set(
        baked
    )
    pod = yaml.safe_load(path.read_text())["spec"]["template"]["spec"]
    for container in pod["containers"]:
        if "workerset-admission-frontend:" not in container["image"]:
            continue
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert set(baked) <= set(env), f"{path.name}: not stated: {set(baked) - set(env)}"
        # The plugin writes the view only where no serve beside it does.
        beside = any("serve" in c.get("command", [])[:2] for c in pod["containers"])
        if beside:
            assert env["WORKERSET_ADMISSION_VIEW_DIR"] == ""
            assert env["DYN_FRONTEND_ROUTE_EXTENSIONS"] == ""
        else:
            assert env["WORKERSET_ADMISSION_VIEW_DIR"] == env["DYN_FILE_KV"]
            assert env["DYN_FRONTEND_ROUTE_EXTENSIONS"] == "workerset-admission"


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
