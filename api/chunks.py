"""Shapes of OpenAI Chat Completions responses: the ``chat.completion`` object, ``chat.completion.chunk``
events and the SSE framing (``data: <json>\\n\\n`` ... ``data: [DONE]\\n\\n``)."""

from __future__ import annotations

import json
from typing import Any


def completion_id(message_id: int) -> str:
    """``chatcmpl-<reply id>``: every chunk of one completion carries it."""
    return f"chatcmpl-{message_id}"


def usage_of(done: dict[str, Any]) -> dict[str, int]:
    """OpenAI ``usage`` from a ``done`` frame."""
    prompt = done["usage"]["prompt_tokens"]
    completion = done["usage"]["completion_tokens"]
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(*, id: str, created: int, model: str, content: str, finish_reason: str, usage: dict) -> dict:
    """A non-streamed ``chat.completion`` object with one choice."""
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
    }


def chunk(
    *,
    id: str,
    created: int,
    model: str,
    delta: dict | None = None,
    finish_reason: str | None = None,
    usage: dict | None = None,
    include_usage: bool = False,
    final_usage: bool = False,
) -> dict:
    """One ``chat.completion.chunk``. With ``include_usage`` every chunk has ``usage: null`` except the final
    one, which has empty ``choices`` and the ``usage`` (OpenAI's order)."""
    body: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": []
        if final_usage
        else [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:
        body["usage"] = usage if final_usage else None
    return body


def sse(data: dict | str) -> bytes:
    """One server-sent event carrying ``data`` (a dict is sent as compact JSON)."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {text}\n\n".encode()


DONE = b"data: [DONE]\n\n"
