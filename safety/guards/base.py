"""The guard interface: text plus context in, a :class:`GuardResult` (per-category scores) out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Stage = Literal["input", "output"]


@dataclass(frozen=True)
class GuardContext:
    """What a guard may know besides the text: the ``stage`` (``input``: a user's message before admission,
    or text sent to ``/v1/moderations``; ``output``: the growing reply), the user's id and tier name, and
    whether the text is ``final`` (the whole reply) or a partial output check while streaming."""

    stage: Stage
    user_id: int | None = None
    tier: str = ""
    final: bool = True


@dataclass(frozen=True)
class GuardResult:
    """One guard's scores: ``scores`` maps a category (``prompt_injection``, ``secret``, ``profanity`` ...)
    to a score in [0, 1]; categories the guard does not score are absent. The tier's policy thresholds
    decide which categories count as hit (:mod:`safety.policies`)."""

    guard: str
    version: str
    scores: dict[str, float] = field(default_factory=dict)


class Guard:
    """Base class of a guard (subclassing is optional: any object with these attributes works).

    ``name`` labels metrics and verdicts; ``version`` is stored with each verdict so a reviewer knows which
    rules or weights judged it. ``inline = True`` says :meth:`check` is CPU-bound and bounded (microseconds
    to a millisecond), so the chain calls it on the caller's thread; a guard with ``inline = False`` (network,
    a large model) runs on the chain's thread pool under the policy's timeout. ``stages`` are the stages it
    checks. ``check`` may raise: the chain counts the failure and applies the tier's fail-open/closed policy.
    """

    name: str = "guard"
    version: str = "1"
    inline: bool = True
    stages: tuple[str, ...] = ("input", "output")

    def check(self, text: str, context: GuardContext) -> GuardResult:  # pragma: no cover - interface
        raise NotImplementedError
