"""Output moderation while a reply streams: the chain runs on the growing reply at sentence ends (or every N
tokens) and once on the whole reply at the end.

The worker-side adapter feeds every engine delta to an :class:`OutputMonitor`, never on the engine's loop
thread: the worker's publisher thread feeds the deltas at which no check is due (:meth:`OutputMonitor.due`) and
hands the others to the reply's own task thread, which runs the check (``conversations.delta_publisher``), so a
check delays at most that reply's next publish, not the batch's decode step nor another reply's deltas. A
partial check looks at the text since the previous check plus ``OVERLAP_CHARS`` before it (a secret or phrase split across two deltas is still seen whole; the classifier judges the new
sentence rather than the whole reply, where one bad sentence would be diluted); the final check sees the
whole reply.
"""

from __future__ import annotations

import re

from django.conf import settings

from safety.chain import Verdict, chain_run
from safety.policies import policy_for_tier

#: Characters of already-checked text included again in the next partial check.
OVERLAP_CHARS = 200
SENTENCE_END = re.compile(r"[.!?;:\n\u3002\uff01\uff1f]")


class OutputMonitor:
    """Feed it the reply's deltas; it says when the reply must be cut.

    ``every_tokens``: 0 checks at each delta that ends a sentence (``SENTENCE_END``), N > 0 every N tokens
    (default ``SAFETY_OUTPUT_CHECK_EVERY_TOKENS``). ``enabled`` is False when the tier's policy does not
    moderate output (then :meth:`feed` and :meth:`finish` return None at no cost). ``checks``: the partial
    checks run so far (for tests and the benchmark)."""

    def __init__(self, *, tier, user_id: int | None = None, every_tokens: int | None = None):
        self.tier = tier
        self.user_id = user_id
        self.every_tokens = (
            settings.SAFETY_OUTPUT_CHECK_EVERY_TOKENS if every_tokens is None else every_tokens
        )
        policy = policy_for_tier(tier)
        self.enabled = policy.enabled and policy.moderate_output
        self.parts: list[str] = []
        self.length = 0
        self.checked_to = 0
        self.tokens_since = 0
        self.checks = 0
        self.blocked: Verdict | None = None

    def feed(self, text: str, n_tokens: int = 1) -> Verdict | None:
        """Add one delta (``n_tokens`` tokens); returns the blocking :class:`Verdict` when the check run at
        this delta blocks the reply, else None. After a block every later call returns that verdict."""
        if self.blocked is not None:
            return self.blocked
        due = self.due(text, n_tokens)  # False when output moderation is off
        self.parts.append(text)
        self.length += len(text)
        self.tokens_since += n_tokens
        if not due:
            return None
        return self._check(final=False)

    def due(self, text: str, n_tokens: int = 1) -> bool:
        """Whether :meth:`feed` of this delta would run a partial check (or return a block): pure, no state
        changes. A caller that must not run guards (``conversations.delta_publisher``'s thread) feeds only
        deltas for which this is False, and hands the others to a thread that may."""
        if self.blocked is not None:
            return True
        if not self.enabled:
            return False
        if self.every_tokens > 0:
            return self.tokens_since + n_tokens >= self.every_tokens
        return bool(SENTENCE_END.search(text))

    def finish(self, text: str | None = None) -> Verdict | None:
        """The check of the whole reply (``text``, default the deltas fed). Returns the final
        :class:`Verdict` (None when output moderation is off); a reply cut mid-stream returns its blocking
        verdict without checking again."""
        if self.blocked is not None:
            return self.blocked
        if not self.enabled:
            return None
        if text is not None:
            self.parts, self.length = [text], len(text)
        verdict = chain_run(text=self.text, stage="output", tier=self.tier, user_id=self.user_id, final=True)
        if verdict.blocked:
            self.blocked = verdict
        return verdict

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def _check(self, *, final: bool) -> Verdict | None:
        text = self.text
        window = text[max(0, self.checked_to - OVERLAP_CHARS) :]
        self.checked_to = len(text)
        self.tokens_since = 0
        self.checks += 1
        verdict = chain_run(text=window, stage="output", tier=self.tier, user_id=self.user_id, final=final)
        if verdict.blocked:
            self.blocked = verdict
            return verdict
        return None
