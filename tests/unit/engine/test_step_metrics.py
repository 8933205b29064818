"""The worker's per-step Prometheus histograms, fed by a real engine's steps (tiny model, no database)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from inference.engine import SamplingParams
from observability import metrics

MODEL = "unit-step-model"


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Host:
    """What ``register_engine`` reads of a ``WorkerHost``."""

    def __init__(self, engine):
        self.engine, self.model_name = engine, MODEL


def test_engine_steps_feed_step_duration_batch_size_and_tokens_per_step(make_engine, tokenizer, monkeypatch):
    engine = make_engine(max_num_seqs=4, max_num_batched_tokens=16)
    monkeypatch.setattr(metrics, "_collector", None)  # this test's engine, not the process's
    registry = CollectorRegistry()
    metrics.register_engine(Host(engine), registry=registry)
    assert f'chatsite:num_requests_running{{model="{MODEL}"}} 0.0' in generate_latest(registry).decode()
    steps_before = sample("chatsite:engine_step_duration_seconds_count", model=MODEL)
    time_before = sample("chatsite:engine_step_duration_seconds_sum", model=MODEL)
    batch_before = sample("chatsite:engine_step_batch_size_sum", model=MODEL)
    tokens_before = sample("chatsite:iteration_tokens_total_sum", model=MODEL)
    prefill_before = sample("chatsite:engine_step_tokens_sum", model=MODEL, phase="prefill")
    decode_before = sample("chatsite:engine_step_tokens_sum", model=MODEL, phase="decode")

    prompt = tokenizer.encode("Three requests share these steps")
    handles = [engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=5)) for _ in range(3)]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert all(h.result(timeout=5).finish_reason == "length" for h in handles)

    assert sample("chatsite:engine_step_duration_seconds_count", model=MODEL) == steps_before + steps
    assert sample("chatsite:engine_step_duration_seconds_sum", model=MODEL) > time_before
    assert sample("chatsite:engine_step_batch_size_count", model=MODEL) >= steps
    # Every request is in the batch of each step it computes in: at least the 5 sampling steps of each.
    assert sample("chatsite:engine_step_batch_size_sum", model=MODEL) - batch_before >= 3 * 5
    prefill = sample("chatsite:engine_step_tokens_sum", model=MODEL, phase="prefill") - prefill_before
    decode = sample("chatsite:engine_step_tokens_sum", model=MODEL, phase="decode") - decode_before
    assert prefill == 3 * len(prompt)  # chunked over several 16-token steps; no prefix cache hit assumed
    assert decode == 3 * 4  # the first token of each comes from its prefill
    assert sample("chatsite:iteration_tokens_total_sum", model=MODEL) - tokens_before == prefill + decode
    # Both phases are observed every step (zeros included): per-step averages come out of sum / count.
    assert sample("chatsite:engine_step_tokens_count", model=MODEL, phase="decode") == steps_before + steps
    assert sample("chatsite:engine_step_tokens_bucket", model=MODEL, phase="prefill", le="0.0") >= 1
    engine.shutdown(timeout=5)
