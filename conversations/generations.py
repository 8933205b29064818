"""The life of a generated reply, from the user's request to its final stored text.

Web side: :func:`reply_request`, :func:`reply_regenerate`, :func:`reply_edit`, :func:`reply_continue`,
:func:`reply_cancel` (called by the consumer). Regenerate and edit add branches (``conversations.branches``).
Worker side: :func:`generation_start`, :func:`generation_history`, :func:`generation_set_context`,
:func:`generation_finish` (called by ``inference/adapter.py``) and :func:`generations_reap_interrupted`.

An assistant message moves ``queued -> streaming -> completed | cancelled | failed | interrupted``. Its
text is written once, by :func:`generation_finish`; conditional UPDATEs (``WHERE status = ...``) settle
races between Stop, the worker and the reaper without locks held across a generation.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.quota import quota_settle
from billing.services import usage_record_create
from conversations import branches, broadcast, recall, token_budget
from conversations.admission import (
    Admission,
    AdmissionRefused,
    admission_check,
    load_gate,
    model_choice,
    prompt_tokens_upper_bound,
)
from conversations.models import Conversation, Message
from conversations.selectors import conversation_get_for_user, message_get_for_user
from conversations.services import (
    conversation_create,
    conversation_set_model,
    message_create,
    title_from_content,
)
from inference.registry import declare_queue, models_for_tier, queue_for, task_priority
from observability import tracing
from observability.logs import current_field

GENERATE_TASK = "inference.generate_reply"


class GenerationError(Exception):
    """A reply request that cannot be served; ``code`` is a protocol error code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ReplyTicket:
    """What the consumer tells the browser after a request was admitted."""

    message: Message
    user_message_id: int | None
    position: int
    notice: str = ""
    #: True when a resent ``send`` (same ``client_id``) found the ticket stored by the first one.
    duplicate: bool = False


def _ticket(assistant: Message, *, user_message_id: int | None, admission: Admission) -> ReplyTicket:
    """The ticket of a newly queued reply: its place in line and any routing notice for the user."""
    return ReplyTicket(
        message=assistant,
        user_message_id=user_message_id,
        position=queue_position(message=assistant),
        notice=_notice(admission),
    )


def _notice(admission: Admission) -> str:
    if not admission.degraded:
        return ""
    return f"The service is busy, so this reply comes from the lighter model {admission.model_name}."


def queue_position(*, message: Message) -> int:
    """1-based place in line among queued replies for the same model (approximate: replies of a higher tier
    priority and older replies of the same priority are ahead, as in the broker's priority queue)."""
    priority = message.conversation.owner.tier.queue_priority
    ahead = Message.objects.filter(
        role=Message.Role.ASSISTANT, status=Message.Status.QUEUED, model_name=message.model_name
    )
    return (
        ahead.filter(conversation__owner__tier__queue_priority__gt=priority).count()
        + ahead.filter(conversation__owner__tier__queue_priority=priority, id__lte=message.id).count()
    )


def _dispatch(message: Message) -> None:
    """Send the generation task after commit to the model's queue with the tier's priority; under a
    blue-green rollout the reply is pinned to a version's queue and records that version."""
    from observability.rollout import route_for

    if message.model_version:  # a re-dispatch keeps the version the reply was pinned to
        queue, version = declare_queue(queue_for(message.model_name, message.model_version)), ""
    else:
        queue, version = route_for(
            model_name=message.model_name, message_id=message.id, default_queue=queue_for(message.model_name)
        )
    if version:
        message.model_version = version
        message.save(update_fields=["model_version", "updated_at"])
    priority = task_priority(message.conversation.owner.tier.queue_priority)
    # The web request's id rides in the task headers so the worker's log lines carry it too.
    headers = {"request_id": current_field("request_id")}
    transaction.on_commit(
        lambda: current_app.send_task(
            GENERATE_TASK, args=[message.id], queue=queue, priority=priority, headers=headers
        )
    )


