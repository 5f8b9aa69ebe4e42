"""The boundary's model-type/input rule against a real 1.6.1 frontend, over every combination.

One frontend reads one file store holding a record for every model-type set (all 4,096 sets
of the twelve flags) with every input (Text, Tokens, Tensor) and every worker role (none,
aggregated, decode, prefill, encode): 61,440 records. The frontend checks a card's shape when
the record enters its discovery, before admission, and its 30 s reconciliation pass logs each
refused record with its instance ("Rejected model from reconciliation snapshot"); that log is
its verdict, compared record by record with the boundary's.

The bulk records are LoRA records (key suffix and ``lora`` in the card): the frontend checks
their shape like any other card but builds no WorkerSet for them, so one frontend can judge
tens of thousands without building that many pipelines. A few plain records beside them are
built for real ("Adding worker set"), so the bulk verdicts are tied to what the frontend serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import blake3
import pytest
from dynamofrontend import free_port, running_frontend
from support.workers import file_discovery_environment, write_model_dir
from workerset_admission.adapters.dynamo.view_directory import file_name_for
from workerset_admission.card import decode_model_record, model_kv_key, parse_key
from workerset_admission.card.model import MODEL_TYPE_NAMES
from workerset_admission.errors import CardDecodeError
from workerset_admission.identity import EndpointId

# About 75 s (the frontend's 30 s reconciliation pass is its verdict): the slower tier.
pytestmark = [
    pytest.mark.dynamo,
    pytest.mark.integration,
    pytest.mark.rollout,
    pytest.mark.timeout(300),
]

_NEEDS = "needs ai-dynamo==1.6.1 (its runtime wheel, then `pip install --no-deps ai-dynamo==1.6.1`)"
pytest.importorskip("dynamo.frontend.main", reason=_NEEDS)

ENDPOINT = EndpointId("shapes", "backend", "generate")
INPUTS = ("Text", "Tokens", "Tensor")
ROLES = (None, "aggregated", "decode", "prefill", "encode")
# The shape errors of 1.6.1's discovery check; any other refusal fails the test.
SHAPE_ERRORS = (
    "unsupported model configuration",
    "prefill workers must use token input",
    "surface-less encode workers must use token input",
)
# Plain records the frontend builds (or refuses) for real: (input, model types, role).
CONTROLS = (
    ("Tokens", "Chat | Pooling", "aggregated"),
    ("Tokens", "Completions | Videos", "aggregated"),
    ("Tokens", "Embedding | Rerank", "aggregated"),
    ("Tokens", "Chat | Prefill", "aggregated"),
    ("Tensor", "TensorBased | Chat", "aggregated"),
    ("Text", "Classify", "aggregated"),
    ("Tokens", "Images", "aggregated"),
    ("Tokens", "Prefill", "aggregated"),
    ("Tensor", "Chat", "aggregated"),
)
_SNAPSHOT = re.compile(
    r'Rejected model from reconciliation snapshot instance="shapes/backend/generate/'
    r'([0-9a-f]+)[^"]*" error="([^"]*)"'
)
_ADDED = re.compile(r"Adding worker set to model model=(\S+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def type_text(bits: int) -> str:
    return " | ".join(name for bit, (name, _) in enumerate(MODEL_TYPE_NAMES) if bits >> bit & 1)


def checked(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {
        "path": str(path),
        "checksum": f"blake3:{blake3.blake3(data).hexdigest()}",
        "size": len(data),
    }


def card(name: str, model_input: str, types: str, role: str | None) -> dict[str, Any]:
    value: dict[str, Any] = {
        "display_name": name,
        "slug": name.lower(),
        "model_info": None,
        "tokenizer": None,
        "context_length": 2048,
        "kv_cache_block_size": 16,
        "migration_limit": 0,
        "model_type": types,
        "model_input": model_input,
        "needs": [],
    }
    if role is not None:
        value["worker_type"] = role
    return value


def built_card(model_dir: Path, *shape: Any) -> dict[str, Any]:
    """A card as a 1.6.1 worker writes it for ``model_dir``: files the frontend can fetch."""
    value = card(*shape)
    value |= {
        "source_path": str(model_dir),
        "model_info": {"hf_config_json": checked(model_dir / "config.json")},
        "tokenizer": {"hf_tokenizer_json": checked(model_dir / "tokenizer.json")},
        "prompt_formatter": {
            "hf_tokenizer_config_json": checked(model_dir / "tokenizer_config.json")
        },
    }
    return value


def record(instance: int, value: dict[str, Any], suffix: str | None = None) -> bytes:
    envelope: dict[str, Any] = {
        "type": "Model",
        "namespace": ENDPOINT.namespace,
        "component": ENDPOINT.component,
        "endpoint": ENDPOINT.endpoint,
        "instance_id": instance,
    }
    if suffix is not None:
        envelope["model_suffix"] = suffix
    return json.dumps(envelope | {"card_json": value}).encode()


def boundary_refuses(key: str, value: bytes) -> bool:
    """The boundary's verdict: admitted, or refused for its shape (anything else fails)."""
    reason = None
    try:
        registration = decode_model_record(parse_key(key), value)
    except CardDecodeError as error:
        reason = error.reason
    else:
        assert registration is not None
    assert reason in (None, "invalid_card_shape"), (key, reason)
    return reason is not None


