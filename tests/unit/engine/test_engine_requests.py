"""Request lifecycle on the tiny model: cancel, priority, queue bounds, validation, stops, usage."""

from __future__ import annotations

import pytest
import torch

from inference.engine import EngineStopped, InvalidRequest, QueueFull, SamplingParams

from .conftest import TINY_CONTEXT
from .helpers import collect, event_tokens, reference_greedy


def _prompt(tokenizer, text="The engine under test"):
    return tokenizer.encode(text)


def test_cancel_running_frees_slot_and_kv_at_next_step(make_engine, tokenizer):
    engine = make_engine(max_num_seqs=4, max_num_batched_tokens=64)
    p1, p2 = _prompt(tokenizer, "first request"), _prompt(tokenizer, "second, longer request here")
    a = engine.submit(p1, SamplingParams(temperature=0, max_new_tokens=50))
    b = engine.submit(p2, SamplingParams(temperature=0, max_new_tokens=40))
    engine.step()
    engine.step()
    load = engine.load()
    assert (load.running, load.waiting) == (2, 0)
    assert load.kv_used_tokens == len(p1) + 50 + len(p2) + 40
    assert a.cancel() is True
    assert engine.load().running == 2  # only takes effect at the next step
    engine.step()
    load = engine.load()
    assert load.running == 1
    assert load.kv_used_tokens == len(p2) + 40
    events, finish = collect(a, timeout=1)
    assert finish.finish_reason == "cancelled"
    assert finish.usage.completion_tokens == len(event_tokens(events)) >= 1
    assert a.cancel() is False  # already finished
    engine.run_until_idle()
    assert collect(b, timeout=0)[1].finish_reason in ("length", "stop")
    assert engine.load().kv_used_tokens == 0


def test_cancel_waiting_request_finishes_immediately(make_engine, tokenizer):
    engine = make_engine(max_num_seqs=1)
    running = engine.submit(_prompt(tokenizer), SamplingParams(temperature=0, max_new_tokens=20))
    engine.step()
    waiting = engine.submit(_prompt(tokenizer), SamplingParams(temperature=0, max_new_tokens=20))
    assert engine.load().waiting == 1
    assert engine.cancel(waiting.request_id)
    finish = waiting.result(timeout=0)  # no step needed
    assert finish.finish_reason == "cancelled"
    assert finish.usage.completion_tokens == 0 and finish.text == ""
    assert finish.timings.ttft_ms is None
    assert engine.load().waiting == 0
    assert engine.cancel("no-such-request") is False
    engine.run_until_idle()
    assert running.result(timeout=0).finish_reason == "length"


def test_priority_admits_higher_first_and_fifo_within_priority(make_engine, tokenizer):
    engine = make_engine(max_num_seqs=1)
    params = SamplingParams(temperature=0, max_new_tokens=2)
    prompt = _prompt(tokenizer)
    first = engine.submit(prompt, params, request_id="first")
    engine.step()  # "first" occupies the only slot
    engine.submit(prompt, params, request_id="free-1")
    engine.submit(prompt, params, request_id="free-2")
    engine.submit(prompt, params, priority=10, request_id="paid-1")
    engine.submit(prompt, params, request_id="free-3")
    engine.submit(prompt, params, priority=10, request_id="paid-2")
    expected = ["paid-1", "paid-2", "free-1", "free-2", "free-3"]
    assert [engine.queue_position(r) for r in expected] == [0, 1, 2, 3, 4]
    assert engine.queue_position("first") is None  # running, not waiting
    admitted = []
    while engine.has_unfinished():
        before = set(expected) - set(admitted)
        engine.step()
        for rid in list(before):
            if engine.queue_position(rid) is None:
                admitted.append(rid)
    assert admitted == expected
    assert first.result(timeout=0).finish_reason == "length"


def test_queue_full(make_engine, tokenizer):
    engine = make_engine(max_waiting=2)
    prompt = _prompt(tokenizer)
    engine.submit(prompt, SamplingParams(max_new_tokens=2))
    engine.submit(prompt, SamplingParams(max_new_tokens=2))
    with pytest.raises(QueueFull) as info:
        engine.submit(prompt, SamplingParams(max_new_tokens=2))
    assert info.value.waiting == 2
    engine.step()  # both admitted -> room again
    engine.submit(prompt, SamplingParams(max_new_tokens=2))
    engine.run_until_idle()


