"""Per-token events, the asyncio handle, step listeners, EngineLoad counters and priority ageing (tiny model)."""

from __future__ import annotations

import asyncio
import time

import pytest

from inference.engine import FinishEvent, SampledTokenEvent, SamplingParams, StepStats, TokenEvent

from .helpers import collect, event_tokens, reference_greedy


def _prompt(tokenizer) -> list[int]:
    return tokenizer.encode("Continuous batching lets requests join and leave at every step.")


def test_token_events_report_every_sampled_token_before_its_text(make_engine, tokenizer):
    engine = make_engine()
    handle = engine.submit(
        _prompt(tokenizer), SamplingParams(temperature=0, max_new_tokens=10), token_events=True
    )
    engine.run_until_idle()
    events = list(handle.events(timeout=5))
    sampled = [e for e in events if isinstance(e, SampledTokenEvent)]
    texts = [e for e in events if isinstance(e, TokenEvent)]
    finish = events[-1]
    assert isinstance(finish, FinishEvent)
    assert [e.index for e in sampled] == list(range(finish.usage.completion_tokens))
    assert [e.token_id for e in sampled][: len(event_tokens(texts))] == event_tokens(texts)
    times = [e.time for e in sampled]
    assert times == sorted(times) and len(set(times)) == len(times)  # one step per token, monotonic
    # Each text event comes after the SampledTokenEvents of all the tokens it carries.
    seen = 0
    for e in events:
        if isinstance(e, SampledTokenEvent):
            seen += 1
        elif isinstance(e, TokenEvent):
            assert seen >= sum(len(t.token_ids) for t in texts[: texts.index(e) + 1])


def test_token_events_include_eos_and_are_off_by_default(make_engine, tiny_loaded, tokenizer):
    engine = make_engine()
    prompt = _prompt(tokenizer)
    plain = engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=6))
    engine.run_until_idle()
    assert not any(isinstance(e, SampledTokenEvent) for e in plain.events(timeout=5))
    # Force an EOS: the second greedy token acts as EOS (as in test_eos_finishes_with_stop).
    ref = reference_greedy(tiny_loaded.model, prompt, 3, tiny_loaded.eos_token_ids)
    engine.eos_token_ids = frozenset({ref[1]})
    handle = engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=6), token_events=True)
    engine.run_until_idle()
    events = list(handle.events(timeout=5))
    assert [e.token_id for e in events if isinstance(e, SampledTokenEvent)] == ref[:2]  # EOS included
    assert event_tokens([e for e in events if isinstance(e, TokenEvent)]) == ref[:1]  # not in text
    assert events[-1].finish_reason == "stop"


def test_async_iteration_follows_many_streams_without_threads(make_engine, tokenizer):
    engine = make_engine(max_num_seqs=8)
    engine.start()
    params = SamplingParams(temperature=0, max_new_tokens=8)

    async def follow(handle):
        return [e async for e in handle]

    async def main():
        handles = [engine.submit(_prompt(tokenizer), params) for _ in range(12)]
        return handles, await asyncio.gather(*(follow(h) for h in handles))

    handles, streams = asyncio.run(main())
    for handle, events in zip(handles, streams, strict=True):
        assert isinstance(events[-1], FinishEvent) and events[-1].finish_reason == "length"
        assert "".join(e.text for e in events[:-1]) == events[-1].text
        assert handle.finished
    # Same tokens as the blocking iterator.
    blocking = engine.submit(_prompt(tokenizer), params)
    assert collect(blocking)[1].text == streams[0][-1].text


def test_async_iteration_times_out(make_engine, tokenizer):
    engine = make_engine()  # not started: no event will come
    handle = engine.submit(_prompt(tokenizer), SamplingParams(max_new_tokens=4))

    async def main():
        async for _ in handle.aevents(timeout=0.05):
            pass

    with pytest.raises(TimeoutError):
        asyncio.run(main())


