"""The Dynamo 1.7 tier (``-m dynamo17``): the boundary against the newest 1.7 build PyPI serves.

The 1.7 build (``ai-dynamo-runtime`` and ``ai-dynamo`` at ``DYNAMO17_RELEASE``) runs in an
environment of its own (``dynamo17fixture``; ``DYNAMO17_VENV``, reused when it holds the
release), always through a subprocess; this suite's own environment keeps Dynamo 1.6.1. Each
case prints its figures:

* hand-made cards (the conformance generators ``cards`` and ``fuzz_cards``, the parity corpus,
  and the router TTLs around the duration limit): our checksum and verdict configured for 1.7
  equal the 1.7 runtime's, card by card; every card on which 1.7 and 1.6.1 differ is one 1.7
  refuses as an invalid duration, and exactly those are the cards our boundary configured for
  1.7 refuses and configured for 1.6 accepts;
* cards the 1.7 runtime's own workers write (``register_model`` variants, and a mocker): each
  decodes at our boundary configured for 1.7 with the checksum of the 1.7 runtime and of 1.6.1;
* the plugin inside the real frontends (the route extension): in 1.7's it judges for 1.7 (the
  installed release, detected) and refuses a card 1.7 refuses, which 1.6.1's admits;
* a drained rolling update to a new namespace under steady load through the 1.7 frontend on
  the view ``serve --dynamo-version 1.7`` writes, with 1.7 mocker workers, beside a 1.7
  frontend on the workers' own store: the view loses no request.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from conformance.cards import cards
from conformance.fuzz_cards import SECTIONS, Files, generate
from dynamo17fixture import (
    DYNAMO17_RELEASE,
    WRITER,
    Dynamo17VenvError,
    ensure_dynamo17_venv,
    plugin_environment,
    run_oracle,
    worker_env,
)
from hypothesis import HealthCheck, given, seed, settings
from natsfixture import restartable_server, show
from workerset_admission.card import (
    BoundarySettings,
    decode_endpoint_record,
    decode_model_record,
    encode_model_record,
    mdcsum,
    model_kv_key,
    parse_key,
)
from workerset_admission.errors import CardDecodeError
from workerset_admission.identity import EndpointId

pytestmark = [
    pytest.mark.dynamo17,
    pytest.mark.integration,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning"),
]

core = pytest.importorskip("dynamo._core", reason="needs ai-dynamo-runtime==1.6.1 here too")

ROOT = Path(__file__).resolve().parents[1]
PARITY = ROOT / "tests" / "corpus" / "parity_cards.jsonl"
HAND_EXAMPLES = int(os.environ.get("DYNAMO17_CARD_EXAMPLES", "500"))
FUZZ_EXAMPLES = int(os.environ.get("DYNAMO17_FUZZ_EXAMPLES", "500"))
V17 = BoundarySettings(dynamo_line="1.7")
V16 = BoundarySettings()
EP = EndpointId("dgd-v1", "backend", "generate")
DURATION = "not a valid duration"


@pytest.fixture(scope="module")
def python17(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        python = ensure_dynamo17_venv(tmp_path_factory.mktemp("dynamo17"))
    except Dynamo17VenvError as exc:
        pytest.fail(f"the Dynamo {DYNAMO17_RELEASE} environment: {exc}")
    show(f"[dynamo 1.7] ai-dynamo-runtime {DYNAMO17_RELEASE} at {python}")
    return python


def v161(text: str) -> str | None:
    try:
        card = core.ModelDeploymentCard.from_json_str(text)
    except Exception:  # the runtime raises plain exceptions for any refusal
        return None
    return str(card.local_dir()).rsplit("/", 1)[1]


def ours(text: str, line: str) -> str | None:
    try:
        return mdcsum(text, dynamo_line=line)
    except CardDecodeError:
        return None


def _router_card(field: str, literal: str) -> str:
    card = json.loads(PARITY.read_text().splitlines()[0])["card_text"]
    body = json.loads(card)
    body["router_config"] = {
        "router_mode": "k_v",
        "kv_router_config": {field: "@"},
        "load_threshold_config": {},
    }
    return json.dumps(body).replace('"@"', literal)


def duration_cards() -> list[str]:
    """The router TTLs on both sides of the limit, both fields, spelled every way."""
    literals = [
        "0", "1e19", "18446744073709549568", "1.844674407370955e19", "18446744073709551615",
        "18446744073709551616", "1.8446744073709552e19", "1e21", "7e22", "1e23",
        "8.98846567431158e307", "1.7976931348623157e308",
    ]  # fmt: skip
    return [
        _router_card(field, literal)
        for field in ("router_ttl_secs", "router_predicted_ttl_secs")
        for literal in literals
    ]


def hand_made_cards(folder: Path) -> list[str]:
    """The corpus: the generators' cards (fixed seeds), the parity corpus, the limit's cards."""
    files = {
        "good.yaml": "router: {}\n",
        "bad.yaml": ": : :\n- x",
        "selection.yaml": "worker_selection: {zz: 1}\n",
        "key.bin": "secret",
    }
    paths = {}
    for name, content in files.items():
        (folder / name).write_text(content)
        paths[name] = str(folder / name)
    paths["missing"] = str(folder / "missing.yaml")
    texts: list[str] = []

    @seed(20261207)
    @settings(
        max_examples=HAND_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cards(paths))
    def collect(text: str) -> None:
        texts.append(text)

    collect()
    fuzz_files = Files(
        (paths["good.yaml"], paths["bad.yaml"], paths["selection.yaml"], paths["missing"]),
        (paths["key.bin"],),
    )
    focuses = [None, *SECTIONS]
    for number in range(FUZZ_EXAMPLES):
        focus = focuses[number % len(focuses)]
        texts.append(generate(20261207 + number, fuzz_files, number % 2 == 1, focus))
    texts += [json.loads(line)["card_text"] for line in PARITY.read_text().splitlines()]
    texts += duration_cards()
    return texts


def test_our_checksums_and_refusals_for_1_7_are_the_1_7_runtimes_on_hand_made_cards(
    python17: Path, tmp_path: Path
) -> None:
    texts = hand_made_cards(tmp_path)
    verdicts = run_oracle(python17, texts, tmp_path, timeout=300)
    mismatches = []
    only_17_refuses: list[int] = []
    for number, (text, verdict) in enumerate(zip(texts, verdicts, strict=True)):
        expected = verdict["checksum"]
        if ours(text, "1.7") != expected:
            mismatches.append((text[:300], expected, ours(text, "1.7"), verdict["error"]))
        old = v161(text)
        assert ours(text, "1.6") == old, text[:300]
        if old != expected:
            # The lines differ only in what 1.7 refuses: the checksum never changes.
            assert expected is None, (text[:300], old, expected)
            assert DURATION in str(verdict["error"]), verdict["error"]
            only_17_refuses.append(number)
    assert mismatches == [], mismatches[:5]
    # Exactly the cards 1.7 refuses and 1.6.1 accepts are the ones the boundary refuses when
    # configured for 1.7 and accepts when configured for 1.6, through a whole record too.
    ours_only_17 = [
        n for n, t in enumerate(texts) if ours(t, "1.7") is None and ours(t, "1.6") is not None
    ]
    assert ours_only_17 == only_17_refuses
    for number in only_17_refuses:
        raw = encode_model_record(EP, 1, texts[number])
        with pytest.raises(CardDecodeError) as refused:
            decode_model_record(parse_key(model_kv_key(EP, 1, None)), raw, V17)
        assert refused.value.reason == "invalid_router_config"
        assert DURATION in refused.value.detail
    accepted = sum(v["checksum"] is not None for v in verdicts)
    both = sum(1 for t in texts if v161(t) is not None)
    # The six TTLs from the measured corpus and both fields' limit cards are among them.
    assert len(only_17_refuses) >= 14
    show(
        f"[dynamo 1.7] hand-made cards: {len(texts)} compared; 1.6.1 accepts {both}, of which "
        f"1.7 accepts {accepted} with the same checksum and refuses {len(only_17_refuses)} "
        f"(all '{DURATION}'); ours configured for 1.7 agrees on {len(texts) - len(mismatches)} "
        f"of {len(texts)}, its refusals matching 1.7's {len(only_17_refuses)} of "
        f"{len(only_17_refuses)}"
    )


def _mocker_card(python17: Path, root: Path) -> Path:
    """Start a 1.7 mocker on a store of its own; return the store once its card is written."""
    from support.workers import write_model_dir

    model = write_model_dir(root / "mock-model")
    store = root / "mock-kv"
    log = (root / "mocker.log").open("wb")
    process = subprocess.Popen(
        [str(python17), "-m", "dynamo.mocker", "--model-path", str(model),
         "--model-name", "tiny", "--endpoint", "dyn://mock17.backend.generate",
         "--discovery-backend", "file", "--speedup-ratio", "0", "--kv-bytes-per-token", "1024"],
        env=worker_env(root, store),
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not any((store / "v1" / "mdc").glob("*")):
            assert process.poll() is None, (root / "mocker.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the 1.7 mocker never registered"
            time.sleep(0.2)
        time.sleep(0.5)
        copy = root / "mock-copy"
        for bucket in ("mdc", "instances"):
            (copy / bucket).mkdir(parents=True)
            for file in (store / "v1" / bucket).iterdir():
                if not file.name.startswith("."):
                    (copy / bucket / file.name).write_bytes(file.read_bytes())
        return copy
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


def _parts(file: Path) -> tuple[EndpointId, int, str | None]:
    parts = unquote(file.name).split("/")
    return EndpointId(*parts[:3]), int(parts[3], 16), parts[4] if len(parts) == 5 else None


def test_cards_the_1_7_workers_write_get_its_checksum_at_our_boundary_configured_for_1_7(
    python17: Path, tmp_path: Path
) -> None:
    store = tmp_path / "kv"
    done = subprocess.run(
        [str(python17), str(WRITER), str(tmp_path / "models")],
        env=worker_env(tmp_path, store),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.stdout.startswith("registered"), done.stderr[-2000:]
    registered = int(done.stdout.split()[1])
    written = sorted((store / "v1" / "mdc").iterdir())
    assert len(written) == registered
    mocker = _mocker_card(python17, tmp_path)
    files = written + sorted((mocker / "mdc").iterdir())
    card_texts = [json.dumps(json.loads(f.read_bytes())["card_json"]) for f in files]
    verdicts = run_oracle(python17, card_texts, tmp_path)
    agreed = 0
    for file, text, verdict in zip(files, card_texts, verdicts, strict=True):
        endpoint, instance_id, suffix = _parts(file)
        key = parse_key(model_kv_key(endpoint, instance_id, suffix))
        reg = decode_model_record(key, file.read_bytes(), V17)
        assert reg is not None
        assert verdict["checksum"] is not None, verdict["error"]
        assert reg.mdc_checksum == verdict["checksum"] == v161(text), file.name
        assert decode_model_record(key, file.read_bytes(), V16) == reg
        agreed += 1
    instances = [*(store / "v1" / "instances").iterdir(), *(mocker / "instances").iterdir()]
    for file in instances:
        endpoint, instance_id, _ = _parts(file)
        from workerset_admission.card import endpoint_kv_key

        record = decode_endpoint_record(
            parse_key(endpoint_kv_key(endpoint, instance_id)), file.read_bytes(), V17
        )
        assert record.instance_key == unquote(file.name)
    show(
        f"[dynamo 1.7] cards its workers wrote: {agreed} of {len(files)} agree (1.7 runtime, "
        f"1.6.1 runtime and our boundary configured for 1.7), {len(written)} from "
        f"register_model variants and {len(files) - len(written)} from a mocker; "
        f"{len(instances)} endpoint records decode"
    )


@pytest.fixture(scope="module")
def rollout17(python17: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("openai", reason="needs the openai client (the test extra)")
    from dynamoview import Deployment
    from sidebyside import side_by_side

    root = tmp_path_factory.mktemp("dynamo17-rollout")
    servers = restartable_server(root / "plugin-nats")
    plugin_nats = next(servers)
    make = functools.partial(
        Deployment, dynamo_python=str(python17), sidecar_args=("--dynamo-version", "1.7")
    )
    try:
        with side_by_side(root / "deployment", plugin_nats.handle, deployment=make) as running:
            running.start()
            running.serve(3)
            yield running
    finally:
        servers.close()


def test_a_drained_rollout_through_the_1_7_frontend_on_the_view_loses_no_request(
    rollout17: Any,
) -> None:
    outcome = rollout17.rolling_update(
        rivals=2, spacing=5.0, drained=True, versioned=True, grace=2.0
    )
    for name, figures in outcome.figures.items():
        show(f"[dynamo 1.7] drained rollout: {name} {figures.row()} {dict(figures.statuses)}")
        assert figures.sent >= 10, f"{name}: only {figures.sent} requests were sent"
    assert outcome.figures["view"].failed == 0, outcome.figures["view"].errors
    successor = set(rollout17.incumbent)
    for name, frontend in rollout17.frontends.items():
        assert frontend.ask().decode in successor, name
    # Every frontend is the 1.7 build's.
    for name, frontend in rollout17.frontends.items():
        assert frontend.process.args[0] == str(rollout17.deployment.dynamo_python), name


ROUTES = "workerset_admission.frontend.routes:frontend_routes"


async def _register_both(url: str, bucket: str) -> tuple[str, str]:
    import nats
    from support.cards import base_card
    from workerset_admission.adapters.nats.registrar import WorkerRegistrar

    good = base_card(16, display_name="good-model", slug="good-model")
    long_ttl = json.loads(_router_card("router_ttl_secs", "1e21"))
    long_ttl.update(display_name="ttl-model", slug="ttl-model")
    nc = await nats.connect(url)
    try:
        registrar = WorkerRegistrar(nc.jetstream(), bucket=bucket, ttl=None)
        keys = []
        for instance, card in ((0xA1, good), (0xB2, long_ttl)):
            keys.append(await registrar.register(EP, instance, card))
            await registrar.register_endpoint(EP, instance)
    finally:
        await nc.close()
    return keys[0], keys[1]


@pytest.mark.parametrize("release", ["1.6.1", DYNAMO17_RELEASE])
def test_inside_the_frontend_the_plugin_judges_cards_as_that_frontends_release(
    release: str, python17: Path, nats_server: Any, tmp_path: Path
) -> None:
    import asyncio
    import sys
    import urllib.request
    import uuid

    from dynamofrontend import free_port
    from support.workers import file_discovery_environment

    python = sys.executable if release == "1.6.1" else str(python17)
    extra = {} if release == "1.6.1" else plugin_environment(python17)
    bucket = f"disc-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "WORKERSET_"))}
    env |= file_discovery_environment(tmp_path / "dynamo") | extra
    env |= {
        "WORKERSET_ADMISSION_NATS_SERVERS": nats_server.url,
        "WORKERSET_ADMISSION_DISCOVERY_BUCKET": bucket,
        "WORKERSET_ADMISSION_ADMISSION_BUCKET": f"adm-{uuid.uuid4().hex[:8]}",
        "WORKERSET_ADMISSION_STATUS_SUBJECT": f"status-{uuid.uuid4().hex[:8]}",
    }
    _good, refused_key = asyncio.run(_register_both(nats_server.url, bucket))
    port = free_port()
    url = f"http://127.0.0.1:{port}/workerset-admission/v1/workersets"
    with (tmp_path / "frontend.log").open("wb") as log:
        process = subprocess.Popen(
            [python, "-m", "dynamo.frontend", "--discovery-backend", "file",
             "--frontend-route-extension", ROUTES, "--http-host", "127.0.0.1",
             "--http-port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        body: dict[str, Any] = {}
        while True:
            assert process.poll() is None, (tmp_path / "frontend.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    body = json.loads(answer.read())
            except OSError:
                body = {}
            models = {s["model"] for s in body.get("workersets", [])}
            if "good-model" in models and (
                "ttl-model" in models or body.get("invalid_total", 0) > 0
            ):
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.5)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    if release == "1.6.1":
        assert models == {"good-model", "ttl-model"}
        assert body["invalid_total"] == 0
    else:
        assert models == {"good-model"}
        [refused] = body["recent_invalid"]
        assert (refused["key"], refused["reason"]) == (refused_key, "invalid_router_config")
        assert "not a valid duration for a Dynamo 1.7 frontend" in refused["detail"]
    show(
        f"[dynamo 1.7] inside the {release} frontend: admitted {sorted(models)}, "
        f"refused {[r['reason'] for r in body['recent_invalid']]}"
    )
