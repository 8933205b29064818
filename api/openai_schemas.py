"""JSON Schemas of the OpenAI-compatible ``/v1`` request and response bodies, as components of the OpenAPI
document in :mod:`api.openapi_v1`. Shapes follow OpenAI's own OpenAPI document for the same operations,
narrowed to what is served here (``n`` only 1, text content parts only, ...)."""

from __future__ import annotations


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],  # other keys of a part are ignored
}
_MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "name": {"type": "string"},
    },
    "required": ["role", "content"],
    "additionalProperties": False,
}
_USER_MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"const": "user"},
        "content": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1}]},
    },
    "required": ["role", "content"],
}


def _number(low: float, high: float, description: str) -> dict:
    return _nullable({"type": "number", "minimum": low, "maximum": high, "description": description})


CHAT_REQUEST = {
    "type": "object",
    "properties": {
        "model": {
            "type": "string",
            "minLength": 1,
            "description": "A model your plan may use (GET /v1/models).",
        },
        "messages": {
            "type": "array",
            "items": _MESSAGE,
            "minItems": 1,
            "contains": _USER_MESSAGE,
            "description": "At least one user message with text; `developer` is treated as `system`.",
        },
        "stream": _nullable({"type": "boolean"}),
        "stream_options": _nullable(
            {
                "type": "object",
                "properties": {"include_usage": _nullable({"type": "boolean"})},
                "additionalProperties": False,
                "description": "Only with `stream: true`.",
            }
        ),
        "max_tokens": _nullable(
            {
                "type": "integer",
                "minimum": 1,
                "description": "At most your plan's reply limit; a larger value is a 400 with "
                "`param: \"max_tokens\"` (OpenAI's answer to a value above the model's limit).",
            }
        ),
        "max_completion_tokens": _nullable(
            {"type": "integer", "minimum": 1, "description": "As `max_tokens` (wins when both are given)."}
        ),
        "temperature": _number(0, 2, "Sampling temperature."),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "presence_penalty": _number(-2, 2, "Presence penalty."),
        "frequency_penalty": _number(-2, 2, "Frequency penalty."),
        "stop": _nullable(
            {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
                ]
            }
        ),
        "seed": _nullable({"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}),
        "n": _nullable({"const": 1}),
        "logprobs": _nullable({"const": False}),
        "parallel_tool_calls": _nullable({"type": "boolean"}),
        "modalities": _nullable({"type": "array", "items": {"const": "text"}, "minItems": 1, "maxItems": 1}),
        "response_format": _nullable(
            {
                "type": "object",
                "properties": {"type": {"const": "text"}},
                "required": ["type"],
                "additionalProperties": False,
            }
        ),
        "store": _nullable(
            {"type": "boolean", "description": "true keeps the conversation in your history (GET /api/...)."}
        ),
        "user": _nullable(
            {
                "type": "string",
                "maxLength": 256,
                "description": "Your identifier for the end user; stored with the completion.",
            }
        ),
        "metadata": _nullable(
            {
                "type": "object",
                "maxProperties": 16,
                "propertyNames": {"maxLength": 64},
                "additionalProperties": {"type": "string", "maxLength": 512},
                "description": "Up to 16 string pairs (keys up to 64, values up to 512 characters); stored "
                "with the completion.",
            }
        ),
    },
    "required": ["model", "messages"],
    "additionalProperties": False,
}

_USAGE = {
    "type": "object",
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    },
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
}
COMPLETION = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "chat.completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "system_fingerprint": {"type": "null"},
        "choices": {
            "type": "array",
            "minItems": 1,
            "maxItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "index": {"const": 0},
                    "message": {
                        "type": "object",
                        "properties": {
                            "role": {"const": "assistant"},
                            "content": {"type": "string"},
                            "refusal": {"type": "null"},
                        },
                        "required": ["role", "content"],
                    },
                    "logprobs": {"type": "null"},
                    "finish_reason": {"enum": ["stop", "length", "content_filter"]},
                },
                "required": ["index", "message", "finish_reason"],
            },
        },
        "usage": _USAGE,
    },
    "required": ["id", "object", "created", "model", "choices", "usage"],
}
#: One server-sent event of a streamed completion: ``data`` is a ``chat.completion.chunk`` as JSON (the
#: shape of ``CreateChatCompletionResponse`` with ``delta`` for ``message``), an ``{"error": ...}`` object
#: when the reply fails after the stream began, or ``[DONE]`` last.
STREAM_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string", "minLength": 1}},
    "required": ["data"],
}
MODEL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
    "required": ["id", "object", "created", "owned_by"],
}
ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}

#: OpenAI's moderation categories (``omni-moderation``), each a boolean in ``categories`` and a score in
#: ``category_scores``.
MODERATION_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
MODERATION_REQUEST = {
    "type": "object",
    "properties": {
        "input": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                {"type": "array", "items": _TEXT_PART, "minItems": 1},
            ]
        },
        "model": _nullable({"type": "string"}),
    },
    "required": ["input"],
}
MODERATION = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "model": {"type": "string"},
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "flagged": {"type": "boolean"},
                    "categories": {
                        "type": "object",
                        "properties": {name: {"type": "boolean"} for name in MODERATION_CATEGORIES},
                        "additionalProperties": {"type": "boolean"},
                    },
                    "category_scores": {
                        "type": "object",
                        "properties": {name: {"type": "number"} for name in MODERATION_CATEGORIES},
                        "additionalProperties": {"type": "number"},
                    },
                },
                "required": ["flagged", "categories", "category_scores"],
            },
        },
    },
    "required": ["id", "model", "results"],
}
