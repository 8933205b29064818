"""The OpenAPI 3.1 document of the OpenAI-compatible ``/v1`` endpoints, served at ``/v1/openapi.json``.

The ``/v1`` views are plain async Django views (SSE needs an async generator), so this document is written
out here rather than generated; ``tests/integration/test_api_fuzzing.py`` runs schemathesis against it, so a
response that drifts from it (an undocumented status, a body of another shape) fails the suite. Shapes follow
OpenAI's own OpenAPI document for the same operations, narrowed to what is served here (``n`` only 1, text
content parts only, ...). ``POST /v1/moderations`` is listed once a view serves it.
"""

from __future__ import annotations

from django.conf import settings
from django.urls import Resolver404, resolve

JSON = "application/json"


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _error(description: str, *, headers: dict | None = None) -> dict:
    response: dict = {"description": description, "content": {JSON: {"schema": _ref("ErrorResponse")}}}
    if headers:
        response["headers"] = headers
    return response


_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "string"}}
}
_UNAVAILABLE = _error(
    "The database is briefly unavailable (`unavailable`); retry after `Retry-After` seconds.",
    headers=_RETRY_AFTER,
)
_UNAUTHORIZED = _error("No API key, or an unknown or revoked one (`invalid_api_key`).")
_BAD_REQUEST = _error(
    "The request was refused before anything was stored: the parameter named in `error.param` is missing, of "
    "the wrong type or range, unsupported (`unsupported_parameter`), or holds text that cannot be stored."
)

_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
    "additionalProperties": False,
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


_CHAT_REQUEST = {
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
_COMPLETION = {
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
_STREAM_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string", "minLength": 1}},
    "required": ["data"],
}
_MODEL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
    "required": ["id", "object", "created", "owned_by"],
}
_ERROR = {
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
_MODERATION_REQUEST = {
    "type": "object",
    "properties": {
        "input": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                {"type": "array", "items": _TEXT_PART, "minItems": 1},
            ]
        },
        "model": {"type": "string"},
    },
    "required": ["input"],
}
_MODERATION = {
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


def _chat_operation() -> dict:
    example = {
        "model": settings.INFERENCE_DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
    }
    return {
        "operationId": "createChatCompletion",
        "summary": "Create a chat completion (JSON, or server-sent events with `stream: true`)",
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": _ref("CreateChatCompletionRequest"), "example": example}},
        },
        "responses": {
            "200": {
                "description": "A `chat.completion`, or with `stream: true` an SSE stream of "
                "`chat.completion.chunk` events ending in `data: [DONE]`.",
                "content": {
                    JSON: {"schema": _ref("CreateChatCompletionResponse")},
                    "text/event-stream": {"schema": _ref("ChatCompletionStreamEvent")},
                },
            },
            "400": _BAD_REQUEST,
            "401": _UNAUTHORIZED,
            "404": _error("The model does not exist or your plan may not use it (`model_not_found`)."),
            "429": _error(
                "Rate limit, daily quota (`insufficient_quota`) or concurrent-generation limit reached.",
                headers=_RETRY_AFTER,
            ),
            "500": _error("The reply ended without completing (its status is the `code`)."),
            "503": _error(
                "Admission control refused the request (`busy`, `no_workers`) or the database is briefly "
                "unavailable; retry after `Retry-After` seconds.",
                headers=_RETRY_AFTER,
            ),
            "504": _error(
                "The completion took longer than the server's limit and was cancelled (`timeout`)."
            ),
        },
    }


def _moderations_served() -> bool:
    try:
        match = resolve("/v1/moderations")
    except Resolver404:
        return False
    return getattr(match.func, "__name__", "") != "not_found"  # not the catch-all 404


def openapi_document() -> dict:
    """The ``/v1`` OpenAPI 3.1 document as a dict (JSON-serialisable)."""
    paths: dict = {
        "/v1/chat/completions": {"post": _chat_operation()},
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "summary": "The models your plan may use",
                "responses": {
                    "200": {
                        "description": "A list of model objects.",
                        "content": {JSON: {"schema": _ref("ListModelsResponse")}},
                    },
                    "400": _BAD_REQUEST,
                    "401": _UNAUTHORIZED,
                    "503": _UNAVAILABLE,
                },
            }
        },
        "/v1/models/{model}": {
            "get": {
                "operationId": "retrieveModel",
                "summary": "One model your plan may use",
                "parameters": [
                    {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {"description": "The model object.", "content": {JSON: {"schema": _ref("Model")}}},
                    "400": _BAD_REQUEST,
                    "401": _UNAUTHORIZED,
                    "404": _error("No such model for your plan (`model_not_found`)."),
                    "503": _UNAVAILABLE,
                },
            }
        },
    }
    if _moderations_served():
        paths["/v1/moderations"] = {
            "post": {
                "operationId": "createModeration",
                "summary": "Classify text with the guardrail chain (OpenAI's moderation object)",
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": _ref("CreateModerationRequest")}},
                },
                "responses": {
                    "200": {
                        "description": "One result per input.",
                        "content": {JSON: {"schema": _ref("CreateModerationResponse")}},
                    },
                    "400": _BAD_REQUEST,
                    "401": _UNAUTHORIZED,
                    "404": _error("The named moderation model is not served (`model_not_found`)."),
                    "429": _error("Rate limit reached.", headers=_RETRY_AFTER),
                    "503": _UNAVAILABLE,
                },
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "chatsite OpenAI-compatible API",
            "version": "1",
            "description": "OpenAI's Chat Completions, Models and Moderations endpoints, served by this site's "
            "own models. Errors use OpenAI's shape. Authenticate with `Authorization: Bearer cs-...`.",
        },
        "paths": paths,
        "components": {
            "schemas": {
                "CreateChatCompletionRequest": _CHAT_REQUEST,
                "CreateChatCompletionResponse": _COMPLETION,
                "ChatCompletionStreamEvent": _STREAM_EVENT,
                "Model": _MODEL,
                "ListModelsResponse": {
                    "type": "object",
                    "properties": {
                        "object": {"const": "list"},
                        "data": {"type": "array", "items": _ref("Model")},
                    },
                    "required": ["object", "data"],
                },
                "CreateModerationRequest": _MODERATION_REQUEST,
                "CreateModerationResponse": _MODERATION,
                "ErrorResponse": _ERROR,
            },
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearerAuth": []}],
    }
