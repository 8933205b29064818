"""Prometheus metrics of the guard chain (``safety/chain.py``), in the web and worker processes' default
registry like every other chatsite metric (:mod:`observability.metrics`), named with the same
``chatsite:`` prefix."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

MODERATION_VERDICTS = Counter(
    "chatsite:moderation_verdicts",
    "Guard verdicts by stage (input/output), guard, category hit ('none' when nothing was hit) and action "
    "(allow/flag/block).",
    ["stage", "guard", "category", "action"],
)
MODERATION_GUARD_LATENCY = Histogram(
    "chatsite:moderation_guard_latency_seconds",
    "Time one guard took on one text, by stage and guard.",
    ["stage", "guard"],
    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
MODERATION_GUARD_FAILURES = Counter(
    "chatsite:moderation_guard_failures",
    "Guards that raised (exception) or ran past the policy's timeout (timeout), by stage and guard.",
    ["stage", "guard", "kind"],
)


def observe_guard(*, stage: str, guard: str, seconds: float, failure: str = "") -> None:
    """One guard run: its latency (s) and, when ``failure`` (``exception``/``timeout``), one failure."""
    MODERATION_GUARD_LATENCY.labels(stage, guard).observe(seconds)
    if failure:
        MODERATION_GUARD_FAILURES.labels(stage, guard, failure).inc()


def observe_moderation_verdict(*, stage: str, guard: str, category: str, action: str) -> None:
    """Count one guard's verdict on one category (``none`` when it hit nothing)."""
    MODERATION_VERDICTS.labels(stage, guard, category, action).inc()
