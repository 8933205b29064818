"""The resident K/V memory target (``EngineConfig.kv_cache_memory_mb``) on the tiny fp32 model.

The tiny model's K/V take 512 bytes a token (2 layers x K, V x 2 heads x 16 dims x 4 bytes), so targets are given in
tokens and turned into MB here.
"""

from __future__ import annotations

import random

import pytest

from inference.engine import EngineConfig, SamplingParams
from inference.engine.prefix_cache import PrefixCache

from .helpers import collect, event_tokens

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)


def _mb(engine_or_tokens: int) -> float:
    return engine_or_tokens * 512 / 1e6


def _prompts(vocab: int, n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(20, vocab) for _ in range(length)] for _ in range(n)]


def _resident(engine) -> tuple[int, int, int]:
    return engine.kv.written_tokens, engine.kv.stale_tokens, engine.prefix_cache.num_tokens


def _run_together(engine, prompts: list[list[int]], salt: str, after_step=None) -> list[list[int]]:
    handles = [engine.submit(p, GREEDY, cache_salt=salt) for p in prompts]
    while engine.has_unfinished():
        engine.step()
        if after_step is not None:
            after_step()
    return [event_tokens(collect(h)[0]) for h in handles]


def test_the_token_target_follows_the_kv_bytes_per_token(make_engine):
    engine = make_engine(kv_cache_memory_mb=_mb(1000))
    assert engine.kv.bytes_per_token == 512
    assert engine.kv_memory_tokens == 1000
    assert make_engine(kv_cache_memory_mb=None).kv_memory_tokens is None


def test_a_negative_target_is_refused():
    with pytest.raises(ValueError, match="kv_cache_memory_mb"):
        EngineConfig(kv_cache_memory_mb=-1)


def test_cached_blocks_give_way_to_running_requests_and_outputs_stay_identical(make_engine, tiny_loaded):
    target = 400
    engine = make_engine(prefix_cache_tokens=4096, kv_cache_memory_mb=_mb(target))
    plain = make_engine(prefix_cache_tokens=0, kv_cache_memory_mb=None)
    vocab = len(tiny_loaded.tokenizer)
    for prompt in _prompts(vocab, 3, 70, seed=11):  # earlier conversations fill the cache: 3 x 80 tokens
        _run_together(engine, [prompt], "u")
    assert engine.prefix_cache.num_tokens == 240
    seen = []

    def check() -> None:
        written, stale, cached = _resident(engine)
        seen.append(cached)
        # Within the target, or nothing but running K/V left to give back.
        assert written + stale + cached <= target or (stale == 0 and cached == 0)

    burst = _prompts(vocab, 4, 100, seed=12)  # 4 x 111 written tokens > the target on their own
    got = _run_together(engine, burst, "u", after_step=check)
    assert min(seen) == 0  # the earlier conversations' blocks were evicted while the burst ran
    assert got == _run_together(plain, burst, "u")


def test_without_a_target_the_cache_stays_on_top_of_running_requests(make_engine, tiny_loaded):
    engine = make_engine(prefix_cache_tokens=4096, kv_cache_memory_mb=None)
    vocab = len(tiny_loaded.tokenizer)
    for prompt in _prompts(vocab, 3, 70, seed=11):
        _run_together(engine, [prompt], "u")
    seen = []
    _run_together(
        engine, _prompts(vocab, 4, 100, seed=12), "u", after_step=lambda: seen.append(_resident(engine))
    )
    assert min(cached for _, _, cached in seen) == 240


def test_freed_pages_go_back_before_any_cached_block(make_engine, tiny_loaded):
    engine = make_engine(prefix_cache_tokens=4096, kv_cache_memory_mb=_mb(10_000))
    _run_together(engine, _prompts(len(tiny_loaded.tokenizer), 2, 100, seed=13), "u")
    written, stale, cached = _resident(engine)
    assert (written, cached) == (0, 192) and stale > 0  # two slots' pages retained for the next prefill
    engine.kv_memory_tokens = cached + stale - 1
    with engine._cond:
        engine._fit_kv_memory()
    assert _resident(engine) == (0, 0, 192)  # the pages went, every block stayed
    assert all(k.abs().sum() == 0 for k in engine.kv.k)  # ... handed back: they read as zeros
    engine.kv_memory_tokens = 100
    with engine._cond:
        engine._fit_kv_memory()
    # Evicted down to the target less one step's tokens (64), in whole blocks.
    assert engine.prefix_cache.num_tokens == 32


def test_a_hit_longer_than_one_copy_group_loads_every_block(make_engine, tiny_loaded, monkeypatch):
    monkeypatch.setattr(PrefixCache, "LOAD_GROUP", 2)  # 5 cached blocks: groups of 2, 2 and 1
    cached = make_engine(prefix_cache_tokens=4096)
    plain = make_engine(prefix_cache_tokens=0)
    first = _prompts(len(tiny_loaded.tokenizer), 1, 70, seed=14)[0]
    reply = _run_together(cached, [first], "u")[0]
    follow_up = first + reply + [30, 31, 32]
    cached.kv.discard_stale()  # the slot must hold only what the cache loads, not the first turn's own pages
    before = cached.load().prefix_cache_hit_tokens_total
    assert _run_together(cached, [follow_up], "u") == _run_together(plain, [follow_up], "u")
    assert cached.load().prefix_cache_hit_tokens_total - before == 80
