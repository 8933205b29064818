"""Metrics: percentiles, per-request latency records, peak-RSS measurement, memory bandwidth.

Definitions (as in vLLM's ``benchmark_serving``):

* **output tok/s** -- total output tokens of all requests / wall time from the first arrival to the last
  completion (s).
* **TTFT** (time to first token, ms) -- first token's timestamp minus the request's *scheduled arrival* time,
  so queueing delay counts.
* **ITL** (inter-token latency, ms) -- gaps between consecutive token timestamps of the same request, pooled
  over all requests; tokens delivered together (one event carrying several tokens) contribute 0 ms gaps.
* **TPOT** (time per output token, ms) -- per request (last token - first token) / (tokens - 1).
* **decode tok/s per sequence** -- per request (tokens - 1) / (last token - first token), i.e. 1000 / TPOT.
* **peak RSS** (MB) -- resident set size high-water mark of the process during the measured run
  (kernel ``VmHWM`` after resetting it via ``/proc/self/clear_refs``, or a psutil sampling thread when the
  reset is not possible). Each (system, workload) cell runs in its own process, so this is per system.
* **bandwidth ceiling** -- batch-1 decode must read every weight once per token, so
  ``ceiling tok/s = memory bandwidth (bytes/s) / weight bytes read per token``. Bandwidth is a large
  tensor copy (STREAM "copy": read + write bytes counted), best of a few.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation (numpy's default). ``None`` if empty."""
    xs = sorted(values)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return float(xs[lo])
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def mean(values: Iterable[float]) -> float | None:
    xs = list(values)
    return float(sum(xs) / len(xs)) if xs else None


@dataclass
class RequestRecord:
    """What a client saw of one request. All times are ``time.perf_counter()`` seconds in one process.

    ``token_times`` has one entry per output token (the time that token became visible to the client).
    """

    rid: int
    arrival: float
    prompt_len: int
    max_new_tokens: int
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def n_out(self) -> int:
        return len(self.token_times)

    @property
    def finish(self) -> float | None:
        return self.token_times[-1] if self.token_times else None

    @property
    def ttft_ms(self) -> float | None:
        return (self.token_times[0] - self.arrival) * 1000.0 if self.token_times else None

    def itls_ms(self) -> list[float]:
        t = self.token_times
        return [(t[i] - t[i - 1]) * 1000.0 for i in range(1, len(t))]

    @property
    def tpot_ms(self) -> float | None:
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) * 1000.0 / (len(self.token_times) - 1)

    def to_dict(self, t0: float) -> dict:
        """JSON form with times relative to ``t0`` in seconds (rounded to 0.1 ms)."""
        return {
            "rid": self.rid,
            "arrival_s": round(self.arrival - t0, 4),
            "prompt_len": self.prompt_len,
            "max_new_tokens": self.max_new_tokens,
            "n_out": self.n_out,
            "token_times_s": [round(x - t0, 4) for x in self.token_times],
            "token_ids": list(self.token_ids),
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict, t0: float = 0.0) -> RequestRecord:
        return cls(
            rid=d["rid"],
            arrival=t0 + d["arrival_s"],
            prompt_len=d["prompt_len"],
            max_new_tokens=d["max_new_tokens"],
            token_times=[t0 + x for x in d["token_times_s"]],
            token_ids=list(d.get("token_ids") or []),
            error=d.get("error"),
        )


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def summarize(records: Sequence[RequestRecord]) -> dict:
    """Aggregate metrics over one run (see module docstring for definitions; ms, s, tok/s)."""
    ok = [r for r in records if r.error is None and r.token_times]
    out_tokens = sum(r.n_out for r in records)
    short = [r.rid for r in records if r.error is None and r.n_out != r.max_new_tokens]
    start = min((r.arrival for r in records), default=None)
    end = max((r.finish for r in records if r.finish is not None), default=None)
    wall = (end - start) if (start is not None and end is not None) else None
    ttfts = [r.ttft_ms for r in ok]
    itls = [x for r in ok for x in r.itls_ms()]
    tpots = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    e2e = [(r.finish - r.arrival) * 1000.0 for r in ok]
    decode_rates = [1000.0 / t for t in tpots if t > 0]
    return {
        "n_requests": len(records),
        "n_ok": len(ok),
        "n_errors": sum(1 for r in records if r.error is not None),
        "errors": sorted({r.error for r in records if r.error is not None})[:5],
        "short_replies": short,
        "output_tokens": out_tokens,
        "wall_s": _r(wall, 3),
        "output_tok_s": _r(out_tokens / wall if wall else None),
        "ttft_ms_p50": _r(percentile(ttfts, 50)),
        "ttft_ms_p99": _r(percentile(ttfts, 99)),
        "ttft_ms_mean": _r(mean(ttfts)),
        "itl_ms_p50": _r(percentile(itls, 50)),
        "itl_ms_p99": _r(percentile(itls, 99)),
        "itl_ms_mean": _r(mean(itls)),
        "tpot_ms_p50": _r(percentile(tpots, 50)),
        "e2e_ms_p50": _r(percentile(e2e, 50)),
        "e2e_ms_p99": _r(percentile(e2e, 99)),
        "decode_tok_s_per_seq_p50": _r(percentile(decode_rates, 50)),
    }


