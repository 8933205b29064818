"""A tier's safety policy as a plain object, read through a short per-process cache (the chain runs on
every message; a database read there would cost more than the guards)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from django.conf import settings


@dataclass(frozen=True)
class Policy:
    """See :class:`safety.models.SafetyPolicy` for the meaning of each field. ``tier`` is the tier's name
    ("" for the settings' default policy)."""

    tier: str = ""
    enabled: bool = True
    action: str = "block"
    default_threshold: float = 0.5
    thresholds: dict[str, float] = field(default_factory=dict)
    flag_only_categories: tuple[str, ...] = ()
    on_failure: str = "open"
    guard_timeout_ms: int = 500
    input_guards: tuple[str, ...] = ()
    output_guards: tuple[str, ...] = ()
    moderate_output: bool = True

    def threshold(self, category: str) -> float:
        return self.thresholds.get(category, self.default_threshold)

    def guard_names(self, stage: str) -> tuple[str, ...]:
        """Guard names to run on ``stage``; () = every configured guard."""
        return self.input_guards if stage == "input" else self.output_guards


def default_policy(tier: str = "") -> Policy:
    """The policy of a tier without a ``SafetyPolicy`` row, from the ``SAFETY_DEFAULT_*`` settings."""
    return Policy(
        tier=tier,
        enabled=settings.SAFETY_ENABLED,
        action=settings.SAFETY_DEFAULT_ACTION,
        default_threshold=settings.SAFETY_DEFAULT_THRESHOLD,
        thresholds=dict(settings.SAFETY_DEFAULT_THRESHOLDS),
        flag_only_categories=tuple(settings.SAFETY_DEFAULT_FLAG_ONLY),
        on_failure=settings.SAFETY_DEFAULT_ON_FAILURE,
        guard_timeout_ms=settings.SAFETY_GUARD_TIMEOUT_MS,
        moderate_output=settings.SAFETY_MODERATE_OUTPUT,
    )


def policy_from_row(row, tier: str) -> Policy:
    """A :class:`Policy` from a ``SafetyPolicy`` row; ``SAFETY_ENABLED=false`` still turns everything off."""
    return Policy(
        tier=tier,
        enabled=row.enabled and settings.SAFETY_ENABLED,
        action=row.action,
        default_threshold=row.default_threshold,
        thresholds={str(k): float(v) for k, v in (row.thresholds or {}).items()},
        flag_only_categories=tuple(row.flag_only_categories or ()),
        on_failure=row.on_failure,
        guard_timeout_ms=row.guard_timeout_ms,
        input_guards=tuple(row.input_guards or ()),
        output_guards=tuple(row.output_guards or ()),
        moderate_output=row.moderate_output,
    )


_cache: dict[int, tuple[float, Policy]] = {}
_cache_lock = threading.Lock()


def policy_for_tier(tier) -> Policy:
    """The policy of ``tier`` (a ``billing.Tier``, or None for the default policy), its row read at most
    once per ``SAFETY_POLICY_CACHE_S`` seconds per process, so an admin's edit applies within that time."""
    if tier is None or tier.pk is None:
        return default_policy(getattr(tier, "name", "") or "")
    now = time.monotonic()
    cached = _cache.get(tier.pk)
    if cached is not None and now - cached[0] < settings.SAFETY_POLICY_CACHE_S:
        return cached[1]
    from safety.models import SafetyPolicy

    row = SafetyPolicy.objects.filter(tier_id=tier.pk).first()
    policy = policy_from_row(row, tier.name) if row is not None else default_policy(tier.name)
    with _cache_lock:
        _cache[tier.pk] = (now, policy)
    return policy


def policy_cache_clear() -> None:
    """Forget cached policies (tests, and the admin after a save in this process)."""
    with _cache_lock:
        _cache.clear()
