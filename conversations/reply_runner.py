"""The thin adapter between the product and the engine: loads a reply's conversation, assembles its context,
streams the engine's deltas through ``events.broadcast`` and persists the result.

The deltas are published by the process's one publisher thread (``conversations.delta_publisher``: one Redis
round trip per engine step for every reply), never by the engine's loop thread. Output moderation
(docs/safety.md): every delta goes through the reply's ``OutputMonitor`` before it is published, and each check
runs on this task thread, to which the publisher hands the delta that makes a check due; when a check blocks,
the request is cancelled at once (Stop's path: the engine frees the slot at its next step), nothing more is
published, the replay stream is deleted, and the reply is stored ``blocked`` without its text.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings

from conversations import delta_publisher, recall
from conversations.context import ContextTooLong, assemble_context
from conversations.generation_worker import (
    generation_branch,
    generation_finish,
    generation_requeue,
    generation_set_context,
    generation_start,
)
from conversations.models import Message
from database.connections import close_request_connections
from database.outages import DB_OUTAGE_ERRORS, with_db_retry
from documents.retrieval import (
    DocumentsContext,
    citations_record,
    conversation_has_documents,
    documents_budget,
    documents_context,
    with_documents,
)
from events import broadcast
from inference.backends import EngineDead
from inference.engine import EngineError, FinishEvent, SamplingParams
from inference.worker import WorkerHost, get_host
from memory.query import question_vector
from observability import tracing
from observability.logs import log_context
from observability.metrics import ReplyTimer
from safety.chain import Verdict
from safety.services import verdict_record, verdict_row
from safety.streaming import OutputMonitor

logger = logging.getLogger(__name__)

REDIS_ERRORS = broadcast.REDIS_ERRORS

STATUS_BY_FINISH = {
    "stop": Message.Status.COMPLETED,
    "length": Message.Status.COMPLETED,
    "cancelled": Message.Status.CANCELLED,
    "error": Message.Status.FAILED,
}


def sampling_for(*, max_new_tokens: int, overrides: dict | None = None) -> SamplingParams:
    """Chat sampling defaults from settings (``INFERENCE_TEMPERATURE`` etc.) with the tier's reply limit.
    ``overrides`` is an API request's ``Message.sampling`` (``temperature``, ``top_p``, ``stop``, ``seed``,
    ``presence_penalty``, ``frequency_penalty``, ``max_tokens`` capped at ``max_new_tokens``); a request that
    sets either OpenAI penalty gets no repetition penalty on top."""
    overrides = dict(overrides or {})
    if "max_tokens" in overrides:
        max_new_tokens = max(1, min(int(overrides.pop("max_tokens")), max_new_tokens))
    repetition_penalty = settings.INFERENCE_REPETITION_PENALTY
    if "presence_penalty" in overrides or "frequency_penalty" in overrides:
        repetition_penalty = 1.0
    fields = {
        "temperature": settings.INFERENCE_TEMPERATURE,
        "top_p": settings.INFERENCE_TOP_P,
        "repetition_penalty": repetition_penalty,
        "max_new_tokens": max_new_tokens,
    }
    allowed = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty")
    fields.update({name: value for name, value in overrides.items() if name in allowed})
    return SamplingParams(**fields)


def finish(*, message: Message, **fields) -> str:
    """``generation_finish`` retried through a PostgreSQL outage of up to ``GENERATION_FINISH_RETRY_S``
    seconds (``database.outages``); returns the stored status."""
    return with_db_retry(
        lambda: generation_finish(message=message, **fields), window_s=settings.GENERATION_FINISH_RETRY_S
    ).status


def run_generation(*, message_id: int, host: WorkerHost | None = None) -> str:
    """Generate, stream and store one queued reply. Returns the final status, or ``"skipped"`` when the
    reply was no longer queued (stopped before it started, or a redelivered task).

    A database outage before the claim raises (the task is retried, and the queued-reply reaper
    re-dispatches it anyway); one after the claim ends the reply ``interrupted`` with the text streamed so
    far, written once the database is back."""
    host = host or get_host()
    with log_context(message_id=message_id), tracing.span("generation", message_id=message_id):
        message = generation_start(
            message_id=message_id, trace_id=tracing.current_trace_id(), model_version=host.model_version
        )
        if message is None:
            return "skipped"
        return _run(host, message)


def _run(host: WorkerHost, message: Message) -> str:
    with (
        log_context(user_id=message.conversation.owner_id),
        host.track(message.id, lease=False) as request_id,
    ):
        try:
            return _generate(host, message, request_id)
        except EngineDead as exc:
            return _engine_died(message, exc)
        except (ContextTooLong, EngineError) as exc:
            return finish(message=message, status=Message.Status.FAILED, text="", error=str(exc))
        except DB_OUTAGE_ERRORS:
            logger.warning("database unavailable while generating message %s", message.id, exc_info=True)
            return finish(
                message=message,
                status=Message.Status.INTERRUPTED,
                text=_streamed_text(message.id),
                error="The database was unavailable while generating this reply. Retry to generate it again.",
            )
        except Exception:
            logger.exception("generation of message %s failed", message.id)
            return finish(
                message=message,
                status=Message.Status.FAILED,
                text=_streamed_text(message.id),
                error="Internal error while generating.",
            )


def _engine_died(message: Message, exc: EngineDead) -> str:
    """The engine died under this reply: keep what it wrote (``interrupted``, usage recorded), or, when it
    wrote nothing, put it back to ``queued`` and re-raise so the task hands its message back to the broker."""
    text = exc.text or _streamed_text(message.id)
    if not text:
        with_db_retry(
            lambda: generation_requeue(message=message), window_s=settings.GENERATION_FINISH_RETRY_S
        )
        raise exc
    return finish(
        message=message,
        status=Message.Status.INTERRUPTED,
        text=text,
        prompt_tokens=message.prompt_tokens or 0,
        completion_tokens=exc.completion_tokens,
        error="The model server stopped while generating this reply. Retry to generate it again.",
    )


def _streamed_text(message_id: int) -> str:
    try:
        return broadcast.stream_text(message_id)
    except REDIS_ERRORS:
        return ""


def _generate(host: WorkerHost, message: Message, request_id: str) -> str:
    engine = host.engine
    tier = message.conversation.owner.tier
    with tracing.span("context.assembly"):
        system_prompt, turns, turn_ids = generation_branch(message=message)
        context_limit = min(tier.max_context_tokens, engine.context_length)
        max_new_tokens = min(tier.max_reply_tokens, context_limit // 2)
        budget = context_limit - max_new_tokens
        cited, vector = _documents_context(engine, message, turns, budget)
        try:
            context = assemble_context(
                system_prompt=with_documents(system_prompt, cited),
                history=turns,
                budget_tokens=budget,
                tokenize=engine.render_chat,
            )
        except ContextTooLong:
            if not cited.text:
                raise
            # The passages left no room for the newest turn: answer without them.
            cited = DocumentsContext()
            context = assemble_context(
                system_prompt=system_prompt, history=turns, budget_tokens=budget, tokenize=engine.render_chat
            )
        context = recall.context_with_memory(
            message=message,
            tier=tier,
            system_prompt=with_documents(system_prompt, cited),
            turns=turns,
            turn_ids=turn_ids,
            window=context,
            budget_tokens=budget,
            tokenize=engine.render_chat,
            count_tokens=lambda text: len(engine.tokenizer.encode(text, add_special_tokens=False)),
            vector=vector,
        )

    timer = ReplyTimer(model=host.model_name, tier=tier.name)
    submitted_ns = time.time_ns()
    handle = engine.submit(
        context.prompt_token_ids,
        sampling_for(max_new_tokens=max_new_tokens, overrides=message.sampling),
        priority=tier.queue_priority,
        request_id=request_id,
        # Per-user prefix-cache namespace: the next turn reuses this one's KV, and no other user's
        # timing can reveal this user's text.
        cache_salt=f"user:{message.conversation.owner_id}",
    )
    # Until the context is recorded (after the first token's publish), hold no connection: give it back to
    # the pool, so a worker's queued and decoding replies do not each hold one (DB_POOL_MAX_SIZE).
    close_request_connections()
    # One Redis round trip once the engine has the request: `started`, the reply's lease (taken here, not before
    # the submit) and whether Stop arrived before the request existed in the engine (the flag outlives the
    # pub/sub message); docs/overhead-levers.md, lever 44.
    try:
        cancelled = broadcast.publish_started(
            message.id,
            broadcast.frame_started(message_id=message.id, omitted_messages=context.omitted),
            lease_holder=host.worker_id,
        )
    except REDIS_ERRORS:
        # Redis is restarting: as for a delta (below), the generation goes on; the heartbeat takes the lease
        # once Redis is back, within the reaper's recheck (LEASE_RECHECK_S).
        logger.warning("could not publish the start of message %s", message.id, exc_info=True)
        cancelled = False
    except BaseException:
        handle.cancel()
        raise
    if cancelled:
        handle.cancel()
    monitor = OutputMonitor(tier=tier, user_id=message.conversation.owner_id)
    # The deltas are published by the process's publisher thread, one Redis round trip per engine step; this
    # thread checks and publishes those at which a moderation check is due (conversations/delta_publisher.py).
    feed = delta_publisher.follow(handle, message_id=message.id, monitor=monitor, timer=timer)
    recorded = False
    with tracing.quiet():  # one Redis span per delta would drown the trace
        for _first in feed.signals():
            if not recorded:
                _record_context(handle, message, context, cited)
                recorded = True
    if not recorded:
        _record_context(handle, message, context, cited)
    final, blocked, first_publish = feed.final, feed.blocked, feed.first_publish
    assert final is not None, "the engine ends every request with a FinishEvent"
    t = final.timings
    timer.finish_event(final)
    _record_engine_spans(submitted_ns, t)
    if first_publish is not None:
        tracing.record_span("channel_layer.first_token", *first_publish)
    logger.info(
        "reply finished: %s, %d prompt + %d completion tokens, TTFT %s ms, %.0f ms",
        final.finish_reason,
        final.usage.prompt_tokens,
        final.usage.completion_tokens,
        round(t.ttft_ms) if t.ttft_ms is not None else "-",
        t.total_ms,
    )
    verdict = blocked or monitor.finish(final.text)  # the whole reply, once at the end
    with tracing.span("generation.final_write"):
        if verdict is not None and verdict.blocked:
            return _finish_blocked(message, final, verdict)
        return _finish(message, final, verdict)


def _record_context(handle, message: Message, context, cited: DocumentsContext) -> None:
    """Record the reply's window (omitted turns, prompt tokens) and its cited passages. Called once the
    first delta is published (or at the end of a reply that published none), not before the engine's
    prefill: written then, it slowed the prefill it overlapped and the first token waited for it
    (docs/overhead-levers.md, lever 15). Cancels the engine request and re-raises when the write fails."""
    try:
        with tracing.span("context.record"):
            generation_set_context(
                message=message, omitted=context.omitted, prompt_tokens=context.prompt_tokens
            )
            if cited.cited:
                citations_record(reply_id=message.id, cited=cited.cited)
    except BaseException:
        handle.cancel()
        raise
    finally:
        close_request_connections()  # the decode holds no connection (see above)


def _documents_context(engine, message: Message, turns: list[dict], budget: int):
    """``(DocumentsContext, question vector or None)``: passages of the conversation's files for the newest
    turn (docs/documents.md). The question's vector (prefetched when the reply was queued) is fetched only
    for a chat with a ready file, and handed on to memory's recall so it is embedded once."""
    conversation = message.conversation
    question = turns[-1]["content"] if turns else ""
    reads = getattr(message, "claim_reads", None)  # read with the claim (generation_start)
    if reads is not None:
        has_documents = reads.has_documents
    else:
        has_documents = conversation_has_documents(conversation_id=conversation.id)
    if not question.strip() or not has_documents:
        return DocumentsContext(), None
    with tracing.span("documents.question_embedding"):
        vector = question_vector(
            user_id=conversation.owner_id, text=question, timeout_s=settings.MEMORY_QUERY_TIMEOUT_S
        )
    if vector is None:
        return DocumentsContext(), None
    cited = documents_context(
        user_id=conversation.owner_id,
        conversation_id=conversation.id,
        question=question,
        vector=vector,
        budget_tokens=documents_budget(prompt_budget_tokens=budget),
        count_tokens=lambda text: len(engine.tokenizer.encode(text, add_special_tokens=False)),
    )
    return cited, vector


