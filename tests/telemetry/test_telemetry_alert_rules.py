"""deploy/prometheus/alerts.yml: well formed, and naming only metrics the plugin exports."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from workerset_admission.adapters.bridge_progress import BridgeProgress
from workerset_admission.ports import DiscoveryEntry, SourcePut
from workerset_admission.telemetry import AdmissionStateSummary, AdmissionTelemetry
from workerset_admission.telemetry.bridge_metrics import observe_bridge
from workerset_admission.telemetry.names import GROUP_STATUSES, WORKER_STATES

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
METRIC_NAME = re.compile(r"\bworkerset_admission_[a-z_]+\b")
# Series a histogram family exposes besides the family name itself.
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum", "_created")


def load(name: str) -> Any:
    return yaml.safe_load((RULES_DIR / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    document = load("alerts.yml")
    (group,) = document["groups"]
    assert group["name"] == "workerset-admission"
    return list(group["rules"])


@pytest.fixture(scope="module")
def exported() -> dict[str, str]:
    """Family name -> type, as the Prometheus exporter renders every instrument of the facade."""
    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    telemetry = AdmissionTelemetry(
        tracer_provider=TracerProvider(shutdown_on_exit=False), meter_provider=meter_provider
    )
    # The bridge's gauges, as `workerset-admission bridge --prometheus-port` serves them.
    progress = BridgeProgress()
    progress.wrote()
    observe_bridge(meter_provider, progress)
    telemetry.observe_state(
        lambda: AdmissionStateSummary({"ready": 1}, 2, workers={("m", "rejected"): 1})
    )
    entry = DiscoveryEntry("v1.mdc.ns.c.e.1", b"", 1, published_at=time.time())
    with telemetry.apply_update(SourcePut(entry)) as update:
        update.record_decision("admitted")
    with telemetry.build_attempt("g", "c", 1):
        pass
    telemetry.invalid_record("k", "bad_json")
    telemetry.cohort_rejected(
        model="m", worker_set="w", incumbent_checksum="a", rejected_checksum="b", instance="i"
    )
    telemetry.succession("g", "a", "b", 1, 2)
    text = generate_latest(registry).decode()
    reader.shutdown()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    # The text parser drops a counter's _total from the family name; the series keep it.
    return {(f"{k}_total" if v == "counter" else k): v for k, v in families.items()}


def test_every_rule_is_an_alert_with_severity_summary_and_description(
    rules: list[dict[str, Any]],
) -> None:
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
        assert re.fullmatch(r"WorkersetAdmission[A-Z][A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert rule["annotations"]["summary"].strip()
        assert rule["annotations"]["description"].strip()
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"])


def test_every_metric_an_alert_names_is_one_the_plugin_exports(
    rules: list[dict[str, Any]], exported: dict[str, str]
) -> None:
    for rule in rules:
        named = METRIC_NAME.findall(rule["expr"])
        assert named, rule["alert"]
        for series in named:
            family = series
            for suffix in HISTOGRAM_SERIES:
                if series.endswith(suffix) and series.removesuffix(suffix) in exported:
                    family = series.removesuffix(suffix)
            assert family in exported, f"{rule['alert']} names {series}, which is not exported"


def test_the_alerts_cover_rejections_successions_retries_invalid_records_and_latency(
    rules: list[dict[str, Any]],
) -> None:
    expressions = " ".join(rule["expr"] for rule in rules)
    for metric in (
        "workerset_admission_cohorts_rejected_total",
        "workerset_admission_successions_total",
        'workerset_admission_groups{status="retrying"}',
        "workerset_admission_builds_total",
        "workerset_admission_discovery_invalid_records_total",
        "workerset_admission_admission_latency_seconds_bucket",
        'workerset_admission_workers{state="rejected"}',
    ):
        assert metric in expressions


def test_label_values_the_rules_match_on_are_ones_the_plugin_emits(
    rules: list[dict[str, Any]],
) -> None:
    matchers = re.findall(r'(\w+)="([^"]*)"', " ".join(rule["expr"] for rule in rules))
    allowed = {
        "status": set(GROUP_STATUSES),
        "outcome": {"ok", "failed", "cancelled"},
        "state": set(WORKER_STATES),
    }
    for label, value in matchers:
        assert value in allowed[label], (label, value)


def test_every_alert_has_a_promtool_unit_test(rules: list[dict[str, Any]]) -> None:
    tests = load("alerts_test.yml")
    assert tests["rule_files"] == ["alerts.yml"]
    tested = {case["alertname"] for block in tests["tests"] for case in block["alert_rule_test"]}
    assert tested == {rule["alert"] for rule in rules}
