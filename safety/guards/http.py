"""A guard that asks any OpenAI-shaped ``POST /v1/moderations`` endpoint (OpenAI's own, chatsite's, a
LlamaGuard or a larger classifier behind an OpenAI-compatible server), so a team can plug in a bigger model
running elsewhere.

Settings: ``SAFETY_HTTP_GUARD_URL`` (the full URL, e.g. ``https://api.openai.com/v1/moderations``),
``SAFETY_HTTP_GUARD_API_KEY`` (sent as ``Authorization: Bearer``), ``SAFETY_HTTP_GUARD_MODEL`` (the
``model`` field; blank leaves it out) and ``SAFETY_HTTP_GUARD_TIMEOUT_S``. The response's
``results[0].category_scores`` become the guard's scores, category names kept as the endpoint spells them
(``harassment``, ``self-harm/intent`` ...). A non-2xx answer, a malformed body or a timeout raises, which
the chain counts as a failure of this guard and settles by the tier's fail-open/closed policy.
"""

from __future__ import annotations

import httpx
from django.conf import settings

from safety.guards.base import Guard, GuardContext, GuardResult


class HttpModerationError(Exception):
    """The endpoint answered with an error status or a body without ``results[0].category_scores``."""


class HttpModerationGuard(Guard):
    """``check`` makes one ``POST`` (httpx, a pooled client per guard instance). Not ``inline``: the chain
    runs it on its thread pool under the policy's timeout as well as the client's own."""

    name = "http"
    inline = False

    def __init__(self, *, url: str | None = None, api_key: str | None = None, model: str | None = None):
        self.url = url if url is not None else settings.SAFETY_HTTP_GUARD_URL
        if not self.url:
            raise ValueError("SAFETY_HTTP_GUARD_URL is not set; remove the HTTP guard from SAFETY_GUARDS")
        self.api_key = api_key if api_key is not None else settings.SAFETY_HTTP_GUARD_API_KEY
        self.model = model if model is not None else settings.SAFETY_HTTP_GUARD_MODEL
        self.version = self.model or "endpoint-default"
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.client = httpx.Client(timeout=settings.SAFETY_HTTP_GUARD_TIMEOUT_S, headers=headers)

    def check(self, text: str, context: GuardContext) -> GuardResult:
        body: dict = {"input": text}
        if self.model:
            body["model"] = self.model
        response = self.client.post(self.url, json=body)
        if response.status_code // 100 != 2:
            raise HttpModerationError(f"moderation endpoint answered HTTP {response.status_code}")
        try:
            result = response.json()["results"][0]
            scores = {str(k): float(v) for k, v in result["category_scores"].items()}
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise HttpModerationError(
                "moderation endpoint answered without results[0].category_scores"
            ) from exc
        return GuardResult(guard=self.name, version=self.version, scores=scores)