def _admit(*, user, prompt_tokens_bound: int | None = None, model_name: str | None = None) -> Admission:
    """``admission_check`` with its outcome counted (metrics by tier and reason, fleet-wide refusals).
    Returns the :class:`Admission` (the model routed to, the quota reservation to attach to the reply);
    ``model_name`` is the model a client named (the API), see ``admission.route``."""
    from observability import metrics, refusals, tracing

    tier = user.tier.name
    with tracing.span("admission", tier=tier):
        try:
            admission = admission_check(
                user=user, prompt_tokens_bound=prompt_tokens_bound, model_name=model_name
            )
        except AdmissionRefused as exc:
            metrics.observe_admission(tier=tier, refused_code=exc.code)
            refusals.refusal_record(tier=tier, reason=exc.code)
            raise
    metrics.observe_admission(tier=tier)
    return admission


def _chosen_model(*, user, conversation: Conversation, model: str | None) -> str:
    """The model for a reply in ``conversation``: ``model`` from the frame when given (validated against
    the tier's models, then remembered on the conversation; "" = the tier's routing), else the
    conversation's remembered choice while the tier still offers it. Raises
    ``AdmissionRefused("model_not_found")`` for a model the tier may not use."""
    if model is not None:
        conversation_set_model(
            conversation=conversation, model_name=model_choice(tier=user.tier, model_name=model)
        )
        return model
    if conversation.model_name in models_for_tier(user.tier):
        return conversation.model_name
    return ""


def _refuse_if_busy(conversation: Conversation) -> None:
    if conversation.messages.filter(role=Message.Role.ASSISTANT, status__in=Message.ACTIVE_STATUSES).exists():
        raise GenerationError(
            "too_many_generations", "A reply is still being generated in this conversation."
        )


def _queue_reply(*, conversation: Conversation, parent: Message, admission: Admission) -> Message:
    _refuse_if_busy(conversation)
    message = message_create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        content="",
        status=Message.Status.QUEUED,
        model_name=admission.model_name,
        parent=parent,
    )
    admission.attach(message)
    _dispatch(message)
    # Every other tab of the user shows the new branch (tab sync through the per-user group).
    broadcast.publish_to_user_on_commit(
        conversation.owner_id,
        broadcast.frame_conversation(
            kind="messages", conversation_id=conversation.id, title=conversation.title
        ),
    )
    return message


def _validate_content(*, user, content: str, system_prompt: str) -> str:
    content = (content or "").strip()
    if not content:
        raise GenerationError("invalid_request", "The message is empty.")
    if len(content) > settings.MAX_MESSAGE_CHARS:
        raise GenerationError(
            "invalid_request", f"The message is longer than {settings.MAX_MESSAGE_CHARS} characters."
        )
    too_long = token_budget.check_fits(tier=user.tier, system_prompt=system_prompt, content=content)
    if too_long is not None:
        raise GenerationError("context_too_long", too_long.message)
    return content


def _ticket_for_client_id(*, user, client_id) -> ReplyTicket | None:
    user_message = (
        Message.objects.filter(conversation__owner=user, role=Message.Role.USER, client_id=client_id)
        .select_related("conversation")
        .first()
    )
    if user_message is None:
        return None
    # The reply queued with it is its first assistant child (later ones are regenerated siblings).
    assistant = user_message.children.filter(role=Message.Role.ASSISTANT).order_by("id").first()
    if assistant is None:  # its reply was deleted since; the page already moved on
        raise GenerationError("invalid_request", "This message was already sent.")
    position = queue_position(message=assistant) if assistant.status == Message.Status.QUEUED else 0
    return ReplyTicket(message=assistant, user_message_id=user_message.id, position=position, duplicate=True)


