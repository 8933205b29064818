"""Figures of the overhead benchmarks (``manage.py bench_overhead``, ``bench_burst``): median [min-max] over rounds,
percentiles over streams, tok/s over waves."""

from __future__ import annotations

import math
import statistics

from devtools.reply_stages import percentile


def median_range(values: list[float], fmt: str = "{:.0f}") -> str:
    """``median [min-max]`` of ``values`` (None and NaN left out) in ``fmt``; ``-`` when none is left."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def pct(streams, attr: str, q: float) -> float:
    """The ``q`` (0-100) nearest-rank percentile of ``attr`` over ``streams`` (those with it set), ms."""
    values = [getattr(s, attr) for s in streams if getattr(s, attr) is not None]
    return percentile(values, q)


def tps(waves) -> float:
    """Mean tok/s over ``waves`` (NaN when none)."""
    return sum(wv.tokens_per_s for wv in waves) / len(waves) if waves else float("nan")


def gaps(streams) -> list[float]:
    """Every inter-token gap (ms) of every stream."""
    return [g for s in streams for g in s.gaps_ms]
