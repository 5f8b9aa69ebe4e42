"""Regenerate ``n2_records.jsonl.gz``: discovery records written by the real old runtimes.

Run ``python tests/corpus/build_n2_corpus.py`` from the project's venv (it holds
``ai-dynamo==1.6.1``); it needs PyPI and takes about ten minutes. For each runtime version
(1.4.2, 1.5.1, 1.6.0, 1.6.1) it installs ``ai-dynamo-runtime`` into its own venv under
``--work`` and runs ``n2_writer.py`` there, which registers every variant below the way a
worker does (``register_model`` on a file store, or the runtime's mocker engine). All
versions share the same model directories under ``--work``, so one variant gets the same
``source_path`` and file checksums whichever runtime wrote it.

Then the 1.6.1 verdicts: ``mdcsum`` from the 1.6.1 runtime's ``ModelDeploymentCard`` and the
verdict of a real 1.6.1 frontend reading the records from its file store (refused at its
discovery check, with the error it logged, or admitted), judged a batch at a time so no
frontend builds more than a few dozen WorkerSets. Each output line: ``version``,
``variant``, ``key`` (the discovery key), ``value`` (the record's text as written),
``mdcsum``, ``frontend`` (``admitted`` or ``refused``) and ``frontend_error``. The output is
committed; the conformance tests never run this script.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

# Run as a script: the frontend and worker helpers live in the integration folder.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
from dynamofrontend import free_port, running_frontend
from support.workers import file_discovery_environment, write_model_dir
from workerset_admission.adapters.dynamo.view_directory import file_name_for

HERE = Path(__file__).resolve().parent
VERSIONS = ("1.4.2", "1.5.1", "1.6.0", "1.6.1")
OUTPUT = HERE / "n2_records.jsonl.gz"
# At most this many records per judging frontend: each admitted record builds a WorkerSet,
# and each WorkerSet holds inotify instances, a small per-user budget shared with the machine.
BATCH = 40

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REFUSED = re.compile(
    r'Rejected model from reconciliation snapshot instance="([^"]+)" error="([^"]*)"'
)


# -- model directories ----------------------------------------------------------------------


def model_dirs(root: Path) -> dict[str, Path]:
    """The model directories every version registers: one per kind of worker setup."""
    dirs = {
        "full": write_model_dir(root / "full"),
        "ctx8k": write_model_dir(root / "ctx8k", context_length=8192),
        "no-tokenizer": write_model_dir(root / "no-tokenizer"),
        "template": write_model_dir(root / "template"),
    }
    (dirs["no-tokenizer"] / "tokenizer.json").unlink()
    # A non-weight sibling: a self-hosting worker publishes it in extra_files.
    (dirs["full"] / "preprocessor_config.json").write_text('{"image_processor_type": "none"}')
    (dirs["template"] / "custom.jinja").write_text(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    )
    return dirs


# -- variants -------------------------------------------------------------------------------

ROLES: dict[str, dict[str, Any]] = {
    "agg": {"worker_type": "aggregated"},
    "decode": {"worker_type": "decode", "needs": [["prefill"]]},
    "prefill": {"worker_type": "prefill", "needs": [["decode"]], "model_type": ["Prefill"]},
    "encode": {
        "worker_type": "encode",
        "needs": [["prefill", "decode"], ["aggregated"]],
        "model_type": [],
    },
}
ROUTERS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "rr": {"mode": "RoundRobin"},
    "random": {"mode": "Random"},
    "kv": {"mode": "KV", "kv": {}},
    "kv-tuned": {"mode": "KV", "kv": {"router_temperature": 0.5, "use_kv_events": False}},
}
SHAPES: dict[str, tuple[str, list[str]]] = {
    "chat": ("Tokens", ["Chat"]),
    "completions": ("Tokens", ["Completions"]),
    "embedding": ("Tokens", ["Embedding"]),
    "embedding-pooling": ("Tokens", ["Embedding", "Pooling"]),
    "chat-pooling": ("Tokens", ["Chat", "Pooling"]),
    "completions-classify": ("Tokens", ["Completions", "Classify"]),
    "embedding-classify": ("Tokens", ["Embedding", "Classify"]),
    "embedding-classify-pooling": ("Tokens", ["Embedding", "Classify", "Pooling"]),
    "chat-completions-embedding-pooling": (
        "Tokens",
        ["Chat", "Completions", "Embedding", "Pooling"],
    ),
    "chat-images": ("Tokens", ["Chat", "Images"]),
    "chat-audios": ("Tokens", ["Chat", "Audios"]),
    "completions-videos": ("Tokens", ["Completions", "Videos"]),
    "embedding-rerank": ("Tokens", ["Embedding", "Rerank"]),
    "images": ("Tokens", ["Images"]),
    "prefill-bit-agg": ("Tokens", ["Prefill"]),
    "pooling-rerank": ("Tokens", ["Pooling", "Rerank"]),
    "text-chat": ("Text", ["Chat", "Completions"]),
    "text-classify": ("Text", ["Classify"]),
    "text-images": ("Text", ["Images"]),
    "tensor": ("Tensor", ["TensorBased"]),
    "tensor-chat": ("Tensor", ["TensorBased", "Chat"]),
    "tensor-chat-only": ("Tensor", ["Chat"]),
}


def variants(dirs: dict[str, Path]) -> list[dict[str, Any]]:
    """Every variant, by name; the same list for every version."""
    base: dict[str, Any] = {
        "model_input": "Tokens",
        "model_type": ["Chat", "Completions"],
        "model_path": str(dirs["full"]),
        "model_name": "n2/model",
    }
    out: list[dict[str, Any]] = []

    def add(name: str, **spec: Any) -> None:
        out.append(base | spec | {"variant": name})

    for role, role_spec in ROLES.items():
        for router, router_spec in ROUTERS.items():
            for hosted in (False, True):
                name = f"{role}-{router}" + ("-hosted" if hosted else "")
                add(name, **role_spec, router=router_spec, self_host_metadata=hosted)
    for kind in ("ctx8k", "no-tokenizer"):
        add(f"dir-{kind}", worker_type="aggregated", model_path=str(dirs[kind]))
    template = dirs["template"] / "custom.jinja"
    add("template", worker_type="aggregated", custom_template_path=str(template))
    add(
        "template-hosted",
        worker_type="aggregated",
        custom_template_path=str(template),
        self_host_metadata=True,
    )
    for size in (32, 64):
        add(f"block-{size}", worker_type="aggregated", kv_cache_block_size=size)
        add(
            f"block-{size}-kv",
            worker_type="aggregated",
            kv_cache_block_size=size,
            router=ROUTERS["kv"],
        )
    add("lora", worker_type="aggregated", lora_name="N2 LoRA.v1", max_gpu_lora_count=2)
    add("lora-decode", **ROLES["decode"], lora_name="N2 LoRA.v1", max_gpu_lora_count=2)
    add(
        "runtime-config",
        worker_type="aggregated",
        runtime_config={"max_num_seqs": 64, "total_kv_blocks": 1000},
    )
    add("aliases", worker_type="aggregated", aliases=["n2-alias"])
    for shape, (model_input, types) in SHAPES.items():
        add(f"shape-{shape}", worker_type="aggregated", model_input=model_input, model_type=types)
    for role in ("agg", "decode", "prefill"):
        add(f"mocker-{role}", engine="mocker", worker_type=ROLES[role]["worker_type"])
    add("mocker-block-32", engine="mocker", worker_type="aggregated", kv_cache_block_size=32)
    for index, spec in enumerate(out):
        spec["namespace"] = f"n2-{index:03d}"
    return out


# -- old runtimes ---------------------------------------------------------------------------


def runtime_python(work: Path, version: str) -> Path:
    """The venv holding only ``ai-dynamo-runtime==version``, made on first use."""
    venv = work / f"venv-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"ai-dynamo-runtime=={version}"],
            check=True,
        )
    return python


def system_port() -> int:
    """A free loopback port below 32768 (the runtimes read ``DYN_SYSTEM_PORT`` as an i16)."""
    for port in range(29100, 32000):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit("no free port below 32768")


def write_cards(root: Path, python: Path, specs: list[dict[str, Any]], hosted: bool) -> Any:
    """Run the writer once; return its outcome per variant.

    Workers self-host their metadata only with a system status server (``DYN_SYSTEM_PORT``),
    so the self-hosting variants run in a writer of their own that has one.
    """
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "WORKERSET_"))}
    env |= file_discovery_environment(root) | {"RUST_BACKTRACE": "0", "HF_HUB_OFFLINE": "1"}
    if hosted:
        env |= {
            "DYN_SELF_HOST_METADATA": "1",
            "DYN_SYSTEM_ENABLED": "true",
            "DYN_SYSTEM_HOST": "127.0.0.1",
            "DYN_SYSTEM_PORT": str(system_port()),
        }
    spec_file = root / "variants.json"
    spec_file.write_text(json.dumps(specs))
    done = subprocess.run(
        [str(python), str(HERE / "n2_writer.py"), str(spec_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    outcomes = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            if "variant" in item:
                outcomes[item["variant"]] = item
    if not any(line.startswith('{"done"') for line in done.stdout.splitlines()):
        raise SystemExit(f"{root}: the writer did not finish\n{done.stderr[-3000:]}")
    return outcomes


def collect(root: Path, version: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_namespace = {spec["namespace"]: spec["variant"] for spec in specs}
    records = []
    for file in sorted((root / "kv" / "v1" / "mdc").iterdir()):
        key = unquote(file.name)
        namespace = key.split("/", 1)[0]
        records.append(
            {
                "version": version,
                "variant": by_namespace[namespace],
                "key": key,
                "value": file.read_text(),
                "file_name": file.name,
            }
        )
    return records


def write_version(work: Path, version: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every variant's records as ``version`` writes them."""
    python = runtime_python(work, version)
    records: list[dict[str, Any]] = []
    refused: list[str] = []
    for hosted in (False, True):
        part = [spec for spec in specs if bool(spec.get("self_host_metadata")) is hosted]
        root = work / version / ("hosted" if hosted else "plain")
        outcomes = write_cards(root, python, part, hosted)
        refused += sorted(v for v, o in outcomes.items() if not o["written"])
        records += collect(root, version, part)
    print(f"{version}: {len(records)} records; the runtime refused {len(refused)}: {refused}")
    return records


