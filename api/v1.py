"""The OpenAI-compatible endpoints: ``POST /v1/chat/completions`` (JSON or SSE) and ``GET /v1/models[/id]``.

Thin interface: parse and authenticate, call :func:`conversations.completions.completion_request` (admission
control, storage, dispatch to the same Celery task and engine as the browser chat), then shape the reply's
frames (:mod:`api.follow`) as OpenAI objects. The completion view is async and its SSE body an async
generator, so an open stream holds no thread under daphne.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from api import chunks
from api.auth import user_for_request
from api.chat_request import ChatRequest, parse_chat_request
from api.dbconn import close_request_connections
from api.errors import ApiError, from_admission, invalid, model_not_found, rate_limit_headers
from api.follow import ReplyLost, reply_frames
from conversations import broadcast
from conversations.admission import AdmissionRefused
from conversations.completions import completion_cancel, completion_request
from conversations.models import Message
from inference.registry import models_for_tier

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
    return user, chat


def _submit(user, chat: ChatRequest, channel: str) -> Message:
    layer = get_channel_layer()

    def subscribe(reply: Message) -> None:
        # Runs in this sync_to_async thread; async_to_sync hops back onto the view's event loop.
        async_to_sync(layer.group_add)(broadcast.message_group(reply.id), channel)

    try:
        reply = completion_request(
            user=user,
            model=chat.model,
            messages=chat.messages,
            sampling=chat.sampling,
            store=chat.store,
            on_queued=subscribe,
        )
    except AdmissionRefused as refused:
        raise from_admission(refused, user=user) from refused
    # As OpenAI does on every response, so clients can pace themselves before they hit a 429.
    reply.rate_limit_headers = rate_limit_headers(user=user)
    return reply


def _failure(done: dict) -> ApiError:
    """The error for a reply that ended without completing (failed, interrupted, cancelled elsewhere)."""
    status = done.get("status")
    message = done.get("error") or f"The completion ended as {status}."
    return ApiError(500, message, type="server_error", code=status)


async def _close_db() -> None:
    """Close this request's database connections (see api/dbconn.py)."""
    await sync_to_async(close_request_connections)()


async def _cancel(user, message_id: int) -> None:
    # Shielded: this runs while the view's task is being cancelled (client gone).
    try:
        await asyncio.shield(sync_to_async(completion_cancel)(user=user, message_id=message_id))
    except Exception:  # the reply may already be gone; the stream is closing either way
        logger.warning("could not cancel completion %s", message_id, exc_info=True)


@csrf_exempt
@require_POST
async def chat_completions(request):
    """``POST /v1/chat/completions``: a ``chat.completion`` object, or with ``stream: true`` an SSE stream of
    ``chat.completion.chunk`` events ending in ``data: [DONE]``. Errors in OpenAI's shape (api.errors)."""
    layer = get_channel_layer()
    channel = await layer.new_channel("api.")
    try:
        return await _chat_completions(request, layer, channel)
    finally:
        if not getattr(request, "_api_streaming", False):  # the SSE generator closes them when it ends
            await _close_db()


async def _chat_completions(request, layer, channel):
    try:
        user, chat = await sync_to_async(_prepare)(request)
        submit = asyncio.ensure_future(sync_to_async(_submit)(user, chat, channel))
        try:
            reply = await asyncio.shield(submit)
        except asyncio.CancelledError:
            # The client left while the reply was being stored: it commits anyway, so cancel it.
            try:
                reply = await submit
            except ApiError:
                raise asyncio.CancelledError from None
            await _cancel(user, reply.id)
            raise
    except ApiError as error:
        return error.response()
    created = int(time.time())
    # As OpenAI's ``model``: the model that answered, which may differ from the one asked for (here: the
    # tier's degrade_to_model when its own model was too busy).
    ids = {"id": chunks.completion_id(reply.id), "created": created, "model": reply.model_name}
    if chat.stream:
        response = StreamingHttpResponse(
            _stream(layer, channel, user, reply.id, chat, ids), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        request._api_streaming = True
    else:
        response = await _complete(layer, channel, user, reply.id, ids)
    for name, value in reply.rate_limit_headers.items():
        response[name] = value
    return response


async def _complete(layer, channel: str, user, message_id: int, ids: dict) -> JsonResponse:
    finished = False
    try:
        async with asyncio.timeout(settings.API_COMPLETION_TIMEOUT_S):
            async for frame in reply_frames(layer, channel, message_id):
                if frame["type"] == "done":
                    finished = True
                    done = frame
    except TimeoutError:
        await _cancel(user, message_id)
        finished = True
        return ApiError(
            504, "The completion took too long and was cancelled.", type="server_error", code="timeout"
        ).response()
    except ReplyLost as exc:
        finished = True
        return ApiError(500, str(exc), type="server_error", code="reply_lost").response()
    finally:
        if not finished:  # the client went away (CancelledError): free the engine slot
            await _cancel(user, message_id)
        await layer.group_discard(broadcast.message_group(message_id), channel)
    if done["status"] != Message.Status.COMPLETED:
        return _failure(done).response()
    return JsonResponse(
        chunks.completion(
            content=done["content"],
            finish_reason=done["finish_reason"] or "stop",
            usage=chunks.usage_of(done),
            **ids,
        )
    )


async def _stream(layer, channel: str, user, message_id: int, chat: ChatRequest, ids: dict):
    include_usage = chat.include_usage
    finished = False
    sent = []
    try:
        yield chunks.sse(
            chunks.chunk(delta={"role": "assistant", "content": ""}, include_usage=include_usage, **ids)
        )
        async for frame in reply_frames(layer, channel, message_id):
            if frame["type"] == "token":
                if frame["text"]:
                    sent.append(frame["text"])
                    yield chunks.sse(
                        chunks.chunk(delta={"content": frame["text"]}, include_usage=include_usage, **ids)
                    )
                continue
            done, finished = frame, True
            if done["status"] != Message.Status.COMPLETED:
                yield chunks.sse(_failure(done).body())
                return
            streamed = "".join(sent)
            rest = done["content"][len(streamed) :] if done["content"].startswith(streamed) else ""
            if rest:  # frames lost on the way (never expected; the stored text is the truth)
                yield chunks.sse(chunks.chunk(delta={"content": rest}, include_usage=include_usage, **ids))
            yield chunks.sse(
                chunks.chunk(
                    finish_reason=done["finish_reason"] or "stop", include_usage=include_usage, **ids
                )
            )
            if include_usage:
                yield chunks.sse(
                    chunks.chunk(usage=chunks.usage_of(done), include_usage=True, final_usage=True, **ids)
                )
            yield chunks.DONE
    except ReplyLost as exc:
        finished = True
        yield chunks.sse(ApiError(500, str(exc), type="server_error", code="reply_lost").body())
    finally:
        if not finished:  # client disconnected (CancelledError / GeneratorExit): free the engine slot
            await _cancel(user, message_id)
        await layer.group_discard(broadcast.message_group(message_id), channel)
        await _close_db()


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


async def not_found(request, rest: str = ""):
    """Any other ``/v1/...`` path: 404 in OpenAI's shape."""
    return ApiError(404, f"Unknown endpoint /v1/{rest}.", code="unknown_url").response()
