"""Chat completions requested through the API (``/v1/chat/completions``): the second front door to the same
generation lifecycle as the browser chat (:mod:`conversations.generations`): same admission control, same
Celery task and engine, same :class:`~billing.models.UsageRecord` ledger.

A completion is stored as a conversation holding the request's messages and one queued assistant reply
carrying the request's sampling parameters (``Message.sampling``). Unless the request said ``store: true``
the conversation has ``stored=False``: selectors hide it from history, and it is deleted once its reply ends
(:func:`conversations.generation_worker.generation_finish`), is cancelled before it started, or is reaped as
interrupted; usage stays.
"""

from typing import Any

from django.db import transaction

from conversations import moderation, recall, reply_control
from conversations.admission import load_gate, prompt_tokens_bound_for_texts
from conversations.models import Conversation, Message
from conversations.reply_dispatch import reply_admit, reply_dispatch
from conversations.services import conversation_new, message_chain_create, message_create, title_from_content


def completion_request(
    *,
    user,
    model: str,
    messages: list[dict[str, str]],
    sampling: dict[str, Any],
    store: bool = False,
    api_user: str = "",
    api_metadata: dict[str, str] | None = None,
) -> Message:
    """Store ``messages`` (``{"role": "system"|"user"|"assistant", "content": str}``; system texts are joined
    into the conversation's pinned system prompt) and a queued assistant reply in one transaction; the
    generation task is dispatched on commit. ``model`` is the model the client asked for; admission routes
    it like a chat message (``admission.route``: the tier's own model may be moved to its
    ``degrade_to_model`` under load), and the reply's ``model_name`` is the model that will answer. A caller that
    follows the reply joins its group once this returns and catches up on what was published before
    (``api.follow.reply_frames``; docs/overhead-levers.md, lever 33).
    ``api_user`` and ``api_metadata`` (the request's ``user`` and ``metadata``) are stored on the reply.

    The caller has checked that ``user``'s tier may use ``model``. Raises ``AdmissionRefused`` (nothing
    stored), ``moderation.ContentBlocked`` when the input chain blocks the request's user turns (checked
    before admission; with ``store`` the conversation is kept with its last user turn marked ``blocked``,
    without it only the verdict, holding the text for staff review). Returns the queued reply, with
    ``rate_usage`` set: the per-minute counter as admission left it (``Admission.rate_usage``).
    """
    system_prompt = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    first_user = next((m["content"] for m in turns if m["role"] == "user"), "")
    # Every user turn is the client's text (an injection in an earlier turn is still one); one chain run.
    user_text = "\n\n".join(m["content"] for m in turns if m["role"] == "user")
    verdict = moderation.input_check(user=user, text=user_text)
    if verdict.blocked:
        raise _store_blocked(
            user=user, verdict=verdict, turns=turns, system_prompt=system_prompt, store=store
        )
    # An OpenAI client names a model in every request: naming the tier's own model asks for the tier's routing
    # (it may be answered by the degrade_to_model under load, and the response's ``model`` says so); naming
    # another of the tier's models pins it, as a choice on the page does.
    routed = None if model == user.tier.model_name else model
    # Refuse under overload before opening a transaction (cached figures only), as the chat does.
    load_gate(tier=user.tier, model_name=routed)
    if store and turns and turns[-1]["role"] == "user":
        # A stored completion recalls memory: its question's vector is asked for now, as a page send's is.
        # An API request's key read says already whether anything would read the vector (lever 40).
        recall.question_prefetch(
            user=user,
            conversation_id=None,
            question=turns[-1]["content"],
            at_once=True,
            wanted=getattr(user, "question_vector_wanted", None),
        )
    with transaction.atomic():
        # Reserves the quota (prompt bound + reply limit); attached to the reply below, settled at its end.
        admission = reply_admit(
            user=user,
            prompt_tokens_bound=prompt_tokens_bound_for_texts([m["content"] for m in messages]),
            model_name=routed,
            place_in_line=False,  # an API stream has no place in line
        )
        # Stored with the turns below, in their statement (lever 47).
        conversation = conversation_new(
            owner=user, title=title_from_content(first_user), system_prompt=system_prompt, stored=store
        )
        # Each turn follows the previous one on the branch tree (issue 12), so the reply's context (its
        # ancestors) holds every turn of the request: the turns and the reply are one chain, stored in one
        # statement (lever 20, docs/overhead.md). The conversation is this transaction's own (no other one
        # sees it yet): no row lock to take.
        reply_fields = {
            "sampling": sampling or None,
            "api_user": api_user,
            "api_metadata": api_metadata or None,
        }
        # The input verdict (on the last user turn) and the reply's quota reservation go in the same
        # statement (lever 28).
        last_user = max((i for i, turn in enumerate(turns) if turn["role"] == "user"), default=None)
        verdict_row = (
            None if last_user is None else moderation.input_row(verdict=verdict, user=user, text=user_text)
        )
        *_, reply = message_chain_create(
            conversation=conversation,
            messages=[
                *({"role": turn["role"], "content": turn["content"]} for turn in turns),
                {
                    "role": Message.Role.ASSISTANT,
                    "status": Message.Status.QUEUED,
                    "model_name": admission.model_name,
                    **reply_fields,
                },
            ],
            parent=None,
            conversation_locked=True,
            attached=[(verdict_row, last_user), (admission.reservation_row(), len(turns))],
        )
        if last_user is None:  # no user turn: the verdict is stored on its own, for no message
            moderation.input_record(verdict=verdict, user=user, message=None, text=user_text)
        reply_dispatch(message=reply)
    reply.rate_usage = admission.rate_usage  # the API's x-ratelimit-* headers (lever 49)
    return reply


def _store_blocked(*, user, verdict, turns, system_prompt: str, store: bool) -> Exception:
    """Keep a blocked request for review: with ``store``, its conversation with the last user turn marked
    ``blocked`` and no reply; without, only the verdict (``message`` None). Returns the exception to raise."""
    user_text = "\n\n".join(m["content"] for m in turns if m["role"] == "user")
    with transaction.atomic():
        if not store:
            moderation.input_record(verdict=verdict, user=user, message=None, text=user_text)
            return moderation.ContentBlocked(categories=verdict.categories)
        conversation = Conversation.objects.create(
            owner=user,
            title=title_from_content(next((m["content"] for m in turns if m["role"] == "user"), "")),
            system_prompt=system_prompt,
            stored=True,
        )
        last_user = max(i for i, m in enumerate(turns) if m["role"] == "user")
        for turn in turns[:last_user]:
            message_create(conversation=conversation, role=turn["role"], content=turn["content"])
        return moderation.blocked_input_store(
            verdict=verdict, user=user, conversation=conversation, content=turns[last_user]["content"]
        )


def completion_cancel(*, user, message_id: int) -> Message:
    """Cancel an API completion whose client went away (:func:`reply_control.reply_cancel`: a queued reply
    ends at once, a streaming one within one decode step, its usage so far recorded by the worker). An
    unstored conversation whose reply never reached a worker is deleted here; otherwise the worker's
    ``generation_finish`` deletes it."""
    message = reply_control.reply_cancel(user=user, message_id=message_id)
    if message.status == Message.Status.CANCELLED and not message.conversation.stored:
        Conversation.objects.filter(pk=message.conversation_id, stored=False).delete()
    return message
