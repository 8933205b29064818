"""Health endpoints, the protected web ``/metrics`` and the staff fleet page. Thin: checks and selectors do
the work."""

from __future__ import annotations

import hmac
import ipaddress
import logging

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from conversations import refusals
from inference import fleet
from observability import metrics  # noqa: F401  (registers the web metrics)
from operations import health, selectors

logger = logging.getLogger(__name__)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. Touches nothing else."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when PostgreSQL, Redis, the broker and at least one ready (not draining) worker are
    fine; otherwise 503 with ``failing`` naming each failing check and ``checks`` giving every result.
    ``workers`` lists each live worker's model, backend (``native``/``vllm``), readiness and health."""
    checks = health.readiness()
    failing = [name for name, result in checks.items() if result != "ok"]
    body = {
        "status": "fail" if failing else "ok",
        "failing": failing,
        "checks": checks,
        "workers": health.workers_summary(),
    }
    # Memory's vector store: shown, never failing readiness (replies go on without recall).
    body["vector_store"] = health.vector_store()
    response = JsonResponse(body, status=503 if failing else 200)
    if failing:
        # "Not ready (yet)" is the probe's answer, e.g. while the first worker loads its model, not a server
        # error: logged at INFO here instead of django.request's ERROR line for every 5xx.
        logger.info("not ready: %s", ", ".join(f"{name} ({checks[name]})" for name in failing))
        response._has_been_logged = True
    return response


def metrics_allowed(request: HttpRequest) -> bool:
    """True with ``Authorization: Bearer <METRICS_BEARER_TOKEN>`` (when one is set) or from an address in
    ``METRICS_ALLOWED_NETWORKS``."""
    token = settings.METRICS_BEARER_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip(), token):
        return True
    try:
        addr = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(net, strict=False) for net in settings.METRICS_ALLOWED_NETWORKS)


@never_cache
@require_GET
def metrics_endpoint(request: HttpRequest) -> HttpResponse:
    """This web process's Prometheus metrics (text exposition format); 403 unless :func:`metrics_allowed`."""
    if not metrics_allowed(request):
        return HttpResponse(
            "Forbidden: a metrics token or an allowed network is required.\n",
            status=403,
            content_type="text/plain",
        )
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


@staff_member_required
@require_GET
def fleet_page(request: HttpRequest) -> HttpResponse:
    """Staff only: live fleet load, TTFT p50/p99 and tokens/s from stored replies, refusals by tier and the
    slowest recent replies with their trace ids. ``?minutes=`` (1..1440, default 15) sets the window."""
    try:
        minutes = min(1440, max(1, int(request.GET.get("minutes", 15))))
    except ValueError:
        minutes = 15
    try:
        workers, recent_refusals = fleet.live_workers(), refusals.refusals_recent(minutes=minutes)
        redis_error = ""
    except Exception as exc:  # the page must still show the database figures during a Redis outage
        workers, recent_refusals, redis_error = [], {}, type(exc).__name__
    return render(
        request,
        "operations/fleet.html",
        {
            "minutes": minutes,
            "workers": workers,
            "redis_error": redis_error,
            "stats": selectors.reply_stats(minutes=minutes),
            "active": selectors.active_replies_by_status(),
            "queued_by_tier": selectors.queued_by_tier(),
            "refusals": sorted((tier, reason, n) for (tier, reason), n in recent_refusals.items()),
            "slowest": selectors.slowest_replies(minutes=minutes),
        },
    )
