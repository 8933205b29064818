"""Metrics of the inference benchmark: percentiles, per-request latencies, serial extrapolation, RSS."""

import pytest

from devtools.bench.metrics import (
    CpuInterference,
    RequestRecord,
    RssSampler,
    bandwidth_ceiling_tok_s,
    extrapolate_serial,
    percentile,
    read_peak_rss_mb,
    reset_peak_rss,
    summarize,
)


def test_percentile_matches_numpy_linear():
    xs = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert percentile(xs, 50) == 5.5
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 10
    assert percentile(xs, 99) == pytest.approx(9.91)
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(xs, 101)


def rec(rid, arrival, times, max_new=None, error=None):
    return RequestRecord(
        rid, arrival, 10, max_new if max_new is not None else len(times), list(times), error=error
    )


def test_request_record_latencies():
    r = rec(0, 1.0, [1.5, 1.6, 1.8])
    assert r.ttft_ms == pytest.approx(500)
    assert r.itls_ms() == pytest.approx([100, 200])
    assert r.tpot_ms == pytest.approx(150)
    assert r.finish == 1.8
    back = RequestRecord.from_dict(r.to_dict(t0=1.0), t0=1.0)
    assert back.token_times == pytest.approx(r.token_times) and back.arrival == pytest.approx(1.0)


def test_summarize_throughput_ttft_itl():
    records = [rec(0, 0.0, [0.1, 0.2, 0.3, 0.4]), rec(1, 0.5, [1.0, 1.5, 2.0])]
    s = summarize(records)
    assert s["output_tokens"] == 7
    assert s["wall_s"] == pytest.approx(2.0)  # first arrival 0.0 -> last token 2.0
    assert s["output_tok_s"] == pytest.approx(3.5)
    assert s["ttft_ms_p50"] == pytest.approx(300)  # 100 and 500 ms
    assert s["itl_ms_p50"] == pytest.approx(100)  # gaps 100,100,100,500,500
    assert s["itl_ms_p99"] == pytest.approx(500)
    assert s["n_errors"] == 0 and s["short_replies"] == []


def test_summarize_flags_errors_and_short_replies():
    records = [rec(0, 0.0, [0.1, 0.2], max_new=4), rec(1, 0.0, [], max_new=4, error="boom")]
    s = summarize(records)
    assert s["n_errors"] == 1 and s["errors"] == ["boom"]
    assert s["short_replies"] == [0]
    assert s["n_ok"] == 1


def test_summarize_empty():
    s = summarize([])
    assert s["output_tokens"] == 0 and s["output_tok_s"] is None and s["ttft_ms_p50"] is None


def test_extrapolate_serial_repeats_measured_service_times():
    # two measured requests, each 1 s of service (first token 0.2 s into service), all arriving at t=0
    measured = [rec(0, 0.0, [0.2, 0.6, 1.0]), rec(1, 0.0, [1.2, 1.6, 2.0])]
    full = extrapolate_serial(measured, 4)
    assert len(full) == 4
    assert full[:2] == measured
    assert full[2].token_times == pytest.approx([2.2, 2.6, 3.0])
    assert full[3].token_times == pytest.approx([3.2, 3.6, 4.0])
    assert [r.arrival for r in full] == [0.0] * 4
    s = summarize(full)
    assert s["output_tok_s"] == pytest.approx(12 / 4.0)  # same rate as measured
    assert s["ttft_ms_p50"] == pytest.approx(1700)  # 200, 1200, 2200, 3200
    assert extrapolate_serial(measured, 2) == measured


def test_bandwidth_ceiling():
    assert bandwidth_ceiling_tok_s(20.0, 250_000_000) == pytest.approx(80.0)
    assert bandwidth_ceiling_tok_s(None, 1) is None


def test_rss_measurement_works_here():
    with RssSampler(interval_s=0.005) as s:
        block = bytearray(50_000_000)  # touch 50 MB
        block[::4096] = b"x" * len(block[::4096])
    assert s.peak_mb > 50
    if reset_peak_rss():  # Linux: the high-water mark is resettable and readable
        assert read_peak_rss_mb() > 0
    del block


def test_cpu_interference_reports_cores():
    with CpuInterference() as ci:
        sum(i * i for i in range(200_000))  # our own CPU time is not counted as interference
    assert ci.other_cores is not None and ci.other_cores >= 0
    assert ci.steal_cores is not None and ci.steal_cores >= 0