def _record_engine_spans(submitted_ns: int, t) -> None:
    """Engine stages as spans, from the finish event's timings (ms since submit)."""
    ms = 1_000_000
    admitted = submitted_ns + int(t.queue_ms * ms)
    end = submitted_ns + int(t.total_ms * ms)
    tracing.record_span("engine.queue_wait", submitted_ns, admitted)
    if t.ttft_ms is None:
        tracing.record_span("engine.prefill", admitted, end)
        return
    first = submitted_ns + int(t.ttft_ms * ms)
    tracing.record_span("engine.prefill", admitted, first, first_token_ns=first)
    tracing.record_span("engine.decode", first, end)


def _finish(message: Message, final: FinishEvent, verdict: Verdict | None = None) -> str:
    return finish(
        message=message,
        status=STATUS_BY_FINISH[final.finish_reason],
        text=final.text,
        finish_reason=final.finish_reason,
        **_verdict_stored(message, verdict, ""),
        prompt_tokens=final.usage.prompt_tokens,
        completion_tokens=final.usage.completion_tokens,
        ttft_ms=round(final.timings.ttft_ms) if final.timings.ttft_ms is not None else None,
        duration_ms=round(final.timings.total_ms),
        error=final.error or "",
    )


def _verdict_stored(message: Message, verdict: Verdict | None, text: str) -> dict:
    """How the final write (``generation_finish``'s keywords) stores the output verdict ``verdict`` of ``text``:
    an allowed or flagged one as a row of the write's own statement (``attached``, docs/overhead-levers.md
    lever 54), a block through ``verdict_record`` in its transaction (``on_written``), which also applies the
    strike policy; nothing for None."""
    if verdict is None:
        return {}
    owner = message.conversation.owner
    if not verdict.blocked:
        return {"attached": verdict_row(verdict=verdict, user=owner, text=text)}
    return {
        "on_written": lambda: verdict_record(verdict=verdict, user=owner, message_id=message.id, text=text)
    }


def _finish_blocked(message: Message, final: FinishEvent, verdict: Verdict) -> str:
    """Store a reply the output chain blocked: status ``blocked``, ``finish_reason`` ``content_filter``
    (OpenAI's value) and no text; the text generated goes to the verdict, for staff only. The replay stream
    is deleted first, so no resume after a refresh can show what was streamed. Tokens generated are charged,
    as for Stop."""
    try:
        broadcast.stream_discard(message.id)
    except REDIS_ERRORS:  # it expires with STREAM_REPLAY_TTL_S; resume reads the stored (empty) text first
        logger.warning("could not delete the replay stream of blocked message %s", message.id)
    logger.info("reply blocked by the output chain: %s by %s", ",".join(verdict.categories), verdict.guard)
    return finish(
        message=message,
        status=Message.Status.BLOCKED,
        text="",
        finish_reason="content_filter",
        prompt_tokens=final.usage.prompt_tokens,
        completion_tokens=final.usage.completion_tokens,
        ttft_ms=round(final.timings.ttft_ms) if final.timings.ttft_ms is not None else None,
        duration_ms=round(final.timings.total_ms),
        **_verdict_stored(message, verdict, final.text),
    )
