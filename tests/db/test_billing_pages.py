"""Usage page, upgrade requests (manual payment provider), billing admin and ``manage.py usage_report``."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from billing.models import DailyQuota, ModelPrice, QuotaGrant, Tier, UpgradeRequest, UsageRecord
from billing.quota import quota_day, quota_status
from billing.services import (
    UpgradeError,
    upgrade_request_approve,
    upgrade_request_create,
    usage_record_create,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, make_user):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


def record(user, model="m", prompt=10, completion=5, days_ago=0):
    r = usage_record_create(
        user=user, message=None, model_name=model, prompt_tokens=prompt, completion_tokens=completion
    )
    if days_ago:
        UsageRecord.objects.filter(pk=r.pk).update(created_at=timezone.now() - timedelta(days=days_ago))
    return r


def test_usage_page_shows_today_month_per_model_with_cost_quota_chart_and_limits(client, alice):
    ModelPrice.objects.create(
        model_name="m", prompt_per_million=Decimal("1"), completion_per_million=Decimal("2")
    )
    record(alice, prompt=1_000_000, completion=500_000)
    record(alice, model="other", prompt=3, completion=4, days_ago=3)
    DailyQuota.objects.create(
        user=alice, day=quota_day(), used_tokens=1500, reserved_tokens=500, granted_tokens=100
    )
    client.force_login(alice)
    response = client.get(reverse("billing:usage"))
    assert response.status_code == 200
    html = response.content.decode()
    [today] = response.context["today_rows"]
    assert (today["model_name"], today["prompt_tokens"], today["cost"]) == ("m", 1_000_000, Decimal("2"))
    assert "2.0000" in html
    assert (
        f"{alice.tier.tokens_per_day + 100 - 2000} of {alice.tier.tokens_per_day + 100} tokens left" in html
    )
    assert html.count("<rect") == 30 and "<svg" in html
    assert response.context["days"][-1]["total_tokens"] == 1_500_000
    assert response.context["days"][-4]["total_tokens"] == 7
    assert "doubling up to 160 s" in html  # free tier's backoff


def test_usage_page_needs_login(client):
    response = client.get(reverse("billing:usage"))
    assert response.status_code == 302 and "login" in response.url


def test_upgrade_request_is_filed_once_then_approved_by_an_admin(alice, make_user):
    from django.test import Client

    client, admin_client = Client(), Client()
    admin_client.force_login(make_user("root", is_staff=True, is_superuser=True))
    paid = Tier.objects.get(name="paid")
    client.force_login(alice)
    assert client.get(reverse("billing:upgrade")).status_code == 200
    response = client.post(reverse("billing:upgrade"), {"tier": paid.pk, "note": "invoice me"})
    assert response.status_code == 302
    second = client.post(reverse("billing:upgrade"), {"tier": paid.pk}, follow=True)
    assert "already have a pending request" in second.content.decode()
    request = UpgradeRequest.objects.get()
    assert (request.status, request.provider, request.to_tier, request.note) == (
        "pending",
        "manual",
        paid,
        "invoice me",
    )
    alice.refresh_from_db()
    assert alice.tier.name == "free"  # nothing changes before an admin decides

    changelist = reverse("admin:billing_upgraderequest_changelist")
    assert admin_client.get(changelist, {"status__exact": "pending"}).status_code == 200
    admin_client.post(changelist, {"action": "approve", "_selected_action": [request.pk]})
    request.refresh_from_db()
    alice.refresh_from_db()
    assert request.status == "approved" and request.decided_by.username == "root"
    assert alice.tier == paid
    with pytest.raises(UpgradeError):
        upgrade_request_approve(request=request)


def test_upgrade_to_own_tier_and_unknown_tier_are_refused(client, alice):
    client.force_login(alice)
    with pytest.raises(UpgradeError):
        upgrade_request_create(user=alice, to_tier=alice.tier)
    response = client.post(reverse("billing:upgrade"), {"tier": "nope"}, follow=True)
    assert "Choose a plan" in response.content.decode()
    assert not UpgradeRequest.objects.exists()


def test_user_can_withdraw_a_pending_request(client, alice, bob):
    request, url = upgrade_request_create(user=alice, to_tier=Tier.objects.get(name="paid"))
    assert url is None
    client.force_login(bob)
    client.post(reverse("billing:upgrade_cancel", args=[request.pk]))
    request.refresh_from_db()
    assert request.status == "pending"  # not bob's
    client.force_login(alice)
    client.post(reverse("billing:upgrade_cancel", args=[request.pk]))
    request.refresh_from_db()
    assert request.status == "cancelled"


def test_admin_grant_raises_todays_allowance(admin_client, alice):
    response = admin_client.post(
        reverse("admin:billing_quotagrant_add"),
        {"user": alice.pk, "day": quota_day().isoformat(), "tokens": 1234, "reason": "apology"},
    )
    assert response.status_code == 302
    grant = QuotaGrant.objects.get()
    assert (grant.tokens, grant.granted_by.username) == (1234, "root")
    assert quota_status(user=alice).granted == 1234


@pytest.mark.parametrize(
    "name",
    [
        "admin:billing_dailyquota_changelist",
        "admin:billing_quotagrant_changelist",
        "admin:billing_upgraderequest_changelist",
        "admin:billing_modelprice_changelist",
        "admin:billing_usage_summary",
        "admin:billing_tier_changelist",
    ],
)
def test_billing_admin_pages_load(admin_client, name, alice):
    record(alice)
    assert admin_client.get(reverse(name)).status_code == 200


def test_admin_usage_summary_per_tier_and_top_users(admin_client, alice, bob, make_user):
    carol = make_user("carol", tier="paid")
    record(alice, prompt=10, completion=0)
    record(bob, prompt=20, completion=0)
    record(carol, prompt=100, completion=0)
    response = admin_client.get(reverse("admin:billing_usage_summary"), {"days": 7})
    per_tier = {r["tier"]: (r["users"], r["total_tokens"]) for r in response.context["per_tier"]}
    assert per_tier == {"free": (2, 30), "paid": (1, 100)}
    assert [r["username"] for r in response.context["top"]] == ["carol", "bob", "alice"]


class TestUsageReport:
    def test_report_per_tier_model_and_top_users_within_the_dates(self, alice, make_user, capsys):
        carol = make_user("carol", tier="paid")
        record(alice, prompt=10, completion=5)
        record(carol, model="big", prompt=100, completion=50)
        record(carol, prompt=1, completion=1, days_ago=40)  # outside the window
        today = timezone.localdate()
        call_command(
            "usage_report", "--from", (today - timedelta(days=1)).isoformat(), "--to", today.isoformat()
        )
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert any(line.split()[:6] == ["paid", "1", "1", "100", "50", "150"] for line in lines)
        assert any(line.split()[:6] == ["free", "1", "1", "10", "5", "15"] for line in lines)
        top = lines[lines.index(next(line for line in lines if line.startswith("Top"))) + 2].split()
        assert top == ["carol", "paid", "1", "150"]

    def test_tier_filter_and_bad_arguments(self, alice, make_user, capsys):
        carol = make_user("carol", tier="paid")
        record(alice)
        record(carol)
        today = timezone.localdate().isoformat()
        call_command("usage_report", "--from", today, "--to", today, "--tier", "free")
        out = capsys.readouterr().out
        assert "alice" in out and "carol" not in out
        with pytest.raises(CommandError, match="unknown tier"):
            call_command("usage_report", "--from", today, "--to", today, "--tier", "gold")
        with pytest.raises(CommandError, match="before"):
            call_command("usage_report", "--from", today, "--to", "2000-01-01")
        with pytest.raises(CommandError, match="not a date"):
            call_command("usage_report", "--from", "yesterday", "--to", today)
