"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and the mapping of admission
control refusals to HTTP statuses and headers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from django.http import JsonResponse
from django_ratelimit.core import get_usage


@dataclass
class ApiError(Exception):
    """An error answered as ``status`` with OpenAI's error body; ``headers`` are added to the response."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response


def invalid(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    """400 ``invalid_request_error`` naming the bad ``param``."""
    return ApiError(400, message, param=param, code=code)


def invalid_api_key(message: str = "Incorrect API key provided.") -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code="invalid_api_key")


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def _retry_after(seconds: float | None) -> str:
    return str(max(1, math.ceil(seconds or 1)))


def rate_limit_headers(*, user, usage: dict | None = None) -> dict[str, str]:
    """``x-ratelimit-*-requests`` from django-ratelimit's counter of the ``generation`` group (key
    ``user:<pk>``, the one admission control counts): ``usage`` as admission counted it
    (``Admission.rate_usage``, no read: docs/overhead-levers.md lever 49), else read without incrementing it."""
    if usage is None:
        usage = get_usage(
            None,
            group="generation",
            key=lambda group, request: f"user:{user.pk}",
            rate=f"{user.tier.requests_per_minute}/m",
            increment=False,
        )
    if not usage:
        return {}
    return {
        "x-ratelimit-limit-requests": str(usage["limit"]),
        "x-ratelimit-remaining-requests": str(max(0, usage["limit"] - usage["count"])),
        "x-ratelimit-reset-requests": f"{max(0, usage['time_left'])}s",
    }


def from_admission(refused, *, user) -> ApiError:
    """HTTP form of ``conversations.admission.AdmissionRefused`` (only its ``code``, ``message`` and
    ``retry_after`` are read): ``busy``/``no_workers`` 503, ``rate_limited`` 429 + rate-limit headers,
    ``quota_exceeded`` 429 ``insufficient_quota`` (not retryable), ``too_many_generations`` 429."""
    code, retry = refused.code, _retry_after(refused.retry_after)
    if code in ("busy", "no_workers"):
        return ApiError(503, refused.message, type="server_error", code=code, headers={"Retry-After": retry})
    if code == "quota_exceeded":
        return ApiError(
            429,
            refused.message,
            type="insufficient_quota",
            code="insufficient_quota",
            headers={"x-should-retry": "false"},
        )
    if code == "rate_limited":
        headers = {"Retry-After": retry, **rate_limit_headers(user=user)}
        return ApiError(429, refused.message, type="requests", code="rate_limit_exceeded", headers=headers)
    # too_many_generations, and any code admission control adds later: a limit that clears by waiting.
    return ApiError(429, refused.message, type="requests", code=code, headers={"Retry-After": retry})


def content_policy_violation(message: str) -> ApiError:
    """400 ``content_policy_violation`` (OpenAI's code for a prompt its moderation refused)."""
    return ApiError(
        400, message, type="invalid_request_error", param="messages", code="content_policy_violation"
    )


def completion_failed(done: dict) -> ApiError:
    """500 for a reply whose ``done`` frame says it ended without completing (failed, interrupted, or
    cancelled elsewhere); ``code`` is that status."""
    status = done.get("status")
    message = done.get("error") or f"The completion ended as {status}."
    return ApiError(500, message, type="server_error", code=status)
