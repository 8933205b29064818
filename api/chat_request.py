"""Validation of a ``POST /v1/chat/completions`` body (OpenAI's Chat Completions request).

Every parameter is either supported, accepted only at its no-op value (``n`` 1, ``logprobs`` false,
``response_format`` text, ...), or refused with a 400 that names it: nothing is silently ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from api.errors import invalid

ROLES = ("system", "developer", "user", "assistant")
MAX_STOP = 4
#: OpenAI's limits on ``metadata``: 16 pairs, keys up to 64 and values up to 512 characters.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
MAX_USER_CHARS = 256

# Accepted only when absent, null or at the value that changes nothing.
_NOOP_VALUES: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "parallel_tool_calls": (True, False),  # meaningless without tools, which are refused
    "modalities": (["text"],),
    "stream_options": (),  # validated below
}
_REFUSED = {
    "tools": "Tool calling is not supported.",
    "tool_choice": "Tool calling is not supported.",
    "functions": "Function calling is not supported.",
    "function_call": "Function calling is not supported.",
    "top_logprobs": "logprobs are not supported.",
    "logit_bias": "logit_bias is not supported.",
    "audio": "Audio output is not supported.",
    "prediction": "Predicted outputs are not supported.",
    "web_search_options": "Web search is not supported.",
    "reasoning_effort": "Reasoning models are not served here.",
    "service_tier": "service_tier is not supported; your plan decides the priority.",
}
_SUPPORTED = {
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_completion_tokens",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "user",
    "store",
    "logprobs",
    "parallel_tool_calls",
    "modalities",
    "response_format",
    "metadata",
}


@dataclass
class ChatRequest:
    """A validated request. ``messages`` are ``{"role", "content"}`` with ``content`` a string and
    ``developer`` folded into ``system``; ``sampling`` holds only the parameters the caller set (keys
    ``temperature``, ``top_p``, ``stop``, ``seed``, ``max_tokens``, ``presence_penalty``,
    ``frequency_penalty``); ``max_tokens_param`` names the parameter ``max_tokens`` came from. ``user`` and
    ``metadata`` are stored with the completion."""

    model: str
    messages: list[dict[str, str]]
    stream: bool = False
    include_usage: bool = False
    store: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens_param: str = "max_tokens"
    user: str = ""
    metadata: dict[str, str] | None = None


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"'{name}' must be a number.", param=name)
    if not low <= value <= high:
        raise invalid(f"'{name}' must be between {low:g} and {high:g}; got {value}.", param=name)
    return float(value)


def _integer(body: dict, name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{name}' must be an integer.", param=name)
    if not low <= value <= high:
        raise invalid(f"'{name}' must be between {low} and {high}; got {value}.", param=name)
    return value


def _boolean(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean.", param=name)
    return value


def _content(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"'{param}' must be a string or an array of text parts.", param=param)
    texts = []
    for j, part in enumerate(content):
        part_param = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise invalid(f"'{part_param}' must be an object.", param=part_param)
        if part.get("type") != "text":
            raise invalid(
                f"Content parts of type {part.get('type')!r} are not supported; only 'text'.",
                param=f"{part_param}.type",
            )
        if not isinstance(part.get("text"), str):
            raise invalid(f"'{part_param}.text' must be a string.", param=f"{part_param}.text")
        texts.append(part["text"])
    return "".join(texts)


def _messages(value: Any, max_chars: int) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise invalid("'messages' must be a non-empty array.", param="messages")
    messages = []
    for i, item in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"'{param}' must be an object.", param=param)
        role = item.get("role")
        if role not in ROLES:
            raise invalid(
                f"'{param}.role' must be one of {', '.join(ROLES)}; got {role!r}.", param=f"{param}.role"
            )
        for key in item:
            if key not in ("role", "content", "name"):
                raise invalid(f"'{param}.{key}' is not supported.", param=f"{param}.{key}")
        if item.get("content") is None:
            raise invalid(f"'{param}.content' is required.", param=f"{param}.content")
        content = _content(item["content"], f"{param}.content")
        if len(content) > max_chars:
            raise invalid(
                f"'{param}.content' is longer than {max_chars} characters.", param=f"{param}.content"
            )
        messages.append({"role": "system" if role == "developer" else role, "content": content})
    # Empty turns are left out of a reply's context, so a request whose user turns are all empty would
    # reach the worker with nothing to answer (found by schemathesis: it ended as a failed reply, a 500).
    if not any(m["role"] == "user" and m["content"] for m in messages):
        raise invalid("'messages' must contain at least one user message with text.", param="messages")
    return messages


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("'stop' must be a non-empty string or an array of them.", param="stop")
    if len(stops) > MAX_STOP:
        raise invalid(f"'stop' takes at most {MAX_STOP} sequences.", param="stop")
    return stops


def parse_chat_request(body: Any, *, max_message_chars: int) -> ChatRequest:
    """Validate a decoded JSON body. Raises :class:`api.errors.ApiError` (400, ``param`` set) at the first
    problem."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    for name in body:
        if name in _REFUSED:
            if body[name] is None:
                continue
            raise invalid(_REFUSED[name], param=name, code="unsupported_parameter")
        if name not in _SUPPORTED:
            raise invalid(
                f"Unrecognized request argument supplied: {name}", param=name, code="unsupported_parameter"
            )
    for name, allowed in _NOOP_VALUES.items():
        value = body.get(name)
        if allowed and value is not None and value not in allowed:
            raise invalid(f"'{name}'={value!r} is not supported.", param=name, code="unsupported_parameter")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise invalid(
            "Only response_format {'type': 'text'} is supported.",
            param="response_format",
            code="unsupported_parameter",
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required.", param="model")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("'user' must be a string.", param="user")
    if user is not None and len(user) > MAX_USER_CHARS:
        raise invalid(f"'user' is longer than {MAX_USER_CHARS} characters.", param="user")
    metadata = _metadata(body.get("metadata"))
    stream = _boolean(body, "stream")
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not stream:
            raise invalid("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
        if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
            raise invalid("'stream_options' supports only 'include_usage'.", param="stream_options")
        include_usage = _boolean(stream_options, "include_usage")

    sampling: dict[str, Any] = {}
    for name, low, high in (
        ("temperature", 0, 2),
        ("top_p", 0, 1),
        ("presence_penalty", -2, 2),
        ("frequency_penalty", -2, 2),
    ):
        value = _number(body, name, low, high)
        if value is not None:
            sampling[name] = value
    if sampling.get("top_p") == 0:
        raise invalid("'top_p' must be greater than 0.", param="top_p")
    seed = _integer(body, "seed", -(2**63), 2**63 - 1)
    if seed is not None:
        sampling["seed"] = seed
    max_completion = _integer(body, "max_completion_tokens", 1, 2**31)
    max_tokens = _integer(body, "max_tokens", 1, 2**31)
    max_tokens_param = "max_completion_tokens" if max_completion is not None else "max_tokens"
    if max_completion is not None or max_tokens is not None:
        sampling["max_tokens"] = max_completion if max_completion is not None else max_tokens
    stop = _stop(body.get("stop"))
    if stop:
        sampling["stop"] = stop
    return ChatRequest(
        model=model,
        messages=_messages(body.get("messages"), max_message_chars),
        stream=stream,
        include_usage=include_usage,
        store=_boolean(body, "store"),
        sampling=sampling,
        max_tokens_param=max_tokens_param,
        user=user or "",
        metadata=metadata,
    )


def check_reply_limit(chat: ChatRequest, *, limit: int) -> None:
    """Refuse a ``max_tokens`` (or ``max_completion_tokens``) above ``limit``, the caller's plan's reply
    limit in tokens: 400 ``invalid_value`` naming the parameter, as OpenAI answers a value above a model's
    limit, instead of capping it silently (OpenAI clients surface the message; none reads a capped value
    anywhere)."""
    asked = chat.sampling.get("max_tokens")
    if asked is not None and asked > limit:
        raise invalid(
            f"'{chat.max_tokens_param}' is too large: {asked}. Your plan allows at most {limit} completion "
            f"tokens per reply.",
            param=chat.max_tokens_param,
            code="invalid_value",
        )


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("'metadata' must be an object.", param="metadata")
    if len(value) > MAX_METADATA_PAIRS:
        raise invalid(f"'metadata' holds at most {MAX_METADATA_PAIRS} pairs.", param="metadata")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise invalid(f"'metadata' keys are at most {MAX_METADATA_KEY} characters.", param="metadata")
        if not isinstance(item, str) or len(item) > MAX_METADATA_VALUE:
            raise invalid(
                f"'metadata.{key}' must be a string of at most {MAX_METADATA_VALUE} characters.",
                param=f"metadata.{key}",
            )
    return dict(value)
