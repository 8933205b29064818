"""The life of a generated reply on the web side, from the user's request to a queued reply.

:func:`reply_request`, :func:`reply_regenerate`, :func:`reply_edit`, :func:`reply_continue` (called by the
consumer); Stop and resume: ``conversations/reply_control.py``. Regenerate and edit add branches
(``conversations.branches``). Admission and dispatch: ``conversations/reply_dispatch.py``; the worker side
(claim, context, final write): ``conversations/generation_worker.py``; the reaper:
``conversations/reaper.py``; the tickets they answer with, and a send's idempotency key:
``conversations/tickets.py``.

An assistant message moves ``queued -> streaming -> completed | cancelled | failed | interrupted``. Its
text is written once, by ``generation_worker.generation_finish``; conditional UPDATEs (``WHERE status =
...``) settle races between Stop, the worker and the reaper without locks held across a generation.

Lock order: a service that stores a reply in a stored conversation reads that conversation with its row
lock first (``conversation_get_for_user(for_update=True)``), then checks that no reply of it is active, then
reserves the quota (the user's quota row). Every such service takes them in this order, so two of them on
one conversation (a send and a regeneration from two tabs) queue for the first lock instead of each holding
the lock the other waits for; the worker's final write takes the quota row while its reply is still active,
which the busy check refuses before any quota is touched.
"""

from django.conf import settings
from django.db import IntegrityError, transaction

from conversations import moderation, recall, token_budget
from conversations.admission import (
    NO_MESSAGES,
    Admission,
    AdmissionRefused,
    ConversationTotals,
    conversation_totals,
    load_gate,
    model_choice,
    prompt_tokens_upper_bound,
)
from conversations.models import Conversation, Message
from conversations.reply_dispatch import reply_admit, reply_dispatch
from conversations.selectors import conversation_get_for_user, message_get_for_user
from conversations.services import (
    APPEND,
    conversation_create,
    conversation_new,
    conversation_set_model,
    message_chain_create,
    message_create,
    title_from_content,
)
from conversations.tickets import (
    GenerationError,
    ReplyTicket,
    stored_ticket,
    ticket_for_client_id,
    ticket_for_queued,
)
from events import broadcast
from inference.registry import models_for_tier
from observability import tracing


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


def _totals_if_free(conversation: Conversation) -> ConversationTotals:
    """``conversation``'s totals for the prompt bound (:func:`conversations.admission.conversation_totals`),
    read under its row lock, which the caller holds. Raises ``GenerationError("too_many_generations")``
    while a reply of it is queued or streaming: the busy check of every reply-creating service, in the same
    round trip."""
    totals = conversation_totals(conversation=conversation)
    if totals.active_replies:
        raise GenerationError(
            "too_many_generations", "A reply is still being generated in this conversation."
        )
    return totals


def _queued_reply_fields(admission: Admission) -> dict:
    """The field values of a queued reply admitted with ``admission``, for ``message_chain_create``."""
    return {
        "role": Message.Role.ASSISTANT,
        "status": Message.Status.QUEUED,
        "model_name": admission.model_name,
    }


def _queue_reply(
    *, conversation: Conversation, parent: Message, admission: Admission, conversation_locked=False
) -> Message:
    """Store and dispatch a queued reply to ``parent``; the caller checked, under the conversation's row
    lock, that no other reply of it is active (:func:`_totals_if_free`) and admitted it (``admission``)."""
    (message,) = message_chain_create(
        conversation=conversation,
        messages=[_queued_reply_fields(admission)],
        parent=parent,
        conversation_locked=conversation_locked,  # the caller stored ``parent`` in this transaction
        attached=[(admission.reservation_row(), 0)],  # its quota reservation, if any (lever 28)
    )
    _reply_queued(conversation=conversation, message=message, parent=parent)
    return message


def _reply_queued(
    *,
    conversation: Conversation,
    message: Message,
    parent: Message,
    question_prefetch_settled: bool = False,
) -> None:
    """After a queued reply ``message`` to ``parent`` is stored with its reservation: dispatch it on commit, ask
    for its question's vector (unless the caller ``question_prefetch_settled``), show its branch in other tabs."""
    reply_dispatch(message=message)
    if conversation.stored and not question_prefetch_settled:
        recall.question_prefetch(
            user=conversation.owner, conversation_id=conversation.id, question=parent.content
        )
    # Every other tab of the user shows the new branch (tab sync through the per-user group).
    broadcast.publish_to_user_on_commit(
        conversation.owner_id,
        broadcast.frame_conversation(
            kind="messages", conversation_id=conversation.id, title=conversation.title
        ),
    )


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


