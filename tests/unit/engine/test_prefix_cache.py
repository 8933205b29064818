"""Prefix caching across turns on the tiny fp32 model: hits skip prefill, outputs stay identical, salts isolate."""

from __future__ import annotations

import random

import torch

from inference.engine import SamplingParams
from inference.engine.prefix_cache import block_keys

from .helpers import assert_greedy_equal, collect, event_tokens, reference_greedy

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def _turn_prompts(vocab: int, turns: int = 3) -> list[list[int]]:
    """Prompts of a growing conversation: each starts with the whole previous one."""
    rng = random.Random(3)
    prompt = [rng.randrange(20, vocab) for _ in range(70)]
    out = [prompt]
    for _ in range(turns - 1):
        prompt = prompt + [rng.randrange(20, vocab) for _ in range(37)]
        out.append(prompt)
    return out


def _user_turns(vocab: int, turns: int = 3) -> list[list[int]]:
    rng = random.Random(4)
    return [[rng.randrange(20, vocab) for _ in range(70 if k == 0 else 37)] for k in range(turns)]


def _run(engine, prompt, salt):
    handle = engine.submit(prompt, GREEDY, cache_salt=salt)
    engine.run_until_idle()
    return collect(handle)


def test_block_keys_chain_over_blocks_and_salt():
    tokens = list(range(40))
    a = block_keys(tokens, "user:1", 16)
    assert len(a) == 2  # full blocks only
    assert block_keys(tokens[:32] + [999], "user:1", 16) == a  # a key depends only on its prefix
    assert block_keys([7] + tokens[1:], "user:1", 16)[1] != a[1]  # ... all of it (chained)
    assert set(block_keys(tokens, "user:2", 16)).isdisjoint(a)
    assert block_keys(tokens, None, 16) == block_keys(tokens, "", 16)


def test_next_turn_reuses_cached_prefix_and_output_is_identical(make_engine, tiny_loaded):
    cached = make_engine(prefix_cache_tokens=4096, prefix_cache_block_size=16)
    plain = make_engine(prefix_cache_tokens=0)
    model, eos = tiny_loaded.model, tiny_loaded.eos_token_ids
    history: list[int] = []
    for k, user_turn in enumerate(_user_turns(len(tiny_loaded.tokenizer))):
        # The next turn re-sends the previous prompt and the reply the engine gave to it.
        prompt = history + user_turn
        before = cached.load().prefix_cache_hit_tokens_total
        events, finish = _run(cached, prompt, "user:1")
        hit = cached.load().prefix_cache_hit_tokens_total - before
        plain_events, plain_finish = _run(plain, prompt, "user:1")
        got = event_tokens(events)
        assert got == event_tokens(plain_events)
        assert finish.text == plain_finish.text
        assert_greedy_equal(model, prompt, got, reference_greedy(model, prompt, 12, eos), eos, finish)
        if k == 0:
            assert hit == 0
        else:
            # Everything the previous turn computed, in whole blocks, never the last prompt token.
            assert hit == (len(history) // 16) * 16 and 0 < hit < len(prompt)
        history = prompt + got
    assert plain.load().prefix_cache_hit_tokens_total == 0


def test_other_salt_never_hits(make_engine, tiny_loaded):
    engine = make_engine(prefix_cache_tokens=4096)
    prompt = _turn_prompts(len(tiny_loaded.tokenizer))[1]
    _run(engine, prompt, "user:1")
    _run(engine, prompt, "user:2")
    _run(engine, prompt, None)
    assert engine.load().prefix_cache_hit_tokens_total == 0
    _run(engine, prompt, "user:1")
    assert engine.load().prefix_cache_hit_tokens_total == (len(prompt) - 1) // 16 * 16


def test_lru_eviction_keeps_capacity_and_drops_least_recent(make_engine, tiny_loaded):
    engine = make_engine(prefix_cache_tokens=96, prefix_cache_block_size=16)  # 6 blocks
    rng = random.Random(5)
    vocab = len(tiny_loaded.tokenizer)
    a, b = ([rng.randrange(20, vocab) for _ in range(50)] for _ in range(2))
    _run(engine, a, "s")  # 50 prompt + 11 fed-back tokens -> 3 blocks
    _run(engine, b, "s")  # 3 more: full
    assert engine.load().prefix_cache_tokens == 96
    _run(engine, a, "s")  # touch a: b is now least recent
    c = [rng.randrange(20, vocab) for _ in range(50)]
    _run(engine, c, "s")  # evicts b's blocks, tails first
    assert engine.load().prefix_cache_tokens == 96
    hits = engine.load().prefix_cache_hit_tokens_total
    _run(engine, b, "s")
    assert engine.load().prefix_cache_hit_tokens_total == hits  # b was evicted
    _run(engine, c, "s")
    assert engine.load().prefix_cache_hit_tokens_total > hits  # c was kept (then b evicted a)


def test_cached_blocks_hold_the_kv_a_full_prefill_writes(make_engine, tiny_loaded):
    engine = make_engine(prefix_cache_tokens=4096)
    prompt = _turn_prompts(len(tiny_loaded.tokenizer))[0]
    _run(engine, prompt, "x")
    keys = block_keys(prompt, "x", 16)
    with torch.inference_mode():
        out = tiny_loaded.model(torch.tensor([prompt]), use_cache=True)
    pkv = out.past_key_values
    for i, key in enumerate(keys):
        block = engine.prefix_cache.block(key)
        for layer in range(len(engine.kv.k)):
            k_ref = pkv.layers[layer].keys[0, :, i * 16 : (i + 1) * 16]
            torch.testing.assert_close(block[layer, 0], k_ref, rtol=1e-4, atol=1e-5)


def test_evicted_blocks_hand_their_pages_back_and_the_head_is_kept(make_engine, tiny_loaded):
    engine = make_engine(prefix_cache_tokens=96, prefix_cache_block_size=16)  # a pool of 6 blocks
    cache = engine.prefix_cache
    prompt = [random.Random(6).randrange(20, len(tiny_loaded.tokenizer)) for _ in range(50)]
    _run(engine, prompt, "s")  # 50 prompt + 11 fed-back tokens -> 3 blocks
    keys = block_keys(prompt + [0] * 11, "s", 16)[:3]
    indices = [cache._blocks[k] for k in keys]
    assert all(cache.block(k).abs().sum() > 0 for k in keys)
    assert cache.evict_to(16) == 32
    assert cache.block(keys[0]) is not None  # the chain's head stays, its tail goes first
    assert cache.block(keys[1]) is None and cache.block(keys[2]) is None
    for index in indices[1:]:
        assert cache._pool[index].abs().sum() == 0  # pages handed back: they read as zeros
    cache.clear()
    assert cache.num_tokens == 0 and cache._pool.abs().sum() == 0