# -- 1.6.1 verdicts -------------------------------------------------------------------------


def oracle_mdcsum(value: str) -> str | None:
    """1.6.1's ``mdcsum`` of the record's card, as its runtime computes it."""
    from dynamo import _core as core

    try:
        card = core.ModelDeploymentCard.from_json_str(json.dumps(json.loads(value)["card_json"]))
    except Exception:  # a card 1.6.1 cannot read has no checksum
        return None
    return str(card.local_dir()).rsplit("/", 1)[1]


def sentinel(item: dict[str, Any]) -> tuple[str, str, str]:
    """A copy of ``item`` the frontend must refuse (Tensor input for a chat model), in its own
    namespace: its refusal in the log shows the reconciliation pass has run."""
    value = json.loads(item["value"])
    value["namespace"] = "n2-sentinel"
    value["card_json"] |= {"model_input": "Tensor", "model_type": "Chat"}
    key = "/".join(["n2-sentinel", *item["key"].split("/")[1:]])
    return key, file_name_for(key), json.dumps(value)


def judge(work: Path, batch: list[dict[str, Any]], index: int) -> None:
    """One frontend over one batch: each record refused (with its error) or admitted."""
    root = work / "judge" / f"batch-{index:02d}"
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "WORKERSET_"))}
    env |= file_discovery_environment(root) | {
        "RUST_BACKTRACE": "0",
        "HF_HUB_OFFLINE": "1",
        "DYN_LOG": "info",
    }
    folder = Path(env["DYN_FILE_KV"]) / "v1" / "mdc"
    folder.mkdir(parents=True)
    marker, marker_file, marker_value = sentinel(batch[0])
    files = [folder / marker_file]
    files[0].write_text(marker_value)
    for item in batch:
        path = folder / item["file_name"]
        path.write_text(item["value"])
        files.append(path)
    log = root / "frontend.log"
    deadline = time.monotonic() + 120
    with running_frontend(free_port(), env, log, extension=False):
        seen, steady = -1, 0
        while True:
            for path in files:  # the file store deletes files older than 10 s
                os.utime(path)
            time.sleep(1.0)
            text = _ANSI.sub("", log.read_text(errors="replace"))
            refused = dict(_REFUSED.findall(text))
            steady = steady + 1 if len(refused) == seen else 0
            seen = len(refused)
            if marker in refused and steady >= 2:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"batch {index}: no reconciliation pass within 120 s")
    for item in batch:
        error = refused.get(item["key"])
        item["frontend"] = "refused" if error is not None else "admitted"
        item["frontend_error"] = error
    print(f"  batch {index}: {len(batch)} records, {len(refused) - 1} refused")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/wsa-n2"))
    parser.add_argument("--versions", nargs="*", default=list(VERSIONS))
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    specs = variants(model_dirs(work / "models"))
    records: list[dict[str, Any]] = []
    for version in args.versions:
        records += write_version(work, version, specs)
    for item in records:
        item["mdcsum"] = oracle_mdcsum(item["value"])
    # Records of different versions share no key (each runtime has its own instance id).
    for index in range(0, len(records), BATCH):
        judge(work, records[index : index + BATCH], index // BATCH)
    with gzip.open(args.out, "wt") as out:
        for item in records:
            keys = ("version", "variant", "key", "value", "mdcsum", "frontend", "frontend_error")
            out.write(json.dumps({k: item[k] for k in keys}, sort_keys=False) + "\n")
    print(f"wrote {len(records)} records to {args.out}")


if __name__ == "__main__":
    main()