def reply_request(
    *,
    user,
    conversation_id: int | None,
    content: str,
    client_id=None,
    model: str | None = None,
    resend: bool = True,
) -> ReplyTicket:
    """Store the user's message and a queued assistant reply in one transaction and dispatch the generation
    task on commit. ``conversation_id`` None starts a new conversation titled from ``content``.

    ``client_id`` (a UUID chosen by the page, the idempotency key): when a user message with that key is
    already stored, nothing new is stored and its ticket comes back with ``duplicate=True``; the unique
    constraints settle two resends racing each other. Only a ``resend`` (the protocol's) is looked up first;
    a first send meeting a stored key gets its ticket from the constraint's error (docs/overhead-levers.md, lever 16).

    ``model``: the model the user picked on the page, one of the tier's (``models_for_tier``); "" = the
    tier's routing; None = the conversation's remembered choice. A given ``model`` is remembered on the
    conversation for its later replies (see :func:`_chosen_model`).

    Raises ``GenerationError("invalid_request")`` for empty/too long content,
    ``GenerationError("context_too_long")`` when it cannot fit the plan's context (the real limit in tokens
    and words), ``ConversationNotFound``, ``AdmissionRefused`` (``model_not_found`` for a model the tier
    may not use; nothing stored in any case), ``moderation.ContentBlocked`` when the input chain blocks it
    (checked before admission: the message is stored as ``blocked``, no reply, nothing reserved).
    """
    if not (content or "").strip():
        raise GenerationError("invalid_request", "The message is empty.")
    if client_id is not None and resend:
        existing = ticket_for_client_id(user=user, client_id=client_id)
        if existing is not None:
            return existing
    verdict = moderation.input_check(user=user, text=content.strip())
    if verdict.blocked:
        fields = {"conversation_id": conversation_id, "content": content, "client_id": client_id}
        try:
            raise _store_blocked(user=user, verdict=verdict, **fields)  # the ContentBlocked to answer with
        except IntegrityError as exc:
            return stored_ticket(user=user, client_id=client_id, error=exc)
    # A model the plan does not offer, and overload, are refused before the transaction (cached figures only).
    load_gate(tier=user.tier, model_name=model_choice(tier=user.tier, model_name=model or ""))
    # The question's vector for recall, asked for now (if anything reads it): the embedding overlaps the commit.
    recall.question_prefetch(
        user=user, conversation_id=conversation_id, question=content.strip(), at_once=True
    )
    try:
        with tracing.span("db.transaction"), transaction.atomic():
            conversation, content = _conversation_for_send(
                user=user, conversation_id=conversation_id, content=content, client_id=client_id, unsaved=True
            )
            # A new conversation holds no message and no other transaction sees it: no bound to sum, no busy
            # check (lever 16). A stored one was read with its row lock: one aggregate does both (lever 18).
            new = conversation_id is None
            totals = NO_MESSAGES if new else _totals_if_free(conversation)
            bound = prompt_tokens_upper_bound(conversation=conversation, new_content=content, totals=totals)
            admission = reply_admit(
                user=user,
                prompt_tokens_bound=bound,
                model_name=_chosen_model(user=user, conversation=conversation, model=model),
            )
            # One statement: message, reply, verdict, reservation and a new conversation (levers 20, 28, 47).
            user_message, assistant = message_chain_create(
                conversation=conversation,
                messages=[
                    {"role": Message.Role.USER, "content": content, "client_id": client_id},
                    _queued_reply_fields(admission),
                ],
                parent=None if new else APPEND,
                conversation_locked=True,  # created here, or read with its row lock above
                attached=[
                    (moderation.input_row(verdict=verdict, user=user, text=content), 0),
                    (admission.reservation_row(), 1),  # None when nothing was reserved
                ],
            )
            _reply_queued(
                conversation=conversation,
                message=assistant,
                parent=user_message,
                question_prefetch_settled=True,
            )
    except (IntegrityError, AdmissionRefused) as exc:
        # Its key taken; or refused by admission before a new conversation's key met its constraint (lever 47).
        return stored_ticket(user=user, client_id=client_id, error=exc)
    return ticket_for_queued(assistant, user_message_id=user_message.id, admission=admission)


def _conversation_for_send(*, user, conversation_id: int | None, content: str, client_id, unsaved=False):
    """``(conversation, content)`` for a message being sent, inside the caller's transaction: the user's
    conversation read with its row lock (the access function; raises as it does), or a new one titled from
    ``content`` when ``conversation_id`` is None, made only once ``content`` passed ``_validate_content``
    (which raises for a message too long for the plan); ``unsaved``: left for the message chain to store."""
    if conversation_id is None:
        conversation, system_prompt = None, user.default_system_prompt
    else:
        conversation = conversation_get_for_user(user=user, conversation_id=conversation_id, for_update=True)
        system_prompt = conversation.system_prompt
    content = _validate_content(user=user, content=content, system_prompt=system_prompt)
    if conversation is None:
        made = conversation_new if unsaved else conversation_create  # lever 47: the chain stores a new one
        conversation = made(owner=user, title=title_from_content(content), client_id=client_id)
    return conversation, content


def _store_blocked(*, user, verdict, conversation_id: int | None, content: str, client_id) -> Exception:
    """Store a message the input chain blocked (a new conversation when ``conversation_id`` is None) and
    return the ``ContentBlocked`` to raise; a too long message is refused as any other."""
    with transaction.atomic():
        conversation, content = _conversation_for_send(
            user=user, conversation_id=conversation_id, content=content, client_id=client_id
        )
        return moderation.blocked_input_store(
            verdict=verdict, user=user, conversation=conversation, content=content, client_id=client_id
        )