def test_step_listener_gets_stats_and_its_errors_are_swallowed(make_engine, tokenizer):
    engine = make_engine(max_num_batched_tokens=16)
    stats: list[StepStats] = []

    def broken(_):
        raise RuntimeError("listener bug")

    engine.add_step_listener(broken)
    engine.add_step_listener(stats.append)
    prompt = _prompt(tokenizer)
    handles = [engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=5)) for _ in range(2)]
    engine.run_until_idle()
    assert all(h.result(timeout=5).finish_reason == "length" for h in handles)
    assert sum(s.num_prefill_tokens for s in stats) == 2 * len(prompt)
    assert sum(s.num_sampled_tokens for s in stats) == 10
    assert sum(s.num_decode_tokens for s in stats) == 8  # the first token of each comes from prefill
    assert sum(s.num_finished for s in stats) == 2
    assert all(s.num_prefill_tokens + s.num_decode_tokens <= 16 for s in stats)  # chunked prefill
    assert all(s.duration_s > 0 and s.kv_total_tokens == engine.kv.budget_tokens for s in stats)
    assert stats[-1].num_running == 0 and stats[-1].kv_used_tokens == 0
    assert all(s.num_preemptions == 0 for s in stats)
    # The phases: forward pass and applying its results inside the step; the finished requests' K/V work
    # inside applying, and only in the steps that finished a request.
    for s in stats:
        assert 0 < s.forward_s and 0 < s.apply_s and s.forward_s + s.apply_s <= s.duration_s
        assert 0 <= s.apply_cpu_s and 0 <= s.finish_kv_cpu_s
        assert (s.finish_kv_s > 0) == (s.num_finished > 0) and s.finish_kv_s <= s.apply_s
    engine.remove_step_listener(stats.append)
    n = len(stats)
    engine.submit(prompt, SamplingParams(max_new_tokens=2))
    engine.run_until_idle()
    assert len(stats) == n


def test_load_reports_pending_tokens_and_decode_total(make_engine, tokenizer):
    engine = make_engine(max_num_seqs=1, max_num_batched_tokens=8)
    prompt = _prompt(tokenizer)
    engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=5))
    engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=7))
    load = engine.load()
    assert (load.pending_prefill_tokens, load.pending_decode_tokens, load.decode_tokens_total) == (
        2 * len(prompt),
        12,
        0,
    )
    engine.step()  # first 8 prompt tokens of the first request
    load = engine.load()
    assert load.pending_prefill_tokens == 2 * len(prompt) - 8 and load.pending_decode_tokens == 12
    engine.run_until_idle()
    load = engine.load()
    assert (load.pending_prefill_tokens, load.pending_decode_tokens, load.decode_tokens_total) == (0, 0, 12)


def test_ageing_lets_a_long_waiting_free_request_outrank_new_paid_ones(make_engine, tokenizer):
    ageing = 0.05
    engine = make_engine(max_num_seqs=1, priority_ageing_s=ageing)
    params = SamplingParams(temperature=0, max_new_tokens=2)
    prompt = _prompt(tokenizer)
    engine.submit(prompt, params, request_id="running")
    engine.step()
    engine.submit(prompt, params, priority=0, request_id="free-old")
    time.sleep(10 * ageing * 2)  # waited twice the bound for priority 10 vs 0
    engine.submit(prompt, params, priority=10, request_id="paid-new")
    engine.submit(prompt, params, priority=0, request_id="free-new")
    assert [engine.queue_position(r) for r in ("free-old", "paid-new", "free-new")] == [0, 1, 2]


def test_without_ageing_paid_always_goes_first(make_engine, tokenizer):
    engine = make_engine(max_num_seqs=1, priority_ageing_s=None)
    params = SamplingParams(temperature=0, max_new_tokens=2)
    prompt = _prompt(tokenizer)
    engine.submit(prompt, params, request_id="running")
    engine.step()
    engine.submit(prompt, params, priority=0, request_id="free-old")
    time.sleep(0.2)
    engine.submit(prompt, params, priority=10, request_id="paid-new")
    assert [engine.queue_position(r) for r in ("paid-new", "free-old")] == [0, 1]


def test_fresh_paid_still_outranks_a_free_request_within_the_bound(make_engine, tokenizer):
    engine = make_engine(max_num_seqs=1, priority_ageing_s=60.0)
    params = SamplingParams(temperature=0, max_new_tokens=2)
    prompt = _prompt(tokenizer)
    engine.submit(prompt, params, request_id="running")
    engine.step()
    engine.submit(prompt, params, priority=0, request_id="free-old")
    time.sleep(0.2)
    engine.submit(prompt, params, priority=10, request_id="paid-new")
    assert [engine.queue_position(r) for r in ("paid-new", "free-old")] == [0, 1]


def test_cache_salt_must_be_a_string(make_engine, tokenizer):
    from inference.engine import InvalidRequest

    with pytest.raises(InvalidRequest, match="cache_salt"):
        make_engine().submit(_prompt(tokenizer), SamplingParams(), cache_salt=42)


def test_penalties_work_on_a_float32_model(make_engine, tokenizer):
    # Regression: fp32 logits come out of inference mode and used to fail the in-place penalty update.
    engine = make_engine()
    handle = engine.submit(
        _prompt(tokenizer), SamplingParams(temperature=0.7, repetition_penalty=1.1, max_new_tokens=4)
    )
    engine.run_until_idle()
    finish = handle.result(timeout=5)
    assert finish.finish_reason in ("length", "stop") and finish.error is None
