"""The OpenAI-compatible endpoints: ``POST /v1/chat/completions`` (JSON or SSE) and ``GET /v1/models[/id]``.

Thin interface: parse and authenticate, call :func:`conversations.completions.completion_request` (admission
control, storage, dispatch to the same Celery task and engine as the browser chat), then shape the reply's
frames (:mod:`api.follow`) as OpenAI objects (:mod:`api.streaming` for SSE). The completion view is async and its SSE body an async
generator, so an open stream holds no thread under daphne.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from api import chunks
from api.auth import user_for_request
from api.chat_request import ChatRequest, check_reply_limit, parse_chat_request
from api.errors import (
    ApiError,
    completion_failed,
    content_policy_violation,
    from_admission,
    invalid,
    model_not_found,
    rate_limit_headers,
)
from api.follow import ReplyLost, ReplySubscription, reply_frames
from api.openapi_v1 import openapi_document
from api.streaming import CompletionStream
from conversations import load_warmer
from conversations.admission import AdmissionRefused
from conversations.completions import completion_request
from conversations.consumer_admission import reply_service_pool
from conversations.models import Message
from conversations.moderation import ContentBlocked
from database.connections import close_request_connections
from events import broadcast
from events.layer_reader import keep_layer_listening
from inference.registry import models_for_tier
from observability import tracing
from observability.logs import log_context

logger = logging.getLogger(__name__)

#: ``created`` of the model objects (the registry keeps no dates).
MODEL_CREATED = 1_735_689_600


def _model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": MODEL_CREATED, "owned_by": "chatsite"}


def _read_json(request):
    if int(request.headers.get("Content-Length") or 0) > settings.API_MAX_BODY_BYTES:
        raise invalid(f"The request body is larger than {settings.API_MAX_BODY_BYTES} bytes.")
    try:
        raw = request.body
    except RequestDataTooBig as exc:
        raise invalid(f"The request body is larger than {settings.API_MAX_BODY_BYTES} bytes.") from exc
    if len(raw) > settings.API_MAX_BODY_BYTES:
        raise invalid(f"The request body is larger than {settings.API_MAX_BODY_BYTES} bytes.")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise invalid(
            "We could not parse the JSON body of your request. Send a JSON object with "
            "'Content-Type: application/json'.",
            code="invalid_json",
        ) from exc


def _prepare(request) -> tuple:
    """Sync part of a completion request: ``(user, ChatRequest)``; raises ApiError."""
    user = user_for_request(request)
    chat = parse_chat_request(_read_json(request), max_message_chars=settings.MAX_MESSAGE_CHARS)
    if chat.model not in models_for_tier(user.tier):
        raise model_not_found(chat.model)
    check_reply_limit(chat, limit=user.tier.max_reply_tokens)
    return user, chat


def _submit(user, chat: ChatRequest) -> Message:
    try:
        reply = completion_request(
            user=user,
            model=chat.model,
            messages=chat.messages,
            sampling=chat.sampling,
            store=chat.store,
            api_user=chat.user,
            api_metadata=chat.metadata,
        )
        # As OpenAI does on every response, so clients can pace themselves before they hit a 429.
        reply.rate_limit_headers = rate_limit_headers(user=user, usage=reply.rate_usage)
        return reply
    except AdmissionRefused as refused:
        raise from_admission(refused, user=user) from refused
    except ContentBlocked as blocked:
        raise content_policy_violation(str(blocked)) from blocked


def _prepare_and_submit(request) -> tuple:
    """A completion request's sync part in one thread hop: ``(user, ChatRequest, reply, validated_ns)``, the
    key checked, the body parsed and the model allowed at ``validated_ns`` (``time.time_ns()``), then the reply
    stored and its task sent (:func:`_submit`); raises ApiError. The thread's connections are closed (given
    back to the pool) before it returns, whatever happened."""
    try:
        user, chat = _prepare(request)
        validated_ns = time.time_ns()
        return user, chat, _submit(user, chat), validated_ns
    finally:
        # The reply is stored: hand this thread's connection back to the pool now, not when the stream ends.
        # A streamed reply otherwise held one of DB_POOL_MAX_SIZE (16) connections for its whole length, and
        # at 32 concurrent streams the other half waited for a connection before their key was even checked
        # (api.validate p90 3.7 s, docs/overhead.md). Whatever reads the database later takes one again.
        close_request_connections()


async def _close_db() -> None:
    """Close this request's database connections (see database/connections.py)."""
    await sync_to_async(close_request_connections)()


@csrf_exempt
@require_POST
async def chat_completions(request):
    """``POST /v1/chat/completions``: a ``chat.completion`` object, or with ``stream: true`` an SSE stream of
    ``chat.completion.chunk`` events ending in ``data: [DONE]``. Errors in OpenAI's shape (api.errors).
    A client that leaves before its reply ended (any moment, or the non-streaming timeout) cancels it."""
    layer = get_channel_layer()
    await keep_layer_listening(layer)  # this stream's first chunk is not held back (events/layer_reader.py)
    channel = await layer.new_channel("api.")
    try:
        return await _chat_completions(request, layer, channel)
    finally:
        if not getattr(request, "_api_streaming", False):  # the stream's subscription closes them
            await _close_db()