def reply_regenerate(*, user, conversation_id: int, model: str | None = None) -> ReplyTicket:
    """Answer the active branch's last user message again: a new queued reply becomes a sibling of the
    last reply (finished in any state), which is kept to flip back to; when the branch ends with a user
    message that has no reply, queue one for it. ``model`` as for :func:`reply_request`.

    Raises ``GenerationError`` when there is nothing to answer or a reply is still active,
    ``AdmissionRefused``.
    """
    with tracing.span("db.transaction"), transaction.atomic():
        conversation = conversation_get_for_user(user=user, conversation_id=conversation_id, for_update=True)
        newest = conversation.active_leaf
        if newest is None or newest.role not in (Message.Role.USER, Message.Role.ASSISTANT):
            raise GenerationError("invalid_request", "There is no reply to regenerate.")
        totals = _totals_if_free(conversation)
        parent = newest if newest.role == Message.Role.USER else newest.parent
        if parent is None:
            raise GenerationError("invalid_request", "There is no message to answer.")
        if parent.status == Message.Status.BLOCKED:
            raise GenerationError(
                "content_policy", "This message was blocked by the content policy; edit it instead."
            )
        admission = reply_admit(
            user=user,
            prompt_tokens_bound=prompt_tokens_upper_bound(conversation=conversation, totals=totals),
            model_name=_chosen_model(user=user, conversation=conversation, model=model),
        )
        assistant = _queue_reply(
            conversation=conversation, parent=parent, admission=admission, conversation_locked=True
        )
    return ticket_for_queued(assistant, user_message_id=None, admission=admission)


def reply_edit(*, user, message_id: int, content: str, model: str | None = None) -> ReplyTicket:
    """Edit a sent user message: a new user message with ``content`` becomes a sibling of it (same parent),
    gets a new queued reply, and their branch becomes the active one; the old branch is kept. ``model`` as
    for :func:`reply_request`.

    Raises ``MessageNotFound``, ``GenerationError`` (not a user message, bad content, a reply still
    active), ``AdmissionRefused``; nothing is stored then. ``moderation.ContentBlocked`` when the input chain
    blocks the new text (stored as a ``blocked`` sibling, no reply).
    """
    with transaction.atomic():
        original = message_get_for_user(user=user, message_id=message_id)
        if original.role != Message.Role.USER:
            raise GenerationError("invalid_request", "Only your own messages can be edited.")
        conversation = conversation_get_for_user(
            user=user, conversation_id=original.conversation_id, for_update=True
        )
        content = _validate_content(user=user, content=content, system_prompt=conversation.system_prompt)
        totals = _totals_if_free(conversation)
        verdict = moderation.input_check(user=user, text=content)
        if verdict.blocked:  # stored as a blocked sibling and committed; raised below, outside the block
            blocked = moderation.blocked_input_store(
                verdict=verdict, user=user, conversation=conversation, content=content, parent=original.parent
            )
        else:
            admission = reply_admit(
                user=user,
                prompt_tokens_bound=prompt_tokens_upper_bound(
                    conversation=conversation, new_content=content, totals=totals
                ),
                model_name=_chosen_model(user=user, conversation=conversation, model=model),
            )
            edited = message_create(
                conversation=conversation,
                role=Message.Role.USER,
                content=content,
                parent=original.parent,
                conversation_locked=True,
            )
            moderation.input_record(verdict=verdict, user=user, message=edited, text=content)
            assistant = _queue_reply(
                conversation=conversation, parent=edited, admission=admission, conversation_locked=True
            )
    if verdict.blocked:
        raise blocked
    return ticket_for_queued(assistant, user_message_id=edited.id, admission=admission)


def reply_continue(*, user, message_id: int) -> ReplyTicket:
    """Continue a reply that stopped at the length limit (``finish_reason == "length"``) and is the
    active leaf: a new queued reply follows it, with the cut reply as the last turn of its context, on the
    conversation's chosen model.

    Raises ``MessageNotFound``, ``GenerationError`` (not a cut-off last reply), ``AdmissionRefused``.
    """
    with transaction.atomic():
        cut = message_get_for_user(user=user, message_id=message_id)
        conversation = conversation_get_for_user(
            user=user, conversation_id=cut.conversation_id, for_update=True
        )
        if cut.role != Message.Role.ASSISTANT or cut.finish_reason != "length":
            raise GenerationError(
                "invalid_request", "Only a reply cut off at the length limit can be continued."
            )
        if conversation.active_leaf_id != cut.pk:
            raise GenerationError("invalid_request", "Only the last reply can be continued.")
        totals = _totals_if_free(conversation)
        admission = reply_admit(
            user=user,
            prompt_tokens_bound=prompt_tokens_upper_bound(conversation=conversation, totals=totals),
            model_name=_chosen_model(user=user, conversation=conversation, model=None),
        )
        assistant = _queue_reply(
            conversation=conversation, parent=cut, admission=admission, conversation_locked=True
        )
    return ticket_for_queued(assistant, user_message_id=None, admission=admission)
