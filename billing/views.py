"""The usage page and the upgrade (plan change) page. Thin: read selectors, call services, render."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from billing.models import Tier, UpgradeRequest
from billing.payments import payment_provider
from billing.quota import quota_status
from billing.selectors import start_of_day, tier_backoff, usage_by_model, usage_daily
from billing.services import UpgradeError, upgrade_request_cancel, upgrade_request_create
from billing.subscription_models import Plan
from billing.team_selectors import team_invoices, team_subscription
from organizations.selectors import membership_for_user

CHART_W, CHART_H = 600, 120


def _chart(days: list[dict]) -> dict:
    """Bar geometry of a server-side SVG chart (one bar per day, height ~ total tokens)."""
    peak = max((d["total_tokens"] for d in days), default=0) or 1
    width = CHART_W / len(days)
    bars = []
    for i, day in enumerate(days):
        height = round(day["total_tokens"] / peak * (CHART_H - 10), 1)
        bars.append(
            {
                "x": round(i * width + 1, 1),
                "y": round(CHART_H - height, 1),
                "w": round(width - 2, 1),
                "h": height,
                "day": day["day"],
                "total": day["total_tokens"],
            }
        )
    return {"bars": bars, "peak": peak if peak > 1 else 0, "width": CHART_W, "height": CHART_H}


@login_required
def usage(request):
    """Today's and this month's usage per model (tokens, cost), the remaining quota, a 30-day chart, the
    plan's limits and, for a member of a paying team, the subscription's plan, period and invoices."""
    user = request.user
    membership = membership_for_user(user=user)
    now = timezone.now()
    today = start_of_day(now)
    days = usage_daily(user=user, days=30, now=now)
    context = {
        "tier": user.tier,
        "quota": quota_status(user=user),
        "today_rows": usage_by_model(user=user, since=today),
        "month_rows": usage_by_model(user=user, since=today.replace(day=1)),
        "days": days,
        "chart": _chart(days),
        "backoff": tier_backoff(tier=user.tier),
        "time_zone": timezone.get_current_timezone_name(),
        "membership": membership,
        "subscription": team_subscription(organization_id=membership.organization_id) if membership else None,
        "invoices": team_invoices(organization_id=membership.organization_id) if membership else [],
    }
    return render(request, "billing/usage.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def upgrade(request):
    """The plans, the user's pending request (if any), and a form that files an upgrade request through
    the configured payment provider (built-in: manual approval by an admin)."""
    user = request.user
    if request.method == "POST":
        try:
            tier = Tier.objects.get(pk=int(request.POST.get("tier", "")))
        except (Tier.DoesNotExist, ValueError):
            messages.error(request, "Choose a plan.")
            return redirect("billing:upgrade")
        try:
            _, checkout_url = upgrade_request_create(
                user=user, to_tier=tier, note=request.POST.get("note", "")
            )
        except UpgradeError as exc:
            messages.error(request, str(exc))
            return redirect("billing:upgrade")
        if checkout_url:
            return redirect(checkout_url)
        messages.success(request, payment_provider().pending_message or "Your request was sent.")
        return redirect("billing:upgrade")
    context = {
        "provider": payment_provider().name,
        "online_tiers": set(Plan.objects.filter(active=True).values_list("tier_id", flat=True)),
        "tier": user.tier,
        "tiers": Tier.objects.exclude(name="loadtest").order_by("queue_priority", "name"),
        "pending": UpgradeRequest.objects.filter(user=user, status=UpgradeRequest.Status.PENDING).first(),
        "history": UpgradeRequest.objects.filter(user=user).select_related("to_tier")[:10],
    }
    return render(request, "billing/upgrade.html", context)


@login_required
@require_POST
def upgrade_cancel(request, request_id: int):
    """Withdraw the user's own pending upgrade request."""
    if upgrade_request_cancel(user=request.user, request_id=request_id):
        messages.success(request, "Your upgrade request was withdrawn.")
    return redirect("billing:upgrade")