class FreshFiles:
    """Keeps the records' mtimes young: every file store deletes files older than 10 s."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stopped.wait(2.0):
            for file in self.files:
                os.utime(file)

    def __enter__(self) -> FreshFiles:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(10)


def read_log(path: Path) -> str:
    return _ANSI.sub("", path.read_text(errors="replace"))


def frontend_verdicts(log: Path, seconds: float) -> str:
    """Wait for the first reconciliation pass (30 s after start) to log every refusal."""
    deadline = time.monotonic() + seconds
    seen, steady = -1, 0
    while time.monotonic() < deadline:
        text = read_log(log)
        count = len(_SNAPSHOT.findall(text))
        steady = steady + 1 if count == seen and count > 0 else 0
        seen = count
        # The pass logs its refusals in one sweep: three quiet polls after it mean it is over.
        if steady >= 3:
            return text
        time.sleep(1.0)
    raise AssertionError(f"no complete reconciliation pass within {seconds:g} s ({seen} lines)")


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "WORKERSET_"))}
    env |= file_discovery_environment(tmp_path / "dynamo") | {"RUST_BACKTRACE": "0"}
    # The refusals and the WorkerSets built are logged at info.
    env["DYN_LOG"] = "info"
    return tmp_path, env


def test_the_boundary_refuses_exactly_the_shapes_the_frontend_refuses(
    store: tuple[Path, dict[str, str]],
) -> None:
    root, env = store
    mdc = Path(env["DYN_FILE_KV"]) / "v1" / "mdc"
    mdc.mkdir(parents=True)
    model_dir = write_model_dir(root / "model")
    files: list[Path] = []
    boundary: dict[int, bool] = {}
    shapes: dict[int, tuple[str, str, str | None]] = {}
    instance = 0
    for model_input in INPUTS:
        for bits in range(1 << len(MODEL_TYPE_NAMES)):
            for role in ROLES:
                instance += 1
                name = f"s-{model_input}-{bits:03x}-{role}".lower()
                # A LoRA worker's record: the adapter's name is the card's, its slug the suffix.
                value = card(name, model_input, type_text(bits), role) | {"lora": {"name": name}}
                raw = record(instance, value, name)
                key = model_kv_key(ENDPOINT, instance, name)
                path = mdc / file_name_for(f"shapes/backend/generate/{instance:x}/{name}")
                path.write_bytes(raw)
                files.append(path)
                boundary[instance] = boundary_refuses(key, raw)
                shapes[instance] = (model_input, type_text(bits), role)
    built: dict[str, int] = {}
    for model_input, types, role in CONTROLS:
        instance += 1
        name = "c-" + hashlib.sha1(f"{model_input}{types}".encode()).hexdigest()[:10]
        raw = record(instance, built_card(model_dir, name, model_input, types, role))
        path = mdc / file_name_for(f"shapes/backend/generate/{instance:x}")
        path.write_bytes(raw)
        files.append(path)
        boundary[instance] = boundary_refuses(model_kv_key(ENDPOINT, instance), raw)
        shapes[instance] = (model_input, types, role)
        built[name] = instance
    for path in files:
        os.utime(path)

    log = root / "frontend.log"
    with FreshFiles(files), running_frontend(free_port(), env, log, extension=False):
        text = frontend_verdicts(log, seconds=150)
        refused_ids = {int(hex_id, 16) for hex_id, _ in _SNAPSHOT.findall(text)}
        admitted_controls = {name for name, i in built.items() if i not in refused_ids}
        # The plain records the frontend admitted it builds; under load that may outlast the pass.
        deadline = time.monotonic() + 60
        while not admitted_controls <= set(_ADDED.findall(text)) and time.monotonic() < deadline:
            time.sleep(1.0)
            text = read_log(log)

    refused: dict[int, str] = {int(hex_id, 16): error for hex_id, error in _SNAPSHOT.findall(text)}
    others = {i: e for i, e in refused.items() if not e.startswith(SHAPE_ERRORS)}
    assert not others, f"refused for something other than shape: {list(others.items())[:5]}"
    disagree = [
        (shapes[i], boundary[i], refused.get(i)) for i in boundary if boundary[i] != (i in refused)
    ]
    agree = len(boundary) - len(disagree)
    print(
        f"\n{len(boundary)} records, {agree} agree; frontend refused {len(refused)}, "
        f"boundary refused {sum(boundary.values())}"
    )
    assert not disagree, f"{len(disagree)} disagree, e.g. {disagree[:10]}"
    # Each refusal was also logged when the record first entered discovery.
    first = [line for line in text.splitlines() if "Rejected model discovery update" in line]
    print(f"refusals logged as records arrived: {len(first)}")
    assert len([line for line in first if any(e in line for e in SHAPE_ERRORS)]) == len(refused)
    # The plain records the frontend admitted it built; the refused ones it never built.
    added = set(_ADDED.findall(text))
    missing = {shapes[i] for name, i in built.items() if i not in refused and name not in added}
    assert not missing, f"admitted but never built: {missing}"
    assert not {name for name, i in built.items() if i in refused} & added
