"""Writes to conversations and messages (keyword-only, ``<entity>_<verb>``)."""

from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone

from billing.quota import quota_settle
from conversations.message_chain import chain_insert
from conversations.models import Conversation, Message
from database.sql import insert_instance
from events import broadcast

TITLE_MAX_CHARS = 60


class _Append:
    """Sentinel: ``message_create`` without ``parent`` appends to the active leaf."""


APPEND = _Append()
SYSTEM_PROMPT_MAX_CHARS = 4000


def conversation_create(
    *, owner, title: str = "", system_prompt: str | None = None, client_id=None
) -> Conversation:
    """A new conversation of ``owner``; ``title`` is stripped and cut to 200 characters. ``system_prompt``
    None takes the owner's default system prompt (profile). ``client_id``: the idempotency key of the
    ``send`` that starts it (unique per owner; raises IntegrityError when taken)."""
    # A fixed insert (lever 27).
    return insert_instance(
        conversation_new(owner=owner, title=title, system_prompt=system_prompt, client_id=client_id)
    )


def conversation_new(
    *, owner, title: str = "", system_prompt: str | None = None, client_id=None, stored: bool = True
) -> Conversation:
    """An unsaved conversation of ``owner`` as :func:`conversation_create` stores it (``stored`` False: an API
    completion kept out of the sidebar), for ``message_chain_create`` to insert with its first messages in one
    statement (docs/overhead-levers.md, lever 47): every new chat and every API completion starts so."""
    if system_prompt is None:
        system_prompt = getattr(owner, "default_system_prompt", "") or ""
    return Conversation(
        owner=owner,
        title=title.strip()[:200],
        system_prompt=system_prompt,
        client_id=client_id,
        stored=stored,
    )


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    """Set a new title (stripped, at most 200 characters). Raises ValueError for an empty title.
    The sidebar order (``updated_at``) is left alone: renaming is not activity."""
    title = title.strip()
    if not title:
        raise ValueError("title must not be empty")
    conversation.title = title[:200]
    Conversation.objects.filter(pk=conversation.pk).update(title=conversation.title)
    return conversation


def conversation_set_system_prompt(*, conversation: Conversation, system_prompt: str) -> Conversation:
    """Replace the conversation's system prompt (pinned at the head of every later reply's context).
    Raises ValueError beyond ``SYSTEM_PROMPT_MAX_CHARS`` characters."""
    system_prompt = system_prompt.strip()
    if len(system_prompt) > SYSTEM_PROMPT_MAX_CHARS:
        raise ValueError(f"the system prompt is longer than {SYSTEM_PROMPT_MAX_CHARS} characters")
    conversation.system_prompt = system_prompt
    Conversation.objects.filter(pk=conversation.pk).update(system_prompt=system_prompt)
    return conversation


def conversation_set_model(*, conversation: Conversation, model_name: str) -> Conversation:
    """Remember the model the user picked for this conversation's replies ("" = the tier's routing). The
    caller has checked that the user's tier may use it (``admission.model_choice``). The sidebar order is
    left alone."""
    if conversation.model_name != model_name:
        conversation.model_name = model_name
        if conversation.pk is not None:  # an unsaved one (``conversation_new``) is stored with the choice
            Conversation.objects.filter(pk=conversation.pk).update(model_name=model_name)
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    """Delete a conversation and its messages (usage records keep their counts; their message link is cleared).

    A reply still queued or streaming in it is stopped as Stop stops one: its quota reservation is released
    in the deletion's transaction (the reservation row goes with the message, and the day's held tokens would
    otherwise stay held until the day ends), and once the deletion is committed its worker is asked to cancel
    (``broadcast.request_cancel_on_commit``), so the engine frees the reply's slot within one decode step
    instead of generating to the reply limit. The worker then charges the tokens it did generate to the owner's
    day (``generation_worker.generation_finish``), as for any stopped reply. Redis being unreachable after the
    commit leaves the deletion done; the reply then runs to its end and is charged the same way."""
    with transaction.atomic():
        # The conversation's row lock first, as a send takes it: a send storing a reply in it now is waited for
        # (and its reply seen below), and one that comes after finds the conversation gone.
        list(Conversation.objects.select_for_update().filter(pk=conversation.pk).values_list("pk"))
        active = list(
            Message.objects.filter(conversation=conversation, status__in=Message.ACTIVE_STATUSES).values_list(
                "id", flat=True
            )
        )
        for message_id in active:
            quota_settle(message=Message(id=message_id, conversation=conversation), used_tokens=0)
        conversation.delete()
        broadcast.request_cancel_on_commit(active)


