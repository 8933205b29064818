"""What a reply-creating service answers with (:class:`ReplyTicket`, or :class:`GenerationError`), and a
send's idempotency key (``client_id``): the ticket of the message already stored under it
(:func:`ticket_for_client_id`, :func:`stored_ticket`). Used by ``conversations/generations.py``."""

from dataclasses import dataclass

from conversations import moderation
from conversations.admission import Admission
from conversations.models import Message
from conversations.reply_dispatch import queue_position


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


def ticket_for_queued(
    assistant: Message, *, user_message_id: int | None, admission: Admission
) -> ReplyTicket:
    """The ticket of a newly queued reply: its place in line (as admission read it, ``queued_ahead``, or read
    now when admission did not) and any routing notice for the user."""
    ahead = admission.queued_ahead
    return ReplyTicket(
        message=assistant,
        user_message_id=user_message_id,
        position=queue_position(message=assistant) if ahead is None else ahead + 1,
        notice=_notice(admission),
    )


def _notice(admission: Admission) -> str:
    if not admission.degraded:
        return ""
    return f"The service is busy, so this reply comes from the lighter model {admission.model_name}."


def ticket_for_client_id(*, user, client_id) -> ReplyTicket | None:
    """The ticket (``duplicate=True``) of ``user``'s message stored under ``client_id``, None when there is
    none. Raises ``moderation.ContentBlocked`` for a message the content policy blocked, and
    ``GenerationError("invalid_request")`` when its reply was deleted since."""
    user_message = (
        Message.objects.filter(conversation__owner=user, role=Message.Role.USER, client_id=client_id)
        .select_related("conversation")
        .first()
    )
    if user_message is None:
        return None
    if user_message.status == Message.Status.BLOCKED:  # a resend of a message the content policy refused
        raise moderation.blocked_again(message=user_message)
    # The reply queued with it is its first assistant child (later ones are regenerated siblings).
    assistant = user_message.children.filter(role=Message.Role.ASSISTANT).order_by("id").first()
    if assistant is None:  # its reply was deleted since; the page already moved on
        raise GenerationError("invalid_request", "This message was already sent.")
    position = queue_position(message=assistant) if assistant.status == Message.Status.QUEUED else 0
    return ReplyTicket(message=assistant, user_message_id=user_message.id, position=position, duplicate=True)


def stored_ticket(*, user, client_id, error: Exception) -> ReplyTicket:
    """The ticket of the message stored under ``client_id``, for a send whose insert met a unique constraint
    (its key taken), or that admission refused before its insert could (a new conversation's key is checked
    by the message chain's statement, after admission: lever 47); raises ``error`` when no message holds that
    key (another constraint failed, or the refusal stands)."""
    existing = ticket_for_client_id(user=user, client_id=client_id) if client_id is not None else None
    if existing is None:
        raise error
    return existing