@pytest.mark.parametrize(
    ("prompt", "params", "fragment"),
    [
        ([], SamplingParams(), "empty"),
        ([5] * (TINY_CONTEXT - 10), SamplingParams(max_new_tokens=11), "context length"),
        ([10**7], SamplingParams(), "vocabulary"),
        ([5, 6], SamplingParams(temperature=-0.5), "temperature"),
        ([5, 6], SamplingParams(temperature=float("nan")), "temperature"),
        ([5, 6], SamplingParams(top_p=0.0), "top_p"),
        ([5, 6], SamplingParams(top_p=1.5), "top_p"),
        ([5, 6], SamplingParams(top_k=-1), "top_k"),
        ([5, 6], SamplingParams(max_new_tokens=0), "max_new_tokens"),
        ([5, 6], SamplingParams(repetition_penalty=0.0), "repetition_penalty"),
        ([5, 6], SamplingParams(presence_penalty=3.0), "presence_penalty"),
        ([5, 6], SamplingParams(stop=("",)), "stop"),
    ],
)
def test_invalid_requests_are_rejected(make_engine, prompt, params, fragment):
    engine = make_engine()
    with pytest.raises(InvalidRequest, match=fragment):
        engine.submit(prompt, params)
    assert engine.load().waiting == 0


def test_prompt_exceeding_kv_budget_is_rejected(make_engine):
    engine = make_engine(kv_cache_tokens=100)
    with pytest.raises(InvalidRequest, match="KV cache capacity"):
        engine.submit([5] * 90, SamplingParams(max_new_tokens=20))


def test_duplicate_request_id_rejected(make_engine):
    engine = make_engine()
    engine.submit([5, 6, 7], SamplingParams(max_new_tokens=2), request_id="x")
    with pytest.raises(InvalidRequest, match="already in use"):
        engine.submit([5, 6, 7], SamplingParams(max_new_tokens=2), request_id="x")


def test_length_finish_and_usage(make_engine, tiny_loaded, tokenizer):
    prompt = _prompt(tokenizer, "count the tokens please")
    ref = reference_greedy(tiny_loaded.model, prompt, 7, tiny_loaded.eos_token_ids)
    assert 2 not in ref  # the fixture's greedy continuation does not hit EOS
    engine = make_engine()
    handle = engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=7))
    engine.run_until_idle()
    events, finish = collect(handle, timeout=0)
    assert finish.finish_reason == "length"
    assert finish.usage.prompt_tokens == len(prompt)
    assert finish.usage.completion_tokens == 7
    assert event_tokens(events) == ref
    assert finish.text == tokenizer.decode(ref, skip_special_tokens=True)
    t = finish.timings
    assert 0 <= t.queue_ms <= t.ttft_ms <= t.total_ms


def test_eos_finishes_with_stop(make_engine, tiny_loaded, tokenizer):
    """Force EOS by making the tiny model's EOS id the greedy choice after the prompt."""
    prompt = _prompt(tokenizer, "stop right here")
    engine = make_engine()
    ref = reference_greedy(tiny_loaded.model, prompt, 3, tiny_loaded.eos_token_ids)
    engine.eos_token_ids = frozenset({ref[1]})  # the 2nd generated token acts as EOS
    handle = engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=10))
    engine.run_until_idle()
    events, finish = collect(handle, timeout=0)
    assert finish.finish_reason == "stop"
    assert finish.usage.completion_tokens == 2  # the EOS token is counted ...
    assert event_tokens(events) == ref[:1]  # ... but never streamed

    handle = engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True))
    engine.run_until_idle()
    events, finish = collect(handle, timeout=0)
    assert finish.finish_reason == "length"
    assert event_tokens(events) == ref[:3]


def test_stop_string_cuts_output_and_never_leaks_fragment(make_engine, tiny_loaded, tokenizer):
    prompt = _prompt(tokenizer, "Once upon a time")
    engine = make_engine()
    full = engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=24))
    engine.run_until_idle()
    text = collect(full, timeout=0)[1].text
    # A stop string starting mid-output, first occurring there.
    start = next(k for k in range(4, len(text) - 4) if text.find(text[k : k + 4]) == k)
    stop = text[start : start + 4]
    handle = engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=24, stop=("zzzzqq", stop)))
    engine.run_until_idle()
    events, finish = collect(handle, timeout=0)
    assert finish.finish_reason == "stop"
    assert finish.text == text[:start]
    assert "".join(e.text for e in events) == text[:start]  # nothing past the cut was streamed
    assert stop not in finish.text


