"""The reaper of replies: settle ``streaming`` replies whose worker died (:func:`generations_reap_interrupted`)
and re-send ``queued`` ones no broker message may deliver (:func:`generations_redispatch_queued`).
:func:`reap_interrupted` runs both on every worker host's reaper thread (registered by
``conversations/tasks.py`` with ``inference.worker.reaper_register``); ``manage.py reap_interrupted`` and a
tab's ``resume`` (``reply_control.reply_for_resume``) call them too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.quota import quota_settle
from conversations.models import Message
from conversations.reply_dispatch import reply_dispatch
from database.storable_text import storable_text
from events import broadcast

logger = logging.getLogger(__name__)


def generations_reap_interrupted(
    *,
    is_alive: Callable[[int], bool] = broadcast.lease_alive,
    grace_s: float = broadcast.LEASE_TTL_S,
    message_ids: list[int] | None = None,
    recheck_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """Mark ``streaming`` replies whose worker is gone (``is_alive(message_id)`` False, e.g. its lease key
    expired after a SIGKILL) and that have not changed for ``grace_s`` seconds as ``interrupted``, keeping
    the text streamed so far, and tell watching browsers. ``message_ids`` limits the scan. With
    ``recheck_s`` (``broadcast.LEASE_RECHECK_S`` for the reapers) a reply counts as orphaned only if its
    lease is still missing that many seconds later, so a Redis restart (which loses every lease until the
    heartbeats put them back) does not interrupt live generations. Returns the ids marked."""
    cutoff = timezone.now() - timedelta(seconds=grace_s)
    candidates = Message.objects.filter(status=Message.Status.STREAMING, updated_at__lt=cutoff)
    if message_ids is not None:
        candidates = candidates.filter(pk__in=message_ids)
    orphaned = [
        message_id for message_id in candidates.values_list("id", flat=True) if not is_alive(message_id)
    ]
    if orphaned and recheck_s > 0:
        sleep(recheck_s)
        orphaned = [message_id for message_id in orphaned if not is_alive(message_id)]
    reaped = []
    for message_id in orphaned:
        with transaction.atomic():
            if Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).update(
                status=Message.Status.INTERRUPTED,
                content=storable_text(broadcast.stream_text(message_id)),
                error="The worker generating this reply stopped. Retry to generate it again.",
                updated_at=timezone.now(),
            ):
                message = Message.objects.select_related("conversation").get(pk=message_id)
                # A reply our worker lost is not charged (its late finish, if any, charges the real count).
                quota_settle(message=message, used_tokens=0)
                broadcast.publish_on_commit(message_id, broadcast.frame_done(message=message))
                if not message.conversation.stored:  # an unstored API completion: nothing to retry
                    message.conversation.delete()
                reaped.append(message_id)
    return reaped


def generations_redispatch_queued(*, after_s: float | None = None, limit: int = 500) -> list[int]:
    """Dispatch again every ``queued`` reply that no broker message may deliver: one whose last dispatch
    (``updated_at``) is at least ``after_s`` seconds (default ``settings.QUEUED_REDISPATCH_S``) and at
    least half its age ago, so a reply waiting in a long queue is re-sent ever more rarely (O(log wait)
    copies) while one lost with a dying worker is re-sent within ``after_s`` seconds.

    At-least-once delivery made safe: a duplicate task finds the reply no longer ``queued`` and skips it,
    since only one ``queued -> streaming`` claim (``generation_worker.generation_start``) can succeed. Several reapers
    (one per worker) may run at once; the conditional UPDATE of ``updated_at`` lets one of them win each
    round. Returns the ids re-dispatched, oldest first."""
    after_s = settings.QUEUED_REDISPATCH_S if after_s is None else after_s
    now = timezone.now()
    candidates = (
        Message.objects.filter(
            role=Message.Role.ASSISTANT,
            status=Message.Status.QUEUED,
            updated_at__lte=now - timedelta(seconds=after_s),
        )
        .order_by("id")
        .values_list("id", "created_at", "updated_at")[:limit]
    )
    redispatched = []
    for message_id, created_at, updated_at in candidates:
        if now - updated_at < (now - created_at) / 2:
            continue
        with transaction.atomic():
            if not Message.objects.filter(
                pk=message_id, status=Message.Status.QUEUED, updated_at=updated_at
            ).update(updated_at=now):
                continue  # claimed, stopped, or re-dispatched by another reaper meanwhile
            reply_dispatch(
                message=Message.objects.select_related("conversation__owner__tier").get(pk=message_id)
            )
        redispatched.append(message_id)
    return redispatched


def reap_interrupted(grace_s: float = broadcast.LEASE_TTL_S) -> list[int]:
    """Mark replies whose worker died as ``interrupted`` (:func:`generations_reap_interrupted`), then
    re-dispatch queued replies that no broker message may deliver (:func:`generations_redispatch_queued`).
    Returns the ids marked interrupted. ``grace_s``: seconds a streaming reply without a lease is left
    alone after its last update."""
    reaped = generations_reap_interrupted(grace_s=grace_s, recheck_s=broadcast.LEASE_RECHECK_S)
    if reaped:
        logger.warning("marked %d reply(ies) interrupted: %s", len(reaped), reaped)
    redispatched = generations_redispatch_queued()
    if redispatched:
        logger.warning("re-dispatched %d queued reply(ies): %s", len(redispatched), redispatched)
    return reaped