def reply_request(
    *, user, conversation_id: int | None, content: str, client_id=None, model: str | None = None
) -> ReplyTicket:
    """Store the user's message and a queued assistant reply in one transaction and dispatch the generation
    task on commit. ``conversation_id`` None starts a new conversation titled from ``content``.

    ``client_id`` (a UUID chosen by the page, the idempotency key): when a user message with that key is
    already stored, nothing new is stored and its ticket comes back with ``duplicate=True``; the unique
    constraints settle two resends racing each other.

    ``model``: the model the user picked on the page, one of the tier's (``models_for_tier``); "" = the
    tier's routing; None = the conversation's remembered choice. A given ``model`` is remembered on the
    conversation for its later replies (see :func:`_chosen_model`).

    Raises ``GenerationError("invalid_request")`` for empty/too long content,
    ``GenerationError("context_too_long")`` when it cannot fit the plan's context (the real limit in tokens
    and words), ``ConversationNotFound``, ``AdmissionRefused`` (``model_not_found`` for a model the tier
    may not use; nothing stored in any case).
    """
    if not (content or "").strip():
        raise GenerationError("invalid_request", "The message is empty.")
    if client_id is not None:
        existing = _ticket_for_client_id(user=user, client_id=client_id)
        if existing is not None:
            return existing
    # Refuse a model the plan does not offer, and refuse under overload, before opening a transaction
    # (cached figures only).
    load_gate(tier=user.tier, model_name=model_choice(tier=user.tier, model_name=model or ""))
    try:
        with tracing.span("db.transaction"), transaction.atomic():
            if conversation_id is None:
                system_prompt = user.default_system_prompt
            else:
                conversation = conversation_get_for_user(user=user, conversation_id=conversation_id)
                system_prompt = conversation.system_prompt
            content = _validate_content(user=user, content=content, system_prompt=system_prompt)
            if conversation_id is None:
                conversation = conversation_create(
                    owner=user, title=title_from_content(content), client_id=client_id
                )
            admission = _admit(
                user=user,
                prompt_tokens_bound=prompt_tokens_upper_bound(conversation=conversation, new_content=content),
                model_name=_chosen_model(user=user, conversation=conversation, model=model),
            )
            user_message = message_create(
                conversation=conversation, role=Message.Role.USER, content=content, client_id=client_id
            )
            assistant = _queue_reply(conversation=conversation, parent=user_message, admission=admission)
    except IntegrityError:
        existing = _ticket_for_client_id(user=user, client_id=client_id) if client_id is not None else None
        if existing is None:
            raise
        return existing
    return _ticket(assistant, user_message_id=user_message.id, admission=admission)


def reply_regenerate(*, user, conversation_id: int, model: str | None = None) -> ReplyTicket:
    """Answer the active branch's last user message again: a new queued reply becomes a sibling of the
    last reply (finished in any state), which is kept to flip back to; when the branch ends with a user
    message that has no reply, queue one for it. ``model`` as for :func:`reply_request`.

    Raises ``GenerationError`` when there is nothing to answer or a reply is still active,
    ``AdmissionRefused``.
    """
    with tracing.span("db.transaction"), transaction.atomic():
        conversation = conversation_get_for_user(user=user, conversation_id=conversation_id)
        newest = conversation.active_leaf
        if newest is None or newest.role not in (Message.Role.USER, Message.Role.ASSISTANT):
            raise GenerationError("invalid_request", "There is no reply to regenerate.")
        if newest.is_active:
            raise GenerationError(
                "too_many_generations", "A reply is still being generated in this conversation."
            )
        parent = newest if newest.role == Message.Role.USER else newest.parent
        if parent is None:
            raise GenerationError("invalid_request", "There is no message to answer.")
        admission = _admit(
            user=user,
            prompt_tokens_bound=prompt_tokens_upper_bound(conversation=conversation),
            model_name=_chosen_model(user=user, conversation=conversation, model=model),
        )
        assistant = _queue_reply(conversation=conversation, parent=parent, admission=admission)
    return _ticket(assistant, user_message_id=None, admission=admission)


def reply_edit(*, user, message_id: int, content: str, model: str | None = None) -> ReplyTicket:
    """Edit a sent user message: a new user message with ``content`` becomes a sibling of it (same parent),
    gets a new queued reply, and their branch becomes the active one; the old branch is kept. ``model`` as
    for :func:`reply_request`.

    Raises ``MessageNotFound``, ``GenerationError`` (not a user message, bad content, a reply still
    active), ``AdmissionRefused``; nothing is stored then.
    """
    with transaction.atomic():
        original = message_get_for_user(user=user, message_id=message_id)
        if original.role != Message.Role.USER:
            raise GenerationError("invalid_request", "Only your own messages can be edited.")
        conversation = original.conversation
        content = _validate_content(user=user, content=content, system_prompt=conversation.system_prompt)
        _refuse_if_busy(conversation)
        admission = _admit(
            user=user,
            prompt_tokens_bound=prompt_tokens_upper_bound(conversation=conversation, new_content=content),
            model_name=_chosen_model(user=user, conversation=conversation, model=model),
        )
        edited = message_create(
            conversation=conversation, role=Message.Role.USER, content=content, parent=original.parent
        )
        assistant = _queue_reply(conversation=conversation, parent=edited, admission=admission)
    return _ticket(assistant, user_message_id=edited.id, admission=admission)


