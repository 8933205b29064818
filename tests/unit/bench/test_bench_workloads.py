"""Workload generation of the inference benchmark: deterministic, exact lengths, distinct prompts."""

import math
import random
import statistics

import pytest

from devtools.bench.workloads import (
    CORPUS,
    RealisticParams,
    Request,
    Workload,
    distinct_offsets,
    lognormal_clipped,
    poisson_arrivals,
    realistic_workload,
    uniform_workload,
    window,
)

# A fake tokenizer-free corpus: token ids 0..499 (no model needed).
CORPUS_IDS = list(range(500))


def test_uniform_exact_lengths_and_distinct_prompts():
    wl = uniform_workload(CORPUS_IDS, n=32, prompt_len=128, max_new_tokens=128, seed=0)
    assert wl.n == 32 and wl.name == "uniform"
    assert all(r.arrival_s == 0.0 for r in wl.requests)
    assert all(r.prompt_len == 128 and r.max_new_tokens == 128 for r in wl.requests)
    assert len({r.prompt_token_ids for r in wl.requests}) == 32
    # distinct first tokens => no shared prefixes (no prefix-cache effects)
    assert len({r.prompt_token_ids[0] for r in wl.requests}) == 32
    assert wl.total_new_tokens == 32 * 128


def test_uniform_is_deterministic_per_seed():
    a = uniform_workload(CORPUS_IDS, 8, seed=1)
    b = uniform_workload(CORPUS_IDS, 8, seed=1)
    c = uniform_workload(CORPUS_IDS, 8, seed=2)
    assert a == b
    assert a != c


def test_window_wraps_cyclically():
    assert window([1, 2, 3], 2, 5) == (3, 1, 2, 3, 1)


def test_distinct_offsets():
    rng = random.Random(0)
    offs = distinct_offsets(10, 100, rng)
    assert len(set(offs)) == 10 and all(0 <= o < 100 for o in offs)
    assert distinct_offsets(0, 100, rng) == []


def test_lognormal_clipped_bounds_and_median():
    rng = random.Random(0)
    xs = [lognormal_clipped(rng, 100, 0.8, 16, 512) for _ in range(5000)]
    assert min(xs) >= 16 and max(xs) <= 512
    assert 90 <= statistics.median(xs) <= 110


def test_poisson_arrivals_rate_and_order():
    rng = random.Random(0)
    ts = poisson_arrivals(2001, 2.0, rng)
    assert ts[0] == 0.0 and ts == sorted(ts)
    mean_gap = ts[-1] / 2000
    assert math.isclose(mean_gap, 0.5, rel_tol=0.1)
    assert poisson_arrivals(3, math.inf, rng) == [0.0, 0.0, 0.0]
    assert poisson_arrivals(0, 1.0, rng) == []


def test_realistic_lengths_within_bounds_and_deterministic():
    p = RealisticParams(num_requests=48, rate=1.0, seed=0)
    wl = realistic_workload(CORPUS_IDS, p)
    assert wl.n == 48
    assert all(p.prompt_min <= r.prompt_len <= p.prompt_max for r in wl.requests)
    assert all(p.reply_min <= r.max_new_tokens <= p.reply_max for r in wl.requests)
    arrivals = [r.arrival_s for r in wl.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert realistic_workload(CORPUS_IDS, p) == wl
    assert wl.params["rate"] == 1.0


def test_realistic_rate_only_rescales_arrivals():
    slow = realistic_workload(CORPUS_IDS, RealisticParams(num_requests=20, rate=1.0))
    fast = realistic_workload(CORPUS_IDS, RealisticParams(num_requests=20, rate=4.0))
    for a, b in zip(slow.requests, fast.requests, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids and a.max_new_tokens == b.max_new_tokens
        assert b.arrival_s == pytest.approx(a.arrival_s / 4, abs=1e-5)


def test_workload_json_round_trip():
    wl = realistic_workload(CORPUS_IDS, RealisticParams(num_requests=5))
    assert Workload.from_dict(wl.to_dict()) == wl
    r = wl.requests[0]
    assert Request.from_dict(r.to_dict()) == r


def test_corpus_is_long_enough():
    # ~700 words (~850 tokens): enough distinct start offsets for every prompt of the default workloads.
    assert len(CORPUS.split()) > 600
