"""Continuous batching on the tiny model: greedy outputs must equal ``model.generate``."""

from __future__ import annotations

import random

import pytest

from inference.engine import SamplingParams

from .helpers import assert_greedy_equal, collect, event_tokens, greedy_tokens, reference_greedy

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


def _prompts(tokenizer) -> list[list[int]]:
    texts = [
        "Hello there",
        "The quick brown fox jumps over the lazy dog. " * 3,
        "a",
        "Continuous batching lets requests join and leave at every step.",
        "日本語のテキストと emoji 🎉 mixed in",
    ]
    prompts = [tokenizer.encode(t) for t in texts]
    rng = random.Random(7)
    prompts.append([rng.randrange(20, len(tokenizer)) for _ in range(75)])
    return prompts


@pytest.fixture(scope="module")
def references(tiny_loaded):
    prompts = _prompts(tiny_loaded.tokenizer)
    refs = [
        reference_greedy(tiny_loaded.model, p, GREEDY.max_new_tokens, tiny_loaded.eos_token_ids)
        for p in prompts
    ]
    return prompts, refs


def _check(tiny_loaded, prompts, refs, handles):
    for prompt, ref, handle in zip(prompts, refs, handles, strict=True):
        events, finish = collect(handle, timeout=0)
        assert finish.usage.prompt_tokens == len(prompt)
        assert_greedy_equal(
            tiny_loaded.model, prompt, event_tokens(events), ref, tiny_loaded.eos_token_ids, finish
        )


@pytest.mark.parametrize(
    ("order", "budget", "max_seqs"),
    [
        ("together", 512, 8),  # everything prefilled in one step, then batched decode
        ("together", 16, 8),  # chunked prefill interleaved with decodes
        ("reversed", 7, 3),  # tiny budget, fewer slots than requests: queueing + slot reuse
    ],
)
def test_greedy_equals_generate_all_at_once(make_engine, tiny_loaded, references, order, budget, max_seqs):
    prompts, refs = references
    idx = list(range(len(prompts)))
    if order == "reversed":
        idx.reverse()
    engine = make_engine(max_num_batched_tokens=budget, max_num_seqs=max_seqs)
    handles = {i: engine.submit(prompts[i], GREEDY) for i in idx}
    engine.run_until_idle()
    _check(tiny_loaded, prompts, refs, [handles[i] for i in range(len(prompts))])
    assert engine.load().kv_used_tokens == 0
    assert engine.load().running == 0


def test_greedy_equals_generate_staggered_arrivals(make_engine, tiny_loaded, references):
    """Requests join while others are mid-prefill / mid-decode, in a shuffled order."""
    prompts, refs = references
    engine = make_engine(max_num_batched_tokens=12, max_num_seqs=4)
    order = list(range(len(prompts)))
    random.Random(3).shuffle(order)
    handles = {}
    for n, i in enumerate(order):
        handles[i] = engine.submit(prompts[i], GREEDY)
        for _ in range(n % 3 + 1):
            engine.step()
    engine.run_until_idle()
    _check(tiny_loaded, prompts, refs, [handles[i] for i in range(len(prompts))])


def test_chunked_prefill_of_prompt_longer_than_budget(make_engine, tiny_loaded, tokenizer):
    prompt = tokenizer.encode("Chunked prefill splits long prompts across steps. " * 12)
    assert len(prompt) > 100
    ref = reference_greedy(tiny_loaded.model, prompt, 10, tiny_loaded.eos_token_ids)
    engine = make_engine(max_num_batched_tokens=16)
    short = engine.submit(tokenizer.encode("short one"), SamplingParams(temperature=0, max_new_tokens=30))
    engine.step()
    handle = engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=10))
    tokens_per_step = []
    while engine.has_unfinished():
        tokens_per_step.append(engine.step())
    assert max(tokens_per_step) <= 16  # the budget was respected every step
    events, finish = collect(handle, timeout=0)
    assert_greedy_equal(
        tiny_loaded.model, prompt, event_tokens(events), ref, tiny_loaded.eos_token_ids, finish
    )
    # The short request kept decoding while the long prompt was being prefilled.
    assert collect(short, timeout=0)[1].usage.completion_tokens == 30


def test_cancel_mid_batch_keeps_other_outputs_exact(make_engine, tiny_loaded, references):
    """Cancelling the request in slot 0 compacts the KV cache; the others must be unaffected."""
    prompts, refs = references
    engine = make_engine(max_num_batched_tokens=256)
    doomed = engine.submit(prompts[0], SamplingParams(temperature=0, max_new_tokens=16))
    handles = [engine.submit(p, GREEDY) for p in prompts[1:4]]
    for _ in range(4):
        engine.step()
    assert doomed.cancel()
    engine.run_until_idle()
    assert collect(doomed, timeout=0)[1].finish_reason == "cancelled"
    _check(tiny_loaded, prompts[1:4], refs[1:4], handles)


def test_step_returns_tokens_processed(make_engine, tokenizer):
    engine = make_engine(max_num_batched_tokens=10)
    assert engine.step() == 0
    engine.submit(list(range(100, 125)), SamplingParams(temperature=0, max_new_tokens=3))
    assert engine.step() == 10
    assert engine.step() == 10
    assert engine.step() == 5  # last chunk; samples the first token
    assert engine.step() == 1  # one decode
    engine.run_until_idle()
    assert engine.step() == 0


def test_requests_finishing_in_one_step_free_their_slots_together_and_the_rest_decode_exactly(
    make_engine, tiny_loaded, references
):
    """Four of six requests end in the same step (``Scheduler.release_many``: the survivors in slots 1 and 4 are
    compacted into slots 0 and 1 after the step's last token); the two survivors' tokens, before and after that
    step, are the tokens each prompt gets alone, and the four finished ones' are the same prompts' first tokens."""
    prompts, _ = references
    lengths = [4, 12, 4, 4, 12, 4]
    engine = make_engine(max_num_batched_tokens=512, max_num_seqs=8)
    finished_per_step = []
    engine.add_step_listener(lambda stats: finished_per_step.append(stats.num_finished))
    together = greedy_tokens(engine, prompts, lengths)
    assert 4 in finished_per_step
    assert engine.kv.num_active == 0 and engine.load().kv_used_tokens == 0
    for prompt, n, got in zip(prompts, lengths, together, strict=True):
        alone = greedy_tokens(make_engine(max_num_batched_tokens=512, max_num_seqs=8), [prompt], [12])[0]
        assert got == alone[:n]
