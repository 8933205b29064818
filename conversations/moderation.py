"""The content policy around a reply, on the conversation side: the input check before admission and the
storing of a blocked message. The guard chain itself is ``safety/`` (docs/safety.md); the output side runs
in the reply runner (``safety.streaming.OutputMonitor``).
"""

from __future__ import annotations

from dataclasses import dataclass

from conversations.models import Conversation, Message
from conversations.services import APPEND, message_create
from events import broadcast
from safety.chain import Verdict, chain_run
from safety.services import verdict_record, verdict_row

INPUT_BLOCKED_MESSAGE = (
    "This message was not sent: it was blocked by the content policy ({categories}). No reply was generated "
    "and nothing was charged."
)


@dataclass
class ContentBlocked(Exception):
    """A user's message refused by the content policy. ``message_id``: the stored blocked message (None when
    nothing was stored: an API request without ``store``); ``conversation_id`` likewise; ``categories``: the
    categories hit. The WebSocket answers ``error`` ``content_policy``; the API HTTP 400
    ``content_policy_violation``."""

    categories: list[str]
    message_id: int | None = None
    conversation_id: int | None = None
    title: str = ""

    code = "content_policy"

    def __str__(self) -> str:
        return INPUT_BLOCKED_MESSAGE.format(categories=", ".join(self.categories) or "policy")

    def frame(self) -> dict:
        """The WebSocket ``error`` frame (``docs/websocket-protocol.md``)."""
        return broadcast.frame_error(
            code=self.code,
            message=str(self),
            message_id=self.message_id,
            conversation_id=self.conversation_id,
        )


def input_check(*, user, text: str) -> Verdict:
    """The input chain on ``text`` under ``user``'s tier policy (``safety.chain.chain_run``): run before
    admission, so a blocked message reserves no quota and queues nothing."""
    return chain_run(text=text, stage="input", tier=user.tier, user_id=user.pk)


def input_row(*, verdict: Verdict, user, text: str):
    """The unsaved verdict row of an admitted user message (``verdict`` not blocked), its message not set:
    stored with the message in one statement (``message_chain_create(attached=...)``, docs/overhead.md
    lever 28). What :func:`input_record` stores for it."""
    if verdict.blocked:
        raise ValueError("a blocked verdict is stored with input_record (it applies the strike policy)")
    return verdict_row(verdict=verdict, user=user, text=text)


def input_record(*, verdict: Verdict, user, message: Message | None, text: str) -> None:
    """Record the input verdict of a stored (or, ``message`` None, unstored) user message. Inside the
    transaction that stores it."""
    verdict_record(verdict=verdict, user=user, message_id=message.pk if message else None, text=text)


def blocked_input_store(
    *, verdict: Verdict, user, conversation: Conversation, content: str, client_id=None, parent=APPEND
) -> ContentBlocked:
    """Store ``content`` as a ``blocked`` user message in ``conversation`` (the caller's transaction), record
    the verdict (and the strike policy), and return the :class:`ContentBlocked` to raise. ``parent`` as for
    ``message_create`` (left out: after the active leaf)."""
    message = message_create(
        conversation=conversation,
        role=Message.Role.USER,
        content=content,
        status=Message.Status.BLOCKED,
        client_id=client_id,
        parent=parent,
    )
    input_record(verdict=verdict, user=user, message=message, text=content)
    # Every other tab of the user shows the new message (tab sync through the per-user group).
    broadcast.publish_to_user_on_commit(
        user.pk,
        broadcast.frame_conversation(
            kind="messages", conversation_id=conversation.pk, title=conversation.title
        ),
    )
    return ContentBlocked(
        categories=verdict.categories,
        message_id=message.pk,
        conversation_id=conversation.pk,
        title=conversation.title,
    )


def blocked_again(*, message: Message) -> ContentBlocked:
    """The :class:`ContentBlocked` of an already stored blocked ``message`` (a resend with its
    ``client_id``): nothing new is stored."""
    from safety.models import ModerationVerdict

    verdict = ModerationVerdict.objects.filter(message=message, stage="input").order_by("-id").first()
    return ContentBlocked(
        categories=list(verdict.categories) if verdict else [],
        message_id=message.pk,
        conversation_id=message.conversation_id,
        title=message.conversation.title,
    )
