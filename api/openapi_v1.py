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

from api import openai_schemas as schemas

JSON = "application/json"


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


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
                "CreateChatCompletionRequest": schemas.CHAT_REQUEST,
                "CreateChatCompletionResponse": schemas.COMPLETION,
                "ChatCompletionStreamEvent": schemas.STREAM_EVENT,
                "Model": schemas.MODEL,
                "ListModelsResponse": {
                    "type": "object",
                    "properties": {
                        "object": {"const": "list"},
                        "data": {"type": "array", "items": _ref("Model")},
                    },
                    "required": ["object", "data"],
                },
                "CreateModerationRequest": schemas.MODERATION_REQUEST,
                "CreateModerationResponse": schemas.MODERATION,
                "ErrorResponse": schemas.ERROR,
            },
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearerAuth": []}],
    }
