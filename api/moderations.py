"""``POST /v1/moderations`` in OpenAI's shape, answered by chatsite's own guard chain (``safety.chain``)
under the caller's tier policy, so LibreChat's moderation setting or a LiteLLM guardrail can point at it.

Request: ``{"input": str | [str] | [{"type": "text", "text": str}], "model": optional}``. Response:
``{"id": "modr-...", "model", "results": [{"flagged", "categories": {name: bool}, "category_scores":
{name: float}}]}``, one result per input. ``categories`` holds OpenAI's 13 names (false / 0.0 where no
chatsite guard scores them; offensive language from the classifier is reported as ``harassment``) plus
chatsite's own (``prompt_injection``, ``invisible_unicode``, ``secret``, ``repetition``, ``profanity``).
API-key auth; rate-limited per user at the tier's requests per minute (a counter apart from completions).
"""

from __future__ import annotations

import json
import uuid

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from api.auth import user_for_request
from api.errors import ApiError, invalid
from conversations.rate_window import rate_hit
from database.connections import closes_connections
from safety.chain import chain_run

MODEL = "chatsite-moderation-1"
OPENAI_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/instructions",
    "self-harm/intent",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
CHATSITE_CATEGORIES = ("prompt_injection", "invisible_unicode", "secret", "repetition", "profanity")
#: chatsite categories also reported under an OpenAI name.
ALIASES = {"profanity": "harassment"}
MAX_INPUTS = 64


def _inputs(body) -> list[str]:
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and len(value) <= MAX_INPUTS:
        texts = []
        for item in value:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
                texts.append(item["text"])
            else:
                raise invalid(
                    "Each input must be a string or a {'type': 'text', 'text': ...} object.", param="input"
                )
        return texts
    raise invalid(f"'input' must be a string or a list of 1 to {MAX_INPUTS} strings.", param="input")


def _rate_limit(user) -> None:
    limit = user.tier.requests_per_minute
    usage = rate_hit(group="moderation", value=f"user:{user.pk}", rate=f"{limit}/m")  # one round trip
    if usage and usage["should_limit"]:
        raise ApiError(
            429,
            f"Your plan allows {limit} moderation requests per minute.",
            type="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(max(1, usage["time_left"]))},
        )


def _result(text: str, user) -> dict:
    verdict = chain_run(text=text, stage="input", tier=user.tier, user_id=user.pk)
    scores = {name: 0.0 for name in OPENAI_CATEGORIES + CHATSITE_CATEGORIES}
    for category, score in verdict.category_scores().items():
        scores[category] = max(score, scores.get(category, 0.0))
        alias = ALIASES.get(category)
        if alias:
            scores[alias] = max(score, scores[alias])
    hit = set(verdict.categories)
    hit |= {ALIASES[c] for c in verdict.categories if c in ALIASES}
    return {
        "flagged": verdict.flagged,
        "categories": {name: name in hit for name in scores},
        "category_scores": scores,
    }


@csrf_exempt
@require_POST
@closes_connections
def moderations(request):
    """``POST /v1/moderations``; errors in OpenAI's shape (401 ``invalid_api_key``, 400, 429)."""
    try:
        user = user_for_request(request)
        if len(request.body) > settings.API_MAX_BODY_BYTES:
            raise invalid(f"The request body is larger than {settings.API_MAX_BODY_BYTES} bytes.")
        try:
            body = json.loads(request.body)
        except (UnicodeDecodeError, ValueError) as exc:
            raise invalid("We could not parse the JSON body of your request.", code="invalid_json") from exc
        texts = _inputs(body)
        model = body.get("model")
        if model is not None and not isinstance(model, str):  # found by schemathesis: {} was echoed back
            raise invalid("'model' must be a string.", param="model")
        _rate_limit(user)
    except ApiError as error:
        return error.response()
    model = model or MODEL
    return JsonResponse(
        {"id": f"modr-{uuid.uuid4().hex}", "model": model, "results": [_result(t, user) for t in texts]}
    )
