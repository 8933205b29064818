"""Stop and resume of a reply, as a tab asks for them: :func:`reply_cancel` (the Stop button, and an API client
that went away) and :func:`reply_for_resume` (a reloaded or reconnected tab). The reply's life from request to
queue is in ``conversations/generations.py``; the worker stops a streaming reply within one decode step once its
Stop flag is set (``events.broadcast.request_cancel``)."""

from django.utils import timezone

from billing.quota import quota_settle
from conversations.models import Message
from conversations.reaper import generations_reap_interrupted
from conversations.selectors import message_get_for_user
from events import broadcast


def reply_cancel(*, user, message_id: int) -> Message:
    """Stop a reply. A queued one becomes ``cancelled`` at once; a streaming one is cancelled by its worker
    within one decode step, keeping the partial text. A finished one is returned unchanged."""
    message = message_get_for_user(user=user, message_id=message_id)
    cancelled_now = Message.objects.filter(pk=message.pk, status=Message.Status.QUEUED).update(
        status=Message.Status.CANCELLED, finish_reason="cancelled", updated_at=timezone.now()
    )
    message.refresh_from_db()
    if cancelled_now:
        quota_settle(message=message, used_tokens=0)
        broadcast.publish_on_commit(message.id, broadcast.frame_done(message=message))
    elif message.status == Message.Status.STREAMING:
        broadcast.request_cancel(message.id)
    return message


def reply_for_resume(*, user, message_id: int) -> Message:
    """The reply a tab asks to resume, settled first if its worker died (lease gone) and no live worker's
    reaper has marked it yet, so a reload never shows a reply streaming forever."""
    message = message_get_for_user(user=user, message_id=message_id)
    if message.status == Message.Status.STREAMING and not broadcast.lease_alive(message.id):
        if generations_reap_interrupted(message_ids=[message.id], recheck_s=broadcast.LEASE_RECHECK_S):
            message.refresh_from_db()
    return message
