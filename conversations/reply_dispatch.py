"""Admitting a reply and sending it to the GPU workers: admission with its outcome counted
(:func:`reply_admit`), the Celery task sent after commit to the model's (or a rollout version's) queue with
the tier's priority (:func:`reply_dispatch`), and a queued reply's place in line (:func:`queue_position`).
Used by the chat (``conversations.generations``), the API (``conversations.completions``) and the reaper's
re-dispatch (``conversations.reaper``).
"""

from celery import current_app
from django.db import transaction

from conversations.admission import Admission, AdmissionRefused, admission_check
from conversations.models import Message
from conversations.selectors import PLACE_IN_LINE_SQL, place_in_line_params
from database.sql import fetch_one
from inference.registry import declare_queue, queue_for, task_priority
from observability import tracing
from observability.logs import current_field

#: The Celery task that generates a reply (``conversations/tasks.py``), under the name it has always had so
#: messages already queued under it still route.
GENERATE_TASK = "inference.generate_reply"


def queue_position(*, message: Message) -> int:
    """1-based place in line among queued replies for the same model (approximate: replies of a higher tier
    priority and older replies of the same priority are ahead, as in the broker's priority queue). One fixed
    statement (``database/sql.py``, lever 19). A reply just admitted has it from admission's read
    (``Admission.queued_ahead``, lever 30)."""
    params = place_in_line_params(
        model_name=message.model_name,
        priority=message.conversation.owner.tier.queue_priority,
        up_to_id=message.id,
    )
    return fetch_one(PLACE_IN_LINE_SQL, params)[0]


def reply_dispatch(*, message: Message) -> None:
    """Send the generation task after commit to the model's queue with the tier's priority; under a
    blue-green rollout the reply is pinned to a version's queue and records that version."""
    from inference.rollout import route_for

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

    def send():
        # Its start is the commit (the reply is stored), its end the broker's publish confirm: two stages of
        # the reply's trace (docs/overhead.md).
        with tracing.span("reply.dispatch", queue=queue):
            current_app.send_task(
                GENERATE_TASK, args=[message.id], queue=queue, priority=priority, headers=headers
            )

    transaction.on_commit(send)


def reply_admit(
    *,
    user,
    prompt_tokens_bound: int | None = None,
    model_name: str | None = None,
    place_in_line: bool = True,
) -> Admission:
    """``admission_check`` with its outcome counted (metrics by tier and reason, fleet-wide refusals).
    Returns the :class:`Admission` (the model routed to, the quota reservation to attach to the reply, and
    with ``place_in_line`` the replies queued ahead, for the chat's ``queued`` ticket: lever 30; the API,
    which has no place in line, passes False); ``model_name`` is the model a client named (the API), see
    ``admission.route``."""
    from conversations import refusals
    from observability import metrics, tracing

    tier = user.tier.name
    with tracing.span("admission", tier=tier):
        try:
            admission = admission_check(
                user=user,
                prompt_tokens_bound=prompt_tokens_bound,
                model_name=model_name,
                place_in_line=place_in_line,
            )
        except AdmissionRefused as exc:
            metrics.observe_admission(tier=tier, refused_code=exc.code)
            refusals.refusal_record(tier=tier, reason=exc.code)
            raise
    metrics.observe_admission(tier=tier)
    return admission