async def _chat_completions(request, layer, channel):
    # The root span of the reply's trace, begun when the request came in (the stages of docs/overhead.md);
    # the Celery task carries its context to the worker, the SSE body parents the first chunk's span to it.
    received_ns = getattr(request, "received_ns", None) or time.time_ns()
    with tracing.span("api.request", start_ns=received_ns):
        response = await _chat_completions_traced(request, layer, channel, received_ns)
    return response


async def _chat_completions_traced(request, layer, channel, received_ns: int):
    request_id = getattr(request, "request_id", "")
    try:
        # One hop (the key check, then the reply stored), on the reply services' threads as the chat's sends:
        # it was two, on the thread Django's handler gives each request (ThreadSensitiveContext), so a burst
        # of completions ran its ORM work on as many threads as requests, each a rival of the event loop for
        # the GIL (docs/overhead-levers.md, lever 37).
        call = sync_to_async(_prepare_and_submit, thread_sensitive=False, executor=reply_service_pool())
        submit = asyncio.ensure_future(call(request))
        try:
            user, chat, reply, validated_ns = await asyncio.shield(submit)
        except asyncio.CancelledError:
            # The client left while the reply was being stored: it commits anyway, so cancel it.
            try:
                user, _, reply, _ = await submit
            except ApiError:
                raise asyncio.CancelledError from None
            await _subscription(layer, channel, user, reply, request_id).aclose()
            raise
        tracing.record_span("api.validate", received_ns, validated_ns)
        load_warmer.api_request_seen(user_id=user.pk)  # this client's next admission reads warm figures
    except ApiError as error:
        return error.response()
    subscription = _subscription(layer, channel, user, reply, request_id)
    # Joined once the reply is stored and its task sent, not inside the transaction: the commit, and so the
    # worker, no longer waits for this round trip; reply_frames catches up on what came before (lever 33).
    try:
        await layer.group_add(broadcast.message_group(reply.id), channel)
    except BaseException:
        await subscription.aclose()  # nobody could follow the reply: cancel it
        raise
    with log_context(user_id=user.pk, message_id=reply.id):
        logger.info(
            "completion queued: model %s, %d message(s), stream=%s, store=%s, user=%r",
            reply.model_name,
            len(chat.messages),
            chat.stream,
            chat.store,
            chat.user,
        )
    # As OpenAI's ``model``: the model that answered, which may differ from the one asked for (here: the
    # tier's degrade_to_model when its own model was too busy).
    ids = {"id": chunks.completion_id(reply.id), "created": int(time.time()), "model": reply.model_name}
    if chat.stream:
        body = CompletionStream(
            subscription, include_usage=chat.include_usage, ids=ids, trace=tracing.current_context()
        )
        response = StreamingHttpResponse(body, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        request._api_streaming = True
    else:
        response = await _complete(subscription, ids)
    for name, value in reply.rate_limit_headers.items():
        response[name] = value
    return response


def _subscription(layer, channel: str, user, reply: Message, request_id: str) -> ReplySubscription:
    return ReplySubscription(
        layer=layer, channel=channel, user=user, message_id=reply.id, request_id=request_id
    )


async def _complete(sub: ReplySubscription, ids: dict) -> JsonResponse:
    try:
        async with asyncio.timeout(settings.API_COMPLETION_TIMEOUT_S):
            async for frame in reply_frames(sub.layer, sub.channel, sub.message_id):
                if frame["type"] == "done":
                    sub.ended, done = True, frame
    except TimeoutError:  # not ended: closing the subscription cancels the reply
        return ApiError(
            504, "The completion took too long and was cancelled.", type="server_error", code="timeout"
        ).response()
    except ReplyLost as exc:
        sub.ended = True
        return ApiError(500, str(exc), type="server_error", code="reply_lost").response()
    finally:
        # Client gone (CancelledError), timed out, or done: cancel the reply unless it ended.
        await sub.aclose()
    if done["status"] not in (Message.Status.COMPLETED, Message.Status.BLOCKED):
        return completion_failed(done).response()
    # A reply the output chain blocked: OpenAI's finish_reason "content_filter" and no text (done carries none).
    return JsonResponse(
        chunks.completion(
            content=done["content"],
            finish_reason=done["finish_reason"] or "stop",
            usage=chunks.usage_of(done),
            **ids,
        )
    )


def _models_user(request):
    return user_for_request(request)


@require_GET
async def models_list(request):
    """``GET /v1/models``: the models the caller's tier may use."""
    try:
        user = await sync_to_async(_models_user)(request)
    except ApiError as error:
        return error.response()
    finally:
        await _close_db()
    names = models_for_tier(user.tier)
    return JsonResponse({"object": "list", "data": [_model_object(name) for name in names]})


@require_GET
async def model_detail(request, model_id: str):
    """``GET /v1/models/<id>``: one model, 404 ``model_not_found`` when the tier may not use it."""
    try:
        user = await sync_to_async(_models_user)(request)
        if model_id not in models_for_tier(user.tier):
            raise model_not_found(model_id)
    except ApiError as error:
        return error.response()
    finally:
        await _close_db()
    return JsonResponse(_model_object(model_id))


@require_GET
async def openapi_json(request):
    """``GET /v1/openapi.json``: the OpenAPI 3.1 document of these endpoints (api/openapi_v1.py); public."""
    return JsonResponse(openapi_document())


async def not_found(request, rest: str = ""):
    """Any other ``/v1/...`` path: 404 in OpenAI's shape."""
    return ApiError(404, f"Unknown endpoint /v1/{rest}.", code="unknown_url").response()