def test_seeded_sampling_reproducible_across_batch_mixes(make_engine, tokenizer):
    prompt = _prompt(tokenizer, "Sample me")
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=0, seed=1234, max_new_tokens=12)
    engine = make_engine(max_num_batched_tokens=32)
    alone = engine.submit(prompt, params)
    engine.run_until_idle()
    alone_tokens = event_tokens(collect(alone, timeout=0)[0])

    others = [
        (tokenizer.encode("noise " * 7), SamplingParams(temperature=1.0, max_new_tokens=20)),
        (tokenizer.encode("greedy neighbour"), SamplingParams(temperature=0, max_new_tokens=9)),
        (
            tokenizer.encode("top k neighbour"),
            SamplingParams(temperature=0.7, top_k=5, seed=9, max_new_tokens=15),
        ),
    ]
    for mix in range(2):
        handles = [engine.submit(p, sp) for p, sp in others[: mix + 2]]
        engine.step()
        mixed = engine.submit(prompt, params)
        handles.append(engine.submit(tokenizer.encode("late arrival"), SamplingParams(max_new_tokens=5)))
        engine.run_until_idle()
        assert event_tokens(collect(mixed, timeout=0)[0]) == alone_tokens
        for h in handles:
            h.result(timeout=0)

    different = engine.submit(
        prompt, SamplingParams(temperature=0.9, top_p=0.95, seed=4321, max_new_tokens=12)
    )
    engine.run_until_idle()
    assert event_tokens(collect(different, timeout=0)[0]) != alone_tokens


def test_step_failure_fails_requests_and_engine_survives(make_engine, tokenizer):
    engine = make_engine()
    victim = engine.submit(_prompt(tokenizer), SamplingParams(temperature=0, max_new_tokens=5))
    real_forward = engine._runner.forward
    calls = {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real_forward(batch)

    engine._runner.forward = flaky
    engine.run_until_idle()
    finish = collect(victim, timeout=0)[1]
    assert finish.finish_reason == "error"
    assert "boom" in finish.error
    assert engine.load().running == 0 and engine.load().kv_used_tokens == 0
    ok = engine.submit(_prompt(tokenizer), SamplingParams(temperature=0, max_new_tokens=5))
    engine.run_until_idle()
    assert collect(ok, timeout=0)[1].finish_reason == "length"


def test_scripted_utf8_stream_never_splits_characters(make_engine, tokenizer):
    """Drive the engine with logits that force a known token sequence full of multi-byte chars."""
    text = "Emoji 🎉👋🏽 and CJK 日本語の文章, café ñ — done"
    script = tokenizer.encode(text)
    # The test is only meaningful if some tokens are partial UTF-8 sequences on their own.
    assert any("\ufffd" in tokenizer.decode([t]) for t in script)
    engine = make_engine()
    vocab = engine.vocab_size
    real_forward = engine._runner.forward
    position = {}

    def scripted(batch):
        real_forward(batch)  # keep KV bookkeeping realistic
        rows = torch.full((len(batch.logit_rows), vocab), -10.0)
        for row, token_index in enumerate(batch.logit_rows):
            slot = batch.slots[token_index]
            k = position.get(slot, 0)
            rows[row, script[k] if k < len(script) else 2] = 10.0
            position[slot] = k + 1
        return rows

    engine._runner.forward = scripted
    handle = engine.submit([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=len(script) + 5))
    engine.run_until_idle()
    events, finish = collect(handle, timeout=0)
    assert finish.finish_reason == "stop"  # EOS after the script
    assert all("\ufffd" not in e.text for e in events)
    assert finish.text == text == tokenizer.decode(event_tokens(events))
    assert event_tokens(events) == script
    assert len(events) < len(script)  # partial characters were held back and merged


def test_submit_after_shutdown_raises(make_engine, tokenizer):
    engine = make_engine()
    pending = engine.submit(_prompt(tokenizer), SamplingParams(max_new_tokens=3))
    engine.shutdown()
    with pytest.raises(EngineStopped):
        engine.submit(_prompt(tokenizer), SamplingParams(max_new_tokens=3))
    finish = pending.result(timeout=1)
    assert finish.finish_reason == "error" and "stopped" in finish.error
    assert engine.step() == 0


def test_render_chat_uses_template_with_generation_prompt(make_engine, tokenizer):
    engine = make_engine()
    ids = engine.render_chat([{"role": "user", "content": "Hi!"}])
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nHi!<|im_end|>" in text
