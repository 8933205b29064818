"""Admission control: whether a new generation may enter the queue, decided before anything is stored.

Refusals carry a protocol error code and, where waiting helps, ``retry_after`` in seconds, so the browser
can show "busy, retrying in N s" and re-send the same frame (HTTP: 503/429 with ``Retry-After``). Checks, in
order (the cheap fleet read first, so refusals under overload take milliseconds):

0. **Model**: a model the user chose must be one of the tier's (``models_for_tier``) -> ``model_not_found``;
   a chosen model is used as chosen (no degrading), "" follows the tier's routing below.
1. **Load** (``conversations/load.py``): no live worker for the tier's models -> ``no_workers``; the
   expected wait above the hard cap ``ADMISSION_HARD_CAP_WAIT_S`` -> ``busy`` for everyone; above the
   tier's own ``admit_max_wait_s`` -> ``busy`` (free tiers have the lower threshold, so they are refused
   first and admitted again, automatically, once the wait falls back under it). A tier with a
   ``degrade_to_model`` moves to that model while its own model's wait is above ``degrade_after_wait_s``.
2. Concurrent generations per user -> ``too_many_generations``.
3. Requests per minute (django-ratelimit's fixed window over the Redis cache, ``conversations/rate_window.py``)
   -> ``rate_limited``.
4. Daily token quota -> ``quota_exceeded``: inside a transaction the quota is *reserved* (prompt upper
   bound + reply limit, ``billing/quota.py``) and settled when the reply ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from billing.models import DailyQuota
from billing.quota import (
    QuotaExceeded,
    carried_reserve_outcome,
    carried_reserve_params,
    quota_hold_row,
    quota_reserve,
    quota_status,
)
from billing.selectors import seconds_until_tomorrow
from conversations import load
from conversations.admission_reads import user_admission_reads
from conversations.models import Message
from conversations.rate_window import rate_hit
from database.sql import fetch_one
from inference.registry import models_for_tier

#: Tokens a chat template adds around a conversation (role markers, a default system prompt) and per turn.
TEMPLATE_OVERHEAD_TOKENS = 64
TEMPLATE_TOKENS_PER_TURN = 8


@dataclass
class AdmissionRefused(Exception):
    """A generation was not admitted. ``code`` is a protocol error code (``busy``, ``no_workers``,
    ``rate_limited``, ``quota_exceeded``, ``too_many_generations``, ``model_not_found``); ``retry_after`` in
    seconds or None."""

    code: str
    message: str
    retry_after: float | None = None

    def __str__(self) -> str:
        return self.message


@dataclass
class Admission:
    """An admitted request: the model to run it on (``degraded`` when the tier's cheaper fallback was
    chosen under load), the expected wait (s) that admitted it, and the quota reserved for it (tokens; the
    ledger row is None when admission ran outside a transaction and only checked the quota)."""

    model_name: str
    degraded: bool
    expected_wait_s: float
    reserved_tokens: int = 0
    quota: DailyQuota | None = None
    #: Replies of ``model_name`` queued ahead of this one when it was admitted (its place in line less one,
    #: read in admission's statement: docs/overhead-levers.md, lever 30); None when admission did not read it.
    queued_ahead: int | None = None
    #: The per-minute counter as this admission left it (``conversations.rate_window.rate_hit``'s dict; None
    #: when rate limiting is off): the API's ``x-ratelimit-*`` headers, with no read of their own (lever 49).
    rate_usage: dict | None = None

    def reservation_row(self):
        """The unsaved ``QuotaReservation`` that ties the quota reservation to the reply it admitted (so the
        reply's end settles it), its reply not set, or None when nothing was reserved. The caller stores it
        with the reply, in the same statement (``message_chain_create(attached=...)``, lever 28)."""
        if self.quota is None:
            return None
        return quota_hold_row(quota=self.quota, tokens=self.reserved_tokens)


def _retry_after(wait_s: float, threshold_s: float) -> int:
    # The backlog drains in real time, so the wait falls under the threshold after about (wait - threshold) s.
    return int(min(300, max(settings.ADMISSION_RETRY_AFTER_S, math.ceil(wait_s - threshold_s))))


def model_choice(*, tier, model_name: str) -> str:
    """``model_name`` when ``tier`` may use it (one of ``models_for_tier``, the tier routing the API uses
    too), ``""`` for ``""`` (the tier's routing). Raises ``AdmissionRefused("model_not_found")``."""
    if model_name and model_name not in models_for_tier(tier):
        raise AdmissionRefused(
            "model_not_found",
            f"The model {model_name!r} is not available on the {tier.display_name or tier.name} plan.",
        )
    return model_name


def route(*, tier, model_name: str | None = None) -> tuple[str, float, bool]:
    """``(model_name, expected_wait_s, degraded)`` for a new request of ``tier``: its own model, or its
    ``degrade_to_model`` while the own model's wait is above ``degrade_after_wait_s`` (or it has no worker)
    and the fallback's wait is lower.

    ``model_name``: a model the user chose on the page, or another than the tier's own that an API client
    named (``conversations.completions``); it is used as chosen, never degraded. None or ``""``: the tier's
    routing as above. Raises ``AdmissionRefused`` ``model_not_found`` (not one of the tier's models) or
    ``no_workers`` (no live worker serves it, or none of the tier's models)."""
    if model_name:
        name = model_choice(tier=tier, model_name=model_name)
        wait = load.expected_wait_s(tier=tier, model_name=name)
        if wait is None:
            raise _no_workers()
        return name, wait, False
    options = []
    for name in models_for_tier(tier):
        wait = load.expected_wait_s(tier=tier, model_name=name)
        if wait is not None:
            options.append((name, wait))
    if not options:
        raise _no_workers()
    name, wait = options[0]
    own_live = name == tier.model_name
    if len(options) > 1 or not own_live:
        fallback = options[-1]
        if not own_live or (wait > tier.degrade_after_wait_s and fallback[1] < wait):
            return fallback[0], fallback[1], True
    return name, wait, False


def _no_workers() -> AdmissionRefused:
    return AdmissionRefused(
        "no_workers",
        "No model workers are available right now; try again shortly.",
        retry_after=settings.ADMISSION_RETRY_AFTER_S,
    )


def prompt_tokens_bound_for_texts(texts: list[str]) -> int:
    """The same upper bound as :func:`prompt_tokens_upper_bound` for turns not stored yet (the API)."""
    return (
        sum(len(t.encode()) for t in texts)
        + TEMPLATE_OVERHEAD_TOKENS
        + TEMPLATE_TOKENS_PER_TURN * (len(texts) + 2)
    )


@dataclass(frozen=True)
class ConversationTotals:
    """What admission reads of a stored conversation, in one aggregate (:func:`conversation_totals`).

    Attributes:
        content_bytes: UTF-8 bytes of its user and assistant turns.
        messages: Messages stored in it.
        active_replies: Its replies queued or streaming now (a send, edit or regeneration is refused while
            there is one).
    """

    content_bytes: int
    messages: int
    active_replies: int


#: The totals of a conversation that holds no message yet.
NO_MESSAGES = ConversationTotals(content_bytes=0, messages=0, active_replies=0)

#: :func:`conversation_totals`' one statement (a fixed string: ``database/sql.py``, lever 19).
_TOTALS_SQL = """
SELECT SUM(octet_length(content)) FILTER (WHERE role = ANY(%(turn_roles)s)),
       COUNT(*),
       COUNT(*) FILTER (WHERE role = %(assistant)s AND status = ANY(%(active)s))
  FROM conversations_message
 WHERE conversation_id = %(conversation)s
"""


def conversation_totals(*, conversation) -> ConversationTotals:
    """One round trip for the prompt bound's figures and the busy check. Read it under the conversation's row
    lock (``conversation_get_for_user(for_update=True)``): a reply another transaction stored and committed
    while this one waited for the lock is then counted (docs/overhead-levers.md, lever 18)."""
    content_bytes, messages, active_replies = fetch_one(
        _TOTALS_SQL,
        {
            "conversation": conversation.pk,
            "turn_roles": [Message.Role.USER, Message.Role.ASSISTANT],
            "assistant": Message.Role.ASSISTANT,
            "active": list(Message.ACTIVE_STATUSES),
        },
    )
    return ConversationTotals(
        content_bytes=content_bytes or 0, messages=messages, active_replies=active_replies
    )


def prompt_tokens_upper_bound(
    *, conversation, new_content: str = "", totals: ConversationTotals | None = None
) -> int:
    """An upper bound (tokens) of the prompt a reply in ``conversation`` can have, read without a tokenizer.

    Byte-level BPE tokenizers never produce more tokens than UTF-8 bytes, so the conversation's bytes
    (``octet_length`` summed in PostgreSQL) plus the chat template's fixed tokens bound the prompt; the
    sliding window only ever drops turns. ``totals``: what the caller already read with
    :func:`conversation_totals` (:data:`NO_MESSAGES` for a conversation its own transaction created), so
    nothing is read."""
    if totals is None:
        totals = conversation_totals(conversation=conversation)
    turns = totals.messages + 2
    return (
        totals.content_bytes
        + len(conversation.system_prompt.encode())
        + len(new_content.encode())
        + TEMPLATE_OVERHEAD_TOKENS
        + TEMPLATE_TOKENS_PER_TURN * turns
    )


#: The model a WebSocket frame's cached load gate admitted, set by the consumer around the reply-creating
#: service it then calls (:func:`gate_passed`): that frame's load decision is made, the service keeps only the
#: exact quota, concurrency and rate checks. Without it, a burst of frames let through on the same figures
#: were judged again with every later frame of the burst counted ahead of them (pending) and refused late.
_GATE_PASSED: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "admission_gate_passed", default=None
)


@contextlib.contextmanager
def gate_passed(model_name: str | None):
    """Within the block, :func:`admission_check` takes the load gate's decision for ``model_name`` (the model
    the cached gate routed the frame to) as made: a request routed to that model is not refused ``busy``
    again. ``None``: no decision (the block changes nothing). ``no_workers`` is always re-checked."""
    token = _GATE_PASSED.set(model_name)
    try:
        yield
    finally:
        _GATE_PASSED.reset(token)


def _refuse_over_threshold(*, tier, wait: float) -> None:
    if wait > settings.ADMISSION_HARD_CAP_WAIT_S:
        raise AdmissionRefused(
            "busy",
            "The service is overloaded right now; please retry shortly.",
            retry_after=_retry_after(wait, settings.ADMISSION_HARD_CAP_WAIT_S),
        )
    if wait > tier.admit_max_wait_s:
        raise AdmissionRefused(
            "busy",
            f"The service is busy for the {tier.display_name or tier.name} plan right now; retrying shortly.",
            retry_after=_retry_after(wait, tier.admit_max_wait_s),
        )


def load_gate(*, tier, model_name: str | None = None) -> tuple[str, float, bool]:
    """The load part of admission alone: :func:`route` (``model_name``: the model a client named, see there)
    then the hard cap and the tier's threshold. Raises ``AdmissionRefused`` (``no_workers``/``busy``). Reads
    only cached figures, so a caller can refuse before opening a transaction; returns ``(model_name,
    expected_wait_s, degraded)``. Inside :func:`gate_passed` for the model routed to, the thresholds were
    decided already and are not applied again."""
    model_name, wait, degraded = route(tier=tier, model_name=model_name)
    if _GATE_PASSED.get() != model_name:  # else this frame's cached gate already decided (gate_passed)
        _refuse_over_threshold(tier=tier, wait=wait)
    return model_name, wait, degraded


def refresh_tier(user) -> None:
    """Point ``user.tier`` at the user's current tier row, read through the ``ADMISSION_LOAD_CACHE_S`` cache
    (:func:`conversations.load.current_tier`). A long-lived ``user`` object (a WebSocket's, loaded when it
    connected) calls it before each admission, so a tier an admin changed, or an approved upgrade, applies
    to the next request within that time instead of at the next reconnect. Raises ``CacheMiss`` inside
    :func:`conversations.load.cached_only` when the figures are not cached."""
    user.tier = load.current_tier(user.pk)


def load_gate_for_user(*, user, model_name: str = "") -> tuple[str, float, bool]:
    """:func:`load_gate` for ``user``'s current tier (:func:`refresh_tier`, read through the 1 s cache) and
    chosen ``model_name`` (``""``: the tier's routing). The WebSocket consumer runs it off Channels' single
    database thread, so refusals under overload do not queue behind other clients' transactions."""
    refresh_tier(user)
    return load_gate(tier=user.tier, model_name=model_name)


def admission_check(
    *,
    user,
    prompt_tokens_bound: int | None = None,
    model_name: str | None = None,
    place_in_line: bool = False,
) -> Admission:
    """Admit one more generation for ``user`` or raise :class:`AdmissionRefused` (see the module docstring).

    ``prompt_tokens_bound``: an upper bound of the prompt in tokens (default: the tier's whole context).
    ``model_name``: the model the user chose (see :func:`route`), "" for the tier's routing.
    Inside ``transaction.atomic()`` the quota is reserved (``min(max_context_tokens, bound +
    max_reply_tokens)`` tokens) and the caller must store :meth:`Admission.reservation_row` with the reply; outside a
    transaction the quota is only checked. Counts one request against the per-minute rate when the load
    and concurrency checks passed. ``model_name``: the model a client named (:func:`route`); the
    :class:`Admission` says which model will answer. ``place_in_line``: also read how many replies of that
    model are queued ahead (``Admission.queued_ahead``), in the same statement as the concurrency count."""
    tier = user.tier
    model_name, wait, degraded = load_gate(tier=tier, model_name=model_name)
    bound = tier.max_context_tokens if prompt_tokens_bound is None else prompt_tokens_bound
    needed = max(1, min(tier.max_context_tokens, bound + tier.max_reply_tokens))
    reserving = transaction.get_connection().in_atomic_block
    # The reservation rides in the read's statement (lever 48); a refusal below rolls it back with the rest.
    carried = carried_reserve_params(user=user, tokens=needed) if reserving else None
    active, membership, ahead, reserved = user_admission_reads(
        user=user, place_in_line_of=model_name if place_in_line else None, reserve=carried
    )
    if active >= tier.max_concurrent_generations:
        raise AdmissionRefused(
            "too_many_generations",
            f"Your plan allows {tier.max_concurrent_generations} reply at a time; wait for the current one.",
            retry_after=settings.ADMISSION_RETRY_AFTER_S,
        )
    usage = rate_hit(group="generation", value=f"user:{user.pk}", rate=f"{tier.requests_per_minute}/m")
    if usage and usage["should_limit"]:
        raise AdmissionRefused(
            "rate_limited",
            f"Your plan allows {tier.requests_per_minute} messages per minute.",
            retry_after=max(1, usage["time_left"]),
        )
    admission = Admission(
        model_name=model_name, degraded=degraded, expected_wait_s=wait, queued_ahead=ahead, rate_usage=usage
    )
    if reserving:
        try:
            if carried is None:
                admission.quota = quota_reserve(user=user, tokens=needed, membership=membership)
            else:
                admission.quota = carried_reserve_outcome(
                    user=user, params=carried, membership=membership, row=reserved
                )
        except QuotaExceeded as exc:
            raise _quota_refusal(tier, remaining=exc.remaining, needed=needed) from exc
        admission.reserved_tokens = needed
    else:
        remaining = quota_status(user=user).remaining
        if remaining < needed:
            raise _quota_refusal(tier, remaining=remaining, needed=needed)
    load.note_admitted(model_name=model_name, priority=tier.queue_priority)
    return admission


def _quota_refusal(tier, *, remaining: int, needed: int) -> AdmissionRefused:
    if remaining <= 0:
        text = f"You have used today's {tier.tokens_per_day} tokens; the quota resets at midnight ({settings.TIME_ZONE})."
    else:
        text = (
            f"This reply could need up to {needed} tokens and {remaining} of today's quota are left; "
            f"start a new, shorter conversation or wait for the reset at midnight ({settings.TIME_ZONE})."
        )
    return AdmissionRefused("quota_exceeded", text, retry_after=seconds_until_tomorrow())
