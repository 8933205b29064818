"""Metrics, log formatting and span export helpers, without a database."""

import json
import logging

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from inference.engine.engine import EngineLoad
from observability import metrics
from observability.logs import ChatsiteJsonFormatter, ContextFilter, log_context, logging_config
from operations.selectors import percentile


def sample(name, labels=None):
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_reply_timer_observes_vllm_named_histograms_and_counters():
    labels = {"model": "unit-model", "tier": "unit-tier"}
    before_ttft = sample("chatsite:time_to_first_token_seconds_count", labels)
    before_itl = sample("chatsite:inter_token_latency_seconds_count", labels)
    timer = metrics.ReplyTimer(model="unit-model", tier="unit-tier")
    timer.token(1)
    timer.token(2)  # two tokens in one delta: two ITL observations
    timer.finish(
        finish_reason="length", prompt_tokens=11, completion_tokens=3, queue_ms=5, ttft_ms=40, total_ms=90
    )
    assert sample("chatsite:time_to_first_token_seconds_count", labels) == before_ttft + 1
    assert sample("chatsite:inter_token_latency_seconds_count", labels) == before_itl + 2
    assert sample("chatsite:prompt_tokens_total", labels) >= 11
    assert sample("chatsite:generation_tokens_total", labels) >= 3
    assert sample("chatsite:request_success_total", {**labels, "finish_reason": "length"}) >= 1
    assert sample("chatsite:e2e_request_latency_seconds_sum", labels) >= 0.09


class FakeEngine:
    def load(self):
        return EngineLoad(
            waiting=3, running=2, kv_used_tokens=512, kv_total_tokens=2048, max_num_seqs=8, max_waiting=9
        )


class FakeHost:
    model_name = "fake-model"
    engine = FakeEngine()


def test_engine_collector_reads_load_at_scrape_time():
    registry = CollectorRegistry()
    registry.register(metrics.EngineCollector(FakeHost()))
    text = generate_latest(registry).decode()
    assert 'chatsite:num_requests_running{model="fake-model"} 2.0' in text
    assert 'chatsite:num_requests_waiting{model="fake-model"} 3.0' in text
    assert 'chatsite:kv_cache_usage_perc{model="fake-model"} 0.25' in text
    assert 'chatsite:num_preemptions_total{model="fake-model"} 0.0' in text


def test_frame_type_label_is_bounded_for_bad_input():
    assert metrics.frame_type({"type": "send"}) == "send"
    assert metrics.frame_type({"type": "x" * 500}) == "other"
    assert metrics.frame_type(["not", "a", "dict"]) == "other"


def test_json_logs_carry_ids_and_no_unknown_format():
    record = logging.LogRecord("chat", logging.INFO, __file__, 1, "reply finished: %s", ("stop",), None)
    with log_context(request_id="r1", message_id=42, user_id=7):
        ContextFilter().filter(record)
    line = json.loads(ChatsiteJsonFormatter().format(record))
    assert line["message"] == "reply finished: stop"
    assert (line["request_id"], line["message_id"], line["user_id"], line["level"]) == ("r1", 42, 7, "INFO")
    assert "trace_id" in line
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        logging_config(log_format="xml", level="INFO")


def test_percentile_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([30, 10, 20], 50) == 20
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5], 99) == 5


def test_json_file_exporter_writes_one_line_per_span(tmp_path):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from observability.tracing import JsonFileSpanExporter

    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonFileSpanExporter(str(path))))
    tracer = provider.get_tracer("t")
    with (
        tracer.start_as_current_span("parent") as parent,
        tracer.start_as_current_span("child", attributes={"a": 1}),
    ):
        pass
    spans = {s["name"]: s for s in map(json.loads, path.read_text().splitlines())}
    assert (
        spans["child"]["trace_id"]
        == spans["parent"]["trace_id"]
        == format(parent.get_span_context().trace_id, "032x")
    )
    assert spans["child"]["parent_id"] == spans["parent"]["span_id"]
    assert spans["child"]["attributes"] == {"a": 1}


def test_every_series_the_grafana_dashboard_queries_is_exported():
    """docs/grafana-dashboard.json names only series that this code exports (a renamed metric would leave a
    panel silently empty)."""
    import re
    from pathlib import Path

    dashboard = json.loads(
        (Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text()
    )
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"chatsite:[a-z_]+", target["expr"])
    }
    registry = CollectorRegistry()
    registry.register(metrics.EngineCollector(FakeHost()))
    exported = {sample.name for family in registry.collect() for sample in family.samples}
    exported |= {sample.name for family in REGISTRY.collect() for sample in family.samples}
    # A labelled metric with no child yet exports no sample: take the declared names of the module's metrics.
    from prometheus_client.metrics import MetricWrapperBase

    for metric in vars(metrics).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        for family in metric.describe():
            base = family.name
            exported |= {base, f"{base}_total", f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    assert queried, "the dashboard queries no chatsite series"
    assert queried <= exported, sorted(queried - exported)
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert any("step duration" in title for title in titles)