def reply_continue(*, user, message_id: int) -> ReplyTicket:
    """Continue a reply that stopped at the length limit (``finish_reason == "length"``) and is the
    active leaf: a new queued reply follows it, with the cut reply as the last turn of its context, on the
    conversation's chosen model.

    Raises ``MessageNotFound``, ``GenerationError`` (not a cut-off last reply), ``AdmissionRefused``.
    """
    with transaction.atomic():
        cut = message_get_for_user(user=user, message_id=message_id)
        conversation = cut.conversation
        if cut.role != Message.Role.ASSISTANT or cut.finish_reason != "length":
            raise GenerationError(
                "invalid_request", "Only a reply cut off at the length limit can be continued."
            )
        if conversation.active_leaf_id != cut.pk:
            raise GenerationError("invalid_request", "Only the last reply can be continued.")
        admission = _admit(
            user=user,
            prompt_tokens_bound=prompt_tokens_upper_bound(conversation=conversation),
            model_name=_chosen_model(user=user, conversation=conversation, model=None),
        )
        assistant = _queue_reply(conversation=conversation, parent=cut, admission=admission)
    return _ticket(assistant, user_message_id=None, admission=admission)


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


# --- worker side ---------------------------------------------------------------------------------------------


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


def generation_history(*, message: Message) -> tuple[str, list[dict[str, str]]]:
    """``(system_prompt, turns)`` preceding ``message`` on its own branch (its ancestors; other branches
    are never included), oldest first, as chat-template dicts. Replies that ended with no text (failed,
    cancelled before any token) are left out."""
    earlier = branches.ancestors(message=message)
    turns = [
        {"role": m.role, "content": m.content}
        for m in earlier
        if m.content and m.role in (Message.Role.USER, Message.Role.ASSISTANT)
    ]
    return message.conversation.system_prompt, turns


def generation_set_context(*, message: Message, omitted: int, prompt_tokens: int) -> None:
    """Record how many older turns the window left out and the prompt's size in tokens."""
    message.omitted_messages = omitted
    message.prompt_tokens = prompt_tokens
    message.save(update_fields=["omitted_messages", "prompt_tokens", "updated_at"])


def _storable(text: str) -> str:
    """Generated ``text`` as PostgreSQL can store it: a model may sample a token that decodes to NUL
    (byte-fallback vocabularies do), which a text column refuses and which would lose the whole reply;
    it is stored as U+FFFD, the replacement character. (User input with NUL is refused at the door.)"""
    return text.replace("\x00", "\ufffd")


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
) -> Message:
    """Write the reply's final state once, record usage for billing, and publish ``done`` after commit.
    Only a ``streaming`` or ``interrupted`` (reaped too early) reply is written; returns the stored message."""
    with transaction.atomic():
        updated = Message.objects.filter(
            pk=message.pk, status__in=[Message.Status.STREAMING, Message.Status.INTERRUPTED]
        ).update(
            status=status,
            content=_storable(text),
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
        if updated and status == Message.Status.COMPLETED:
            recall.turn_remember(message=message)  # indexed for memory; embedded after commit
        broadcast.publish_on_commit(message.id, broadcast.frame_done(message=message))
        if updated and not message.conversation.stored:
            # An API completion without ``store: true`` (conversations/completions.py): the done frame above
            # carries its result; the usage record stays, its message link cleared.
            message.conversation.delete()
    return message


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
                content=_storable(broadcast.stream_text(message_id)),
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
    since only one ``queued -> streaming`` claim (:func:`generation_start`) can succeed. Several reapers
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
            _dispatch(Message.objects.select_related("conversation__owner__tier").get(pk=message_id))
        redispatched.append(message_id)
    return redispatched
