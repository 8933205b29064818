"""The guard chain: every guard of ``settings.SAFETY_GUARDS`` that the tier's policy names for the stage runs
on the text; the policy's thresholds turn their scores into hit categories and an action.

Like Django's middleware list, ``SAFETY_GUARDS`` holds dotted class paths, instantiated once per process
(on first use, again when the setting changes). Guards marked ``inline`` (bounded CPU work: the rules and
the linear classifier) run on the caller's thread; the others (HTTP, anything an operator adds without the
mark) run on a small thread pool and are abandoned after the policy's ``guard_timeout_ms``. A guard that
raises or times out is a *failure*: counted (``chatsite:moderation_guard_failures_total``), recorded in the
verdict, and settled by the policy: ``on_failure = "open"`` ignores it, ``"closed"`` blocks the text with
category ``guard_failure``. The text itself is never lost: the caller stores it either way.

The idea of guardrails as classifiers on both sides of the model follows Meta's Llama Guard ("input-output
safeguard", Inan et al. 2023) and the OpenAI moderation endpoint's category/score shape.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.utils.module_loading import import_string

from observability import moderation_metrics as metrics
from observability import tracing
from safety.guards.base import GuardContext
from safety.policies import Policy, policy_for_tier

logger = logging.getLogger(__name__)

GUARD_FAILURE = "guard_failure"


@dataclass
class Verdict:
    """The chain's answer for one text. ``action``: ``allow``, ``flag`` or ``block``. ``categories``: the
    categories hit (``guard_failure`` when a failing guard blocked under a closed policy). ``results``: per
    guard ``{"guard", "version", "scores", "ms", "error"}`` (scores rounded to 6 digits). ``guard``: the
    first guard that hit, "" when none. ``failures``: guards that raised or timed out."""

    stage: str
    action: str = "allow"
    categories: list[str] = field(default_factory=list)
    results: list[dict] = field(default_factory=list)
    guard: str = ""
    failures: int = 0
    tier: str = ""

    @property
    def flagged(self) -> bool:
        return self.action != "allow"

    @property
    def blocked(self) -> bool:
        return self.action == "block"

    def category_scores(self) -> dict[str, float]:
        """The highest score of each category over all guards."""
        merged: dict[str, float] = {}
        for result in self.results:
            for category, score in result["scores"].items():
                merged[category] = max(score, merged.get(category, 0.0))
        return merged


_guards_lock = threading.Lock()
_guards: tuple[tuple[str, ...], list] | None = None
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def guards_loaded() -> list:
    """The guard instances of ``SAFETY_GUARDS``, in order (built once per value of the setting). Raises
    ``ImportError``/``ValueError`` for a guard that cannot be built (a bad path, the HTTP guard without
    ``SAFETY_HTTP_GUARD_URL``): a misconfiguration should stop the process, not pass every text."""
    global _guards
    paths = tuple(settings.SAFETY_GUARDS)
    loaded = _guards
    if loaded is not None and loaded[0] == paths:
        return loaded[1]
    with _guards_lock:
        if _guards is None or _guards[0] != paths:
            _guards = (paths, [import_string(path)() for path in paths])
        return _guards[1]


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _guards_lock:
            if _pool is None:
                _pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=settings.SAFETY_GUARD_THREADS, thread_name_prefix="safety-guard"
                )
    return _pool


def _selected(policy: Policy, stage: str) -> list:
    names = policy.guard_names(stage)
    return [
        g
        for g in guards_loaded()
        if stage in getattr(g, "stages", ("input", "output")) and (not names or g.name in names)
    ]


def _run_guard(guard, text: str, context: GuardContext, policy: Policy) -> dict:
    started = time.perf_counter()
    error = ""
    scores: dict[str, float] = {}
    try:
        if getattr(guard, "inline", True):
            result = guard.check(text, context)
        else:
            future = _executor().submit(guard.check, text, context)
            result = future.result(timeout=policy.guard_timeout_ms / 1000)
        scores = {str(k): round(float(v), 6) for k, v in result.scores.items()}
    except concurrent.futures.TimeoutError:
        error = "timeout"
    except Exception:
        error = "exception"
        logger.warning("guard %s failed on %s text", guard.name, context.stage, exc_info=True)
    elapsed = time.perf_counter() - started
    metrics.observe_guard(stage=context.stage, guard=guard.name, seconds=elapsed, failure=error)
    return {
        "guard": guard.name,
        "version": str(getattr(guard, "version", "")),
        "scores": scores,
        "ms": round(elapsed * 1000, 3),
        "error": error,
    }


def chain_run(*, text: str, stage: str, tier=None, user_id: int | None = None, final: bool = True) -> Verdict:
    """Run the chain on ``text`` for ``stage`` (``input``/``output``) under ``tier``'s policy (a
    ``billing.Tier``; None = the default policy). ``final`` False marks a partial output check while a
    reply streams (counted as such in metrics, not recorded). Never raises for a guard's failure; see the
    module docstring. Returns a :class:`Verdict` (``allow`` when the policy is disabled)."""
    policy = policy_for_tier(tier)
    verdict = Verdict(stage=stage, tier=policy.tier)
    if not policy.enabled or (stage == "output" and not policy.moderate_output):
        return verdict
    context = GuardContext(stage=stage, user_id=user_id, tier=policy.tier, final=final)
    # A span for input and final output checks only: one per sentence would drown the reply's trace.
    with tracing.span(f"moderation.{stage}") if final else contextlib.nullcontext() as span:
        for guard in _selected(policy, stage):
            _apply(verdict, policy, guard, _run_guard(guard, text, context, policy))
        if span is not None:
            span.set_attribute("moderation.action", verdict.action)
            span.set_attribute("moderation.categories", ",".join(verdict.categories))
            span.set_attribute("moderation.failures", verdict.failures)
    if verdict.flagged:
        # Categories and guard only: message text never goes to the logs.
        logger.info(
            "moderation %s %s: %s by %s", stage, verdict.action, ",".join(verdict.categories), verdict.guard
        )
    return verdict


def _apply(verdict: Verdict, policy: Policy, guard, result: dict) -> None:
    """Fold one guard's result into ``verdict`` under ``policy``, counting it per category."""
    verdict.results.append(result)
    hits = [c for c, s in result["scores"].items() if s >= policy.threshold(c)]
    if result["error"]:
        verdict.failures += 1
        if policy.on_failure == "closed":
            hits.append(GUARD_FAILURE)
    for category in hits:
        if category not in verdict.categories:
            verdict.categories.append(category)
    if hits and not verdict.guard:
        verdict.guard = guard.name
    action = _action(policy, hits)
    for category in hits or ["none"]:
        metrics.observe_moderation_verdict(
            stage=verdict.stage, guard=guard.name, category=category, action=action
        )
    if action == "block":
        verdict.action = "block"
    elif action == "flag" and verdict.action == "allow":
        verdict.action = "flag"


def _action(policy: Policy, hits: list[str]) -> str:
    if not hits:
        return "allow"
    if policy.action == "block" and any(c not in policy.flag_only_categories for c in hits):
        return "block"
    return "flag"
