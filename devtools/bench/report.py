"""Benchmark report: the printed table, the target ratios, greedy-output agreement, and the JSON file.

Units: tok/s (output tokens per second), ms, MB (10**6 bytes), GB/s (10**9 bytes/s).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from .metrics import bandwidth_ceiling_tok_s

SYSTEM_ORDER = ("naive", "static", "hf_cb", "ours")


def _key(cell: dict) -> tuple:
    wl_order = {"uniform": 0, "realistic": 1}
    sys_i = SYSTEM_ORDER.index(cell["system"]) if cell["system"] in SYSTEM_ORDER else 99
    return (wl_order.get(cell["workload"], 9), cell.get("n", 0), sys_i)


def find(cells: Sequence[dict], system: str, workload: str, n: int | None = None) -> dict | None:
    """The successful cell for (system, workload[, n]); with ``n=None`` the one with the largest n."""
    hits = [c for c in cells if c["system"] == system and c["workload"] == workload and "summary" in c]
    if n is not None:
        hits = [c for c in hits if c["n"] == n]
    return max(hits, key=lambda c: c["n"]) if hits else None


def _div(a, b):
    return round(a / b, 3) if (a is not None and b) else None


def token_agreement(cell: dict, ref: dict | None) -> dict | None:
    """Greedy-output agreement of ``cell`` with ``ref`` (naive) on the requests both measured.

    ``identical``: requests whose token ids are equal; ``prefix_frac``: mean fraction of each reply that
    matches before the first difference (bf16 batched kernels may legitimately diverge after a near-tie).
    """
    if ref is None or ref is cell:
        return None
    mine = {r["rid"]: r["token_ids"] for r in cell.get("records", []) if r.get("token_ids")}
    theirs = {r["rid"]: r["token_ids"] for r in ref.get("records", []) if r.get("token_ids")}
    common = sorted(mine.keys() & theirs.keys())
    if not common:
        return None
    identical, fracs = 0, []
    for rid in common:
        a, b = mine[rid], theirs[rid]
        m = min(len(a), len(b))
        k = next((i for i in range(m) if a[i] != b[i]), m)
        identical += a == b
        fracs.append(k / max(len(a), len(b), 1))
    return {"compared": len(common), "identical": identical, "prefix_frac": round(sum(fracs) / len(fracs), 3)}


def compute_ratios(cells: Sequence[dict], bandwidth_gb_s: float | None, uniform_n: int | None) -> dict:
    """The ratios the targets are judged on, all from this run's cells (None where a cell is missing)."""
    out: dict = {}

    def s(system, workload, n=None):
        c = find(cells, system, workload, n)
        return c["summary"] if c else {}

    n_big = uniform_n
    out["uniform_n"] = n_big
    out["uniform_tput_tok_s"] = {x: s(x, "uniform", n_big).get("output_tok_s") for x in SYSTEM_ORDER}
    out["uniform_tput_ours_over_static"] = _div(
        out["uniform_tput_tok_s"]["ours"], out["uniform_tput_tok_s"]["static"]
    )
    out["uniform_tput_ours_over_hf_cb"] = _div(
        out["uniform_tput_tok_s"]["ours"], out["uniform_tput_tok_s"]["hf_cb"]
    )

    rt = {x: s(x, "realistic").get("output_tok_s") for x in SYSTEM_ORDER}
    p99 = {x: s(x, "realistic").get("ttft_ms_p99") for x in SYSTEM_ORDER}
    out["realistic_tput_tok_s"] = rt
    out["realistic_tput_ours_over_static"] = _div(rt["ours"], rt["static"])
    out["realistic_tput_ours_over_hf_cb"] = _div(rt["ours"], rt["hf_cb"])
    out["realistic_ttft_p99_ms"] = p99
    out["realistic_ttft_p99_static_over_ours"] = _div(p99["static"], p99["ours"])
    out["realistic_ttft_p99_hf_cb_over_ours"] = _div(p99["hf_cb"], p99["ours"])

    b1 = {}
    for x in SYSTEM_ORDER:
        c = find(cells, x, "uniform", 1)
        if not c:
            continue
        rate = c["summary"].get("decode_tok_s_per_seq_p50")
        ceiling = bandwidth_ceiling_tok_s(bandwidth_gb_s, c.get("weight_bytes"))
        b1[x] = {
            "decode_tok_s": rate,
            "ceiling_tok_s": round(ceiling, 1) if ceiling else None,
            "pct_of_ceiling": round(100 * rate / ceiling, 1) if (rate and ceiling) else None,
            "weight_mb": round(c["weight_bytes"] / 1e6, 1),
        }
    out["batch1_decode"] = b1
    out["batch1_decode_ours_over_naive"] = _div(
        b1.get("ours", {}).get("decode_tok_s"), b1.get("naive", {}).get("decode_tok_s")
    )
    return out


