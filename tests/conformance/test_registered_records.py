"""Records written by real Dynamo 1.6.1 workers decode at our boundary with 1.6.1's checksums."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
from workerset_admission.card import (
    decode_endpoint_record,
    decode_model_record,
    endpoint_kv_key,
    mdcsum,
    model_kv_key,
    parse_key,
    slug,
)
from workerset_admission.identity import EndpointId

core = pytest.importorskip("dynamo._core", reason="ai-dynamo-runtime is not installed")

pytestmark = pytest.mark.conformance


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dynamo-store")
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text(
        '{"max_position_embeddings": 4096, "model_type": "llama", "eos_token_id": 2}'
    )
    (model / "tokenizer.json").write_text(
        '{"version":"1.0","model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]}}'
    )
    (model / "tokenizer_config.json").write_text(
        '{"eos_token":"b","bos_token":"a","chat_template":"{{ messages }}"}'
    )
    (root / "tmp").mkdir()
    env = {
        **os.environ,
        "DYN_FILE_KV": str(root / "kv"),
        "TMPDIR": str(root / "tmp"),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "HOME": str(root),
    }
    writer = Path(__file__).with_name("dynamo_writer.py")
    done = subprocess.run(
        [sys.executable, str(writer), str(model)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert "registered" in done.stdout, done.stderr[-2000:]
    return root / "kv" / "v1"


def instance_path(file: Path) -> tuple[EndpointId, int, str | None]:
    parts = unquote(file.name).split("/")
    suffix = parts[4] if len(parts) == 5 else None
    return EndpointId(*parts[:3]), int(parts[3], 16), suffix


def oracle(card_json: object) -> str:
    card = core.ModelDeploymentCard.from_json_str(json.dumps(card_json))
    return str(card.local_dir()).rsplit("/", 1)[1]


def test_every_card_a_worker_published_gets_dynamos_checksum(store: Path) -> None:
    files = sorted((store / "mdc").iterdir())
    assert len(files) == 4
    groups = set()
    for file in files:
        endpoint, instance_id, suffix = instance_path(file)
        raw = file.read_bytes()
        reg = decode_model_record(parse_key(model_kv_key(endpoint, instance_id, suffix)), raw)
        assert reg is not None
        card_json = json.loads(raw)["card_json"]
        assert reg.mdc_checksum == oracle(card_json) == mdcsum(card_json)
        assert card_json["slug"] == slug(card_json["display_name"])
        assert reg.key == unquote(file.name)
        groups.add(reg.group.worker_set)
        if suffix is not None:
            assert suffix == slug("My LoRA.v1")
            assert reg.is_lora
    assert '["dgd-v1","prefill","generate","prefill","prefill"]' in groups
    assert '["dgd-v1","backend","generate","chat|completions","decode"]' in groups
    assert '["other","backend","generate","chat","aggregated"]' in groups


def test_every_endpoint_record_a_worker_published_decodes(store: Path) -> None:
    files = sorted((store / "instances").iterdir())
    assert len(files) == 3
    for file in files:
        endpoint, instance_id, _ = instance_path(file)
        record = decode_endpoint_record(
            parse_key(endpoint_kv_key(endpoint, instance_id)), file.read_bytes()
        )
        assert record.instance_key == unquote(file.name)
        assert record.device_type is not None