def conversation_touch(*, conversation: Conversation) -> None:
    """Move a conversation to the top of its owner's sidebar."""
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now())


def title_from_content(content: str) -> str:
    """A sidebar title from the first user message: its first line, cut at a word near 60 characters."""
    line = content.strip().splitlines()[0] if content.strip() else "New chat"
    if len(line) <= TITLE_MAX_CHARS:
        return line
    return line[:TITLE_MAX_CHARS].rsplit(" ", 1)[0] + "…"


def message_create(
    *,
    conversation: Conversation,
    role: str,
    content: str,
    status: str = Message.Status.COMPLETED,
    model_name: str = "",
    parent: Message | None | _Append = APPEND,
    client_id=None,
    conversation_locked: bool = False,
    reply_follows: bool = False,
    fields: dict | None = None,
) -> Message:
    """Store a message as the new active leaf and move its conversation to the top of the sidebar.

    ``parent`` left out: the message follows the conversation's active leaf (a linear append, what callers
    that know nothing of branches want). ``parent=<Message>`` adds a child there (a new branch when it
    already has children); ``parent=None`` adds a root (a sibling of the first message). The parent's
    ``active_child`` and the conversation's ``active_leaf`` move to the new message. ``client_id``: a user
    message's idempotency key (unique per conversation; raises IntegrityError when taken).
    ``conversation_locked`` as for :func:`message_chain_create`.
    ``reply_follows``: the caller stores a child of this message in the same transaction right after, whose
    own ``message_create`` moves the conversation's leaf; this one leaves the conversation row alone
    (``conversation.active_leaf_id`` is still set in memory).
    ``fields``: more of the message's own fields, stored with its insert (an API reply's ``sampling``).
    """
    values = {"role": role, "content": content, "status": status, "model_name": model_name}
    (message,) = message_chain_create(
        conversation=conversation,
        messages=[{**values, "client_id": client_id, **(fields or {})}],
        parent=parent,
        conversation_locked=conversation_locked,
        moves_leaf=not reply_follows,
    )
    return message


def message_chain_create(
    *,
    conversation: Conversation,
    messages: Sequence[dict],
    parent: Message | None | _Append = APPEND,
    conversation_locked: bool = False,
    moves_leaf: bool = True,
    attached: Sequence[tuple[object, int]] = (),
) -> list[Message]:
    """Store ``messages`` (one dict of ``Message`` field values each: ``role``, ``content``, ``status``,
    ...) as a chain, each the parent of the next, in one SQL statement (``conversations.message_chain``,
    docs/overhead-levers.md lever 20): a send's user message and its queued reply, an API request's turns and
    reply. ``parent`` as for :func:`message_create` (the first message's parent); the parent's
    ``active_child`` moves to the first, and with ``moves_leaf`` the conversation's ``active_leaf`` to the
    last (and the conversation to the top of the sidebar). Returns the stored messages in chain order.

    ``conversation_locked``: the caller's transaction already holds the conversation's row lock (it read
    ``conversation`` with it, stored a message there just now, or created the conversation), so the lock is
    not taken again (one round trip less); with ``parent`` left out the chain follows
    ``conversation.active_leaf_id`` as the caller read it under that lock. ``attached``: rows of other models
    that point at a message of the chain, stored in the same statement (``chain_insert``). An unsaved
    ``conversation`` (:func:`conversation_new`) is stored by the same statement, its ``parent`` None. Raises
    ``ValueError`` for an empty chain, ``IntegrityError`` for a taken ``client_id``.
    """
    # No savepoint: every caller either runs it alone (then this is the transaction) or inside a transaction
    # of its own that it rolls back whole on any error, so a savepoint would be two round trips for nothing.
    with transaction.atomic(savepoint=False):
        if isinstance(parent, _Append) and conversation_locked:
            parent_id = conversation.active_leaf_id  # read under the caller's lock: current
        elif isinstance(parent, _Append):
            # Lock the conversation row: two appends at once must not both read the same leaf.
            parent_id = (
                Conversation.objects.select_for_update().only("id", "active_leaf").get(pk=conversation.pk)
            ).active_leaf_id
        else:
            if not conversation_locked:  # the leaf moves: one writer at a time, as for an append
                Conversation.objects.select_for_update().only("id").get(pk=conversation.pk)
            parent_id = parent.pk if parent is not None else None
        return chain_insert(
            conversation=conversation,
            messages=messages,
            parent_id=parent_id,
            moves_leaf=moves_leaf,
            attached=attached,
        )