def _f(x, nd=1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


COLUMNS = [
    ("system", 7),
    ("workload", 9),
    ("N", 4),
    ("meas", 5),
    ("out tok", 7),
    ("wall s", 7),
    ("tok/s", 7),
    ("TTFT p50", 9),
    ("TTFT p99", 9),
    ("ITL p50", 8),
    ("ITL p99", 8),
    ("dec/seq", 7),
    ("RSS MB", 7),
    ("=naive", 7),
    ("bg cpu", 6),
    ("notes", 0),
]


def format_table(cells: Sequence[dict]) -> str:
    """Fixed-width table, one row per cell. Times in ms, throughput in tok/s, RSS in MB."""
    lines = ["  ".join(h.rjust(w) if w else h for h, w in COLUMNS)]
    for c in sorted(cells, key=_key):
        if "summary" not in c:
            blanks = [""] * (len(COLUMNS) - 4)  # every column between N and notes
            vals = [
                c["system"],
                c["workload"],
                c.get("n"),
                *blanks,
                "FAILED: " + str(c.get("error", "?"))[:80],
            ]
        else:
            s = c["summary"]
            notes = []
            if c.get("extrapolated"):
                notes.append(f"EXTRAPOLATED from {c['measured_n']} measured (serial FIFO)")
            if s.get("n_errors"):
                notes.append(f"{s['n_errors']} errors: {'; '.join(s['errors'])[:60]}")
            if s.get("short_replies"):
                notes.append(f"{len(s['short_replies'])} short replies")
            notes += [n for n in c.get("notes", []) if "ignore_eos" in n]
            agree = c.get("agreement_vs_naive")
            eq = f"{agree['identical']}/{agree['compared']}" if agree else "-"
            vals = [
                c["system"],
                c["workload"],
                c["n"],
                c["measured_n"],
                s["output_tokens"],
                _f(s["wall_s"], 2),
                _f(s["output_tok_s"]),
                _f(s["ttft_ms_p50"], 0),
                _f(s["ttft_ms_p99"], 0),
                _f(s["itl_ms_p50"]),
                _f(s["itl_ms_p99"]),
                _f(s["decode_tok_s_per_seq_p50"]),
                _f(c.get("peak_rss_mb"), 0),
                eq,
                _f(c.get("other_cpu_cores"), 2),
                "; ".join(notes),
            ]
        lines.append(
            "  ".join(str(v).rjust(w) if w else str(v) for v, (_, w) in zip(vals, COLUMNS, strict=True))
        )
    return "\n".join(lines)


#: Average cores used by other processes during a cell above which the report warns (2-core machine).
NOISY_CORES = 0.2


def interference_warning(cells: Sequence[dict]) -> str | None:
    """A warning line when other processes used the CPU during some cells (their numbers are unreliable)."""
    noisy = [c for c in cells if (c.get("other_cpu_cores") or 0) > NOISY_CORES]
    if not noisy:
        return None
    worst = max(c["other_cpu_cores"] for c in noisy)
    return (
        f"WARNING: other processes used the CPU during {len(noisy)}/{len(cells)} cells (up to {worst:.2f} cores on "
        f"average, column 'bg cpu'); rerun on a quiet machine before trusting these numbers"
    )


def format_ratios(r: dict, bandwidth: dict | None) -> str:
    def x(v):
        return f"{v:.2f}x" if v is not None else "n/a"

    lines = []
    n = r.get("uniform_n")
    u = r["uniform_tput_tok_s"]
    lines.append(
        f"uniform N={n} throughput  ours/static = {x(r['uniform_tput_ours_over_static'])}"
        f"   (ours {_f(u['ours'])}, static {_f(u['static'])}, hf_cb {_f(u['hf_cb'])}, naive {_f(u['naive'])} tok/s)"
    )
    rt, p = r["realistic_tput_tok_s"], r["realistic_ttft_p99_ms"]
    lines.append(
        f"realistic throughput      ours/static = {x(r['realistic_tput_ours_over_static'])},"
        f" ours/hf_cb = {x(r['realistic_tput_ours_over_hf_cb'])}"
        f"   (ours {_f(rt['ours'])}, static {_f(rt['static'])}, hf_cb {_f(rt['hf_cb'])}, naive {_f(rt['naive'])} tok/s)"
    )
    lines.append(
        f"realistic TTFT p99 (ms)   ours {_f(p['ours'], 0)} | static {_f(p['static'], 0)}"
        f" (static/ours {x(r['realistic_ttft_p99_static_over_ours'])}) | hf_cb {_f(p['hf_cb'], 0)}"
        f" (hf_cb/ours {x(r['realistic_ttft_p99_hf_cb_over_ours'])}) | naive {_f(p['naive'], 0)}"
    )
    bw = f"{bandwidth['copy_gb_s']:.1f} GB/s copy" if bandwidth else "bandwidth not measured"
    parts = []
    for name, b in r["batch1_decode"].items():
        parts.append(f"{name} {_f(b['decode_tok_s'])} tok/s = {_f(b['pct_of_ceiling'])}%")
    ceil = next((b["ceiling_tok_s"] for b in r["batch1_decode"].values() if b.get("ceiling_tok_s")), None)
    wmb = next((b["weight_mb"] for b in r["batch1_decode"].values()), None)
    lines.append(
        f"batch-1 decode            ours/naive = {x(r['batch1_decode_ours_over_naive'])}"
        f"   ceiling {_f(ceil)} tok/s ({bw} / {_f(wmb)} MB weights per token): " + ", ".join(parts)
    )
    return "\n".join(lines)


def write_json(path: str, payload: dict) -> None:
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)
