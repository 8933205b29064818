"""Batch forming, KV sizing, ratios and output agreement of the inference benchmark (no model)."""

from collections import deque

import pytest

from devtools.bench.hf_cb import num_blocks_for
from devtools.bench.report import (
    compute_ratios,
    format_ratios,
    format_table,
    interference_warning,
    token_agreement,
)
from devtools.bench.static import collect_batch
from devtools.bench.workloads import Request


def req(rid, arrival, prompt_len=10, new=5):
    return Request(rid, arrival, tuple(range(prompt_len)), new)


def test_collect_batch_waits_for_window_then_takes_arrived():
    pending = deque([req(0, 0.0), req(1, 0.01), req(2, 0.2)])
    start, size = collect_batch(pending, t0=100.0, now=100.0, window_s=0.05, max_batch=32)
    assert start == pytest.approx(100.05) and size == 2


def test_collect_batch_when_busy_takes_everything_waiting():
    pending = deque([req(i, 0.1 * i) for i in range(5)])
    start, size = collect_batch(pending, t0=0.0, now=10.0, window_s=0.05, max_batch=32)
    assert start == 10.0 and size == 5


def test_collect_batch_caps_and_starts_when_full():
    pending = deque([req(i, 0.0) for i in range(40)])
    start, size = collect_batch(pending, t0=0.0, now=0.0, window_s=0.05, max_batch=32)
    assert start == 0.0 and size == 32
    assert collect_batch(deque(), 0.0, 0.0, 0.05, 32) == (None, 0)


def test_num_blocks_fits_longest_concurrent_requests():
    reqs = [req(0, 0, 1000, 512), req(1, 0, 20, 16), req(2, 0, 300, 100)]
    # top-2 lengths 1512 and 400 -> ceil(1512/256)+1 + ceil(400/256)+1 + 1 spare
    assert num_blocks_for(reqs, 256, 2) == (6 + 1) + (2 + 1) + 1


def cell(system, workload, n, tok_s, ttft_p99=None, dec=None, token_ids=None):
    summary = {k: None for k in ("wall_s", "ttft_ms_p50", "itl_ms_p50", "itl_ms_p99")}
    summary.update(
        {
            "output_tok_s": tok_s,
            "ttft_ms_p99": ttft_p99,
            "decode_tok_s_per_seq_p50": dec,
            "output_tokens": 10,
            "n_errors": 0,
            "errors": [],
            "short_replies": [],
        }
    )
    records = [{"rid": i, "token_ids": t} for i, t in enumerate(token_ids or [])]
    return {
        "system": system,
        "workload": workload,
        "n": n,
        "measured_n": n,
        "summary": summary,
        "weight_bytes": 250_000_000,
        "peak_rss_mb": 700.0,
        "records": records,
    }


def test_compute_ratios():
    cells = [
        cell("naive", "uniform", 1, 16.0, dec=16.0),
        cell("ours", "uniform", 1, 20.0, dec=20.0),
        cell("static", "uniform", 32, 100.0),
        cell("ours", "uniform", 32, 250.0),
        cell("static", "realistic", 48, 50.0, ttft_p99=30000.0),
        cell("hf_cb", "realistic", 48, 40.0, ttft_p99=5000.0),
        cell("ours", "realistic", 48, 100.0, ttft_p99=1000.0),
    ]
    r = compute_ratios(cells, bandwidth_gb_s=20.0, uniform_n=32)
    assert r["uniform_tput_ours_over_static"] == 2.5
    assert r["realistic_tput_ours_over_static"] == 2.0
    assert r["realistic_tput_ours_over_hf_cb"] == 2.5
    assert r["realistic_ttft_p99_static_over_ours"] == 30.0
    assert r["realistic_ttft_p99_hf_cb_over_ours"] == 5.0
    assert r["batch1_decode_ours_over_naive"] == 1.25
    assert r["batch1_decode"]["ours"]["ceiling_tok_s"] == 80.0
    assert r["batch1_decode"]["ours"]["pct_of_ceiling"] == 25.0
    text = format_ratios(r, {"copy_gb_s": 20.0})
    assert "ours/static = 2.50x" in text
    table = format_table(cells + [{"system": "hf_cb", "workload": "uniform", "n": 32, "error": "boom"}])
    assert "FAILED: boom" in table


def test_compute_ratios_with_missing_cells():
    r = compute_ratios([cell("static", "uniform", 8, 50.0)], bandwidth_gb_s=None, uniform_n=8)
    assert r["uniform_tput_ours_over_static"] is None
    assert r["batch1_decode"] == {}
    format_ratios(r, None)  # prints n/a rather than failing


def test_token_agreement():
    ref = cell("naive", "uniform", 2, 1.0, token_ids=[[1, 2, 3, 4], [5, 6, 7, 8]])
    other = cell("ours", "uniform", 2, 1.0, token_ids=[[1, 2, 3, 4], [5, 6, 0, 0]])
    a = token_agreement(other, ref)
    assert a == {"compared": 2, "identical": 1, "prefix_frac": 0.75}
    assert token_agreement(ref, ref) is None
    assert token_agreement(other, None) is None


def test_interference_warning():
    quiet = cell("ours", "uniform", 1, 1.0)
    quiet["other_cpu_cores"] = 0.01
    noisy = cell("static", "uniform", 1, 1.0)
    noisy["other_cpu_cores"] = 0.9
    assert interference_warning([quiet]) is None
    assert "1/2 cells" in interference_warning([quiet, noisy])