def extrapolate_serial(records: Sequence[RequestRecord], n_total: int) -> list[RequestRecord]:
    """Extend the records of a FIFO one-at-a-time server measured on the first k of ``n_total`` requests.

    All requests are assumed to arrive at the same time as the first one (the uniform workload), and
    request j >= k is assumed to take exactly as long as measured request ``j mod k`` (same prompt and reply
    length, same machine), starting when request j-1 finished. Measured records are returned unchanged.
    """
    measured = [r for r in records if r.token_times]
    if not measured or n_total <= len(records):
        return list(records)
    arrival = min(r.arrival for r in records)
    # Service timeline of each measured request relative to the previous completion (or to arrival for #0).
    order = sorted(measured, key=lambda r: r.token_times[0])
    prev_end = arrival
    shapes = []
    for r in order:
        shapes.append([t - prev_end for t in r.token_times])
        prev_end = r.token_times[-1]
    out = list(records)
    t = prev_end
    next_rid = max(r.rid for r in records) + 1
    for j in range(len(records), n_total):
        shape = shapes[j % len(shapes)]
        src = order[j % len(order)]
        times = [t + dt for dt in shape]
        out.append(
            RequestRecord(
                rid=next_rid,
                arrival=arrival,
                prompt_len=src.prompt_len,
                max_new_tokens=src.max_new_tokens,
                token_times=times,
            )
        )
        next_rid += 1
        t = times[-1]
    return out


# ---------------------------------------------------------------------------------------------------------
# Peak RSS


def rss_mb() -> float:
    """Current RSS of this process in MB."""
    import psutil

    return psutil.Process().memory_info().rss / 1e6


def reset_peak_rss(pid: int | str = "self") -> bool:
    """Reset the kernel's RSS high-water mark (VmHWM) of process ``pid`` (this one by default). True on success
    (Linux >= 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def read_status_mb(field: str = "VmHWM", pid: int | str = "self") -> float | None:
    """A memory field of ``/proc/PID/status`` in MB (``VmHWM``: the kernel's RSS high-water mark, ``VmRSS``: the
    RSS now), or None where unavailable (not Linux, the process gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        return None
    return None


def read_peak_rss_mb() -> float | None:
    """Kernel RSS high-water mark (VmHWM) of this process in MB, or None where unavailable."""
    return read_status_mb("VmHWM")


class RssSampler:
    """Samples this process's RSS every ``interval_s`` seconds in a daemon thread; ``peak_mb`` is the max seen.

    Use as a context manager. Complements VmHWM (which cannot miss a spike) where clear_refs is not allowed.
    """

    def __init__(self, interval_s: float = 0.02):
        self.interval_s = interval_s
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        import psutil

        proc = psutil.Process(os.getpid())
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, proc.memory_info().rss / 1e6)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self.peak_mb = rss_mb()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak_mb = max(self.peak_mb, rss_mb())


class CpuInterference:
    """How busy the machine was with *other* work while this process measured (context manager).

    ``other_cores`` = (system-wide busy CPU seconds - this process's CPU seconds) / wall seconds, i.e. the
    average number of cores used by everything else; ``steal_cores`` likewise for hypervisor steal time. On a
    quiet machine both stay near 0; a benchmark taken with other_cores > ~0.2 on 2 cores is not trustworthy.
    """

    def __init__(self) -> None:
        self.other_cores: float | None = None
        self.steal_cores: float | None = None

    @staticmethod
    def _snap():
        import psutil

        t = psutil.cpu_times()
        busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        own = psutil.Process().cpu_times()
        return time.perf_counter(), busy, getattr(t, "steal", 0.0), own.user + own.system

    def __enter__(self) -> CpuInterference:
        self._start = self._snap()
        return self

    def __exit__(self, *exc) -> None:
        end = self._snap()
        wall = end[0] - self._start[0]
        if wall <= 0:
            return
        busy, steal, own = (end[i] - self._start[i] for i in (1, 2, 3))
        self.other_cores = round(max(0.0, busy - own) / wall, 2)
        self.steal_cores = round(max(0.0, steal) / wall, 2)


# ---------------------------------------------------------------------------------------------------------
# Memory bandwidth and the batch-1 decode ceiling


def measure_bandwidth(size_bytes: int = 1 << 30, repeats: int = 5, num_threads: int | None = None) -> dict:
    """Memory bandwidth from a large torch tensor copy, in GB/s (10**9 B/s), counting read + write bytes.

    Returns ``{"copy_gb_s": best, "samples_gb_s": [...], "size_bytes": ..., "threads": ...}``. The best of
    ``repeats`` copies is used (the first touches fresh pages and is usually slower).
    """
    import torch

    if num_threads:
        torch.set_num_threads(num_threads)
    src = torch.ones(size_bytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault in the destination pages
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        dt = time.perf_counter() - t
        samples.append(2 * size_bytes / dt / 1e9)
    del src, dst
    return {
        "copy_gb_s": round(max(samples), 2),
        "samples_gb_s": [round(s, 2) for s in samples],
        "size_bytes": size_bytes,
        "threads": torch.get_num_threads(),
    }


def weight_bytes(model) -> int:
    """Bytes of the model's weights as stored (run dtype), each tensor counted once.

    Tied weights (SmolLM2 ties the input embedding to the LM head) share storage and are counted once: the
    LM head reads the whole matrix every decode step, the embedding lookup only one row.
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.data_ptr(), t.numel())
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def bandwidth_ceiling_tok_s(bandwidth_gb_s: float | None, bytes_per_token: int | None) -> float | None:
    """Upper bound on batch-1 decode tok/s when every weight byte is read once per token."""
    if not bandwidth_gb_s or not bytes_per_token:
        return None
    return bandwidth_gb_s * 1e9 / bytes_per_token
