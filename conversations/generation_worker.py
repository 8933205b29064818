"""The worker side of a generated reply, called by ``conversations/reply_runner.py``: claim a queued reply
(:func:`generation_start`), read its branch (:func:`generation_branch`), record its context
(:func:`generation_set_context`) and write its final state once (:func:`generation_finish`).
"""

from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from billing.quota import quota_settle
from billing.services import usage_record_create
from conversations import branches, recall
from conversations.models import Message
from database.storable_text import storable_text
from documents.selectors import citations_for_messages
from events import broadcast


def generation_start(*, message_id: int, trace_id: str = "", model_version: str = "") -> Message | None:
    """Claim a queued reply for generation (``queued -> streaming``), recording the trace id and the model
    version of the worker that generates it. None when it is no longer queued (cancelled meanwhile, or a
    redelivered task whose reply already ended)."""
    claimed = Message.objects.filter(pk=message_id, status=Message.Status.QUEUED).update(
        status=Message.Status.STREAMING,
        updated_at=timezone.now(),
        trace_id=trace_id,
        model_version=model_version,
    )
    if not claimed:
        return None
    return Message.objects.select_related("conversation__owner__tier").get(pk=message_id)


def generation_requeue(*, message: Message) -> bool:
    """Give a claimed reply that produced no text back to the queue (``streaming -> queued``), for a worker
    whose engine died before its first token: the broker redelivers its task to a live worker, which claims it
    again. Returns whether it was still ``streaming``."""
    return bool(
        Message.objects.filter(pk=message.pk, status=Message.Status.STREAMING).update(
            status=Message.Status.QUEUED, updated_at=timezone.now()
        )
    )


def generation_branch(*, message: Message) -> tuple[str, list[dict[str, str]], list[int]]:
    """``(system_prompt, turns, turn_ids)`` preceding ``message`` on its own branch (its ancestors; other
    branches are never included), oldest first: ``turns`` as chat-template dicts and ``turn_ids`` the message
    id of each (same order, same length; what memory's recall excludes as already inside the window), from one
    read of the branch. Replies that ended with no text (failed, cancelled before any token, blocked) and user
    messages the content policy blocked are left out."""
    earlier = [
        m
        for m in branches.ancestors(message=message)
        if m.content
        and m.role in (Message.Role.USER, Message.Role.ASSISTANT)
        and m.status != Message.Status.BLOCKED
    ]
    turns = [{"role": m.role, "content": m.content} for m in earlier]
    return message.conversation.system_prompt, turns, [m.id for m in earlier]


def generation_set_context(*, message: Message, omitted: int, prompt_tokens: int) -> None:
    """Record how many older turns the window left out and the prompt's size in tokens."""
    message.omitted_messages = omitted
    message.prompt_tokens = prompt_tokens
    message.save(update_fields=["omitted_messages", "prompt_tokens", "updated_at"])


def generation_finish(
    *,
    message: Message,
    status: str,
    text: str,
    finish_reason: str = "",
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    ttft_ms: int | None = None,
    duration_ms: int | None = None,
    error: str = "",
    on_written: Callable[[], object] | None = None,
) -> Message:
    """Write the reply's final state once, record usage for billing, and publish ``done`` after commit.
    Only a ``streaming`` or ``interrupted`` (reaped too early) reply is written; returns the stored message.
    ``on_written`` runs inside the transaction when the write happened (the reply runner stores the output
    moderation verdict there)."""
    with transaction.atomic():
        updated = Message.objects.filter(
            pk=message.pk, status__in=[Message.Status.STREAMING, Message.Status.INTERRUPTED]
        ).update(
            status=status,
            content=storable_text(text),
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            ttft_ms=ttft_ms,
            duration_ms=duration_ms,
            error=error,
            updated_at=timezone.now(),
        )
        message.refresh_from_db()
        if updated and (prompt_tokens or completion_tokens):
            usage_record_create(
                user=message.conversation.owner,
                message=message,
                model_name=message.model_name,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
        if updated:  # release the quota reserved at admission; charge the real count
            quota_settle(message=message, used_tokens=prompt_tokens + completion_tokens)
        if updated and on_written is not None:
            on_written()
        if updated and status == Message.Status.COMPLETED:
            recall.turn_remember(message=message)  # indexed for memory; embedded after commit
        done = broadcast.frame_done(message=message)
        cited = citations_for_messages(message_ids=[message.id]).get(message.id)
        if cited:  # the passages of the conversation's files this reply was given (chips on the page)
            done["citations"] = cited
        broadcast.publish_on_commit(message.id, done)
        if updated and not message.conversation.stored:
            # An API completion without ``store: true`` (conversations/completions.py): the done frame above
            # carries its result; the usage record stays, its message link cleared.
            message.conversation.delete()
    return message
