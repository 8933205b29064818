"""Admin: tiers (thresholds, routing, backoff), usage per user and per tier, quota grants, upgrade requests,
model prices. Changing a user's tier is on the user admin (``accounts/admin.py``, editable in the list)."""

from datetime import timedelta

from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from billing.models import DailyQuota, ModelPrice, QuotaGrant, Tier, UpgradeRequest, UsageRecord
from billing.quota import quota_grant
from billing.selectors import top_users, usage_per_tier
from billing.services import UpgradeError, upgrade_request_approve, upgrade_request_reject


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "display_name",
        "model_name",
        "degrade_to_model",
        "admit_max_wait_s",
        "degrade_after_wait_s",
        "requests_per_minute",
        "tokens_per_day",
        "max_reply_tokens",
        "max_context_tokens",
        "queue_priority",
        "max_concurrent_generations",
        "backoff_kind",
        "backoff_base_s",
        "backoff_cap_s",
    )
    list_editable = ("admit_max_wait_s", "degrade_after_wait_s", "degrade_to_model")
    search_fields = ("name", "display_name")
    fieldsets = (
        (None, {"fields": ("name", "display_name", "model_name", "queue_priority")}),
        (
            "Limits",
            {
                "fields": (
                    "requests_per_minute",
                    "tokens_per_day",
                    "max_reply_tokens",
                    "max_context_tokens",
                    "max_concurrent_generations",
                    "memory_budget_tokens",
                )
            },
        ),
        (
            "Under load",
            {
                "description": "Expected wait in seconds (docs/tiers-under-load.md). Above admit_max_wait_s new "
                "requests are refused 'busy'; above degrade_after_wait_s they move to degrade_to_model.",
                "fields": ("admit_max_wait_s", "degrade_to_model", "degrade_after_wait_s"),
            },
        ),
        (
            "Page retry after busy/rate_limited",
            {"fields": ("backoff_kind", "backoff_base_s", "backoff_cap_s")},
        ),
    )


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("created_at", "user", "model_name", "prompt_tokens", "completion_tokens", "message")
    list_filter = ("model_name", "user__tier", ("created_at", admin.DateFieldListFilter))
    search_fields = ("user__username", "user__email")
    date_hierarchy = "created_at"
    list_select_related = ("user",)
    raw_id_fields = ("user", "message")
    readonly_fields = ("created_at",)
    change_list_template = "admin/billing/usagerecord/change_list.html"

    def get_urls(self):
        return [
            path("summary/", self.admin_site.admin_view(self.summary_view), name="billing_usage_summary")
        ] + super().get_urls()

    def summary_view(self, request):
        """Usage per tier and the top users over the last ``days`` days (default 30)."""
        try:
            days = max(1, min(366, int(request.GET.get("days", 30))))
        except ValueError:
            days = 30
        until = timezone.now()
        since = until - timedelta(days=days)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Usage per tier and top users, last {days} days",
            "days": days,
            "per_tier": usage_per_tier(since=since, until=until),
            "top": top_users(since=since, until=until, limit=20),
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/billing/usage_summary.html", context)


@admin.register(DailyQuota)
class DailyQuotaAdmin(admin.ModelAdmin):
    list_display = ("day", "user", "used_tokens", "reserved_tokens", "granted_tokens")
    list_filter = ("day", "user__tier")
    search_fields = ("user__username",)
    list_select_related = ("user",)
    raw_id_fields = ("user",)
    # The ledger is written only by billing/quota.py (reserve/settle/grant); grants go through QuotaGrant.
    readonly_fields = ("user", "day", "used_tokens", "reserved_tokens", "granted_tokens")

    def has_add_permission(self, request):
        return False


@admin.register(QuotaGrant)
class QuotaGrantAdmin(admin.ModelAdmin):
    """Grant extra tokens for one day: adding a grant raises that day's allowance at once."""

    list_display = ("created_at", "user", "day", "tokens", "reason", "granted_by")
    search_fields = ("user__username", "reason")
    raw_id_fields = ("user",)
    fields = ("user", "day", "tokens", "reason")
    list_select_related = ("user", "granted_by")

    def get_changeform_initial_data(self, request):
        return {"day": timezone.localdate(), **super().get_changeform_initial_data(request)}

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        grant = quota_grant(
            user=obj.user, tokens=obj.tokens, day=obj.day, reason=obj.reason, granted_by=request.user
        )
        obj.pk = grant.pk
        obj.granted_by = grant.granted_by
        obj.created_at = grant.created_at


@admin.register(UpgradeRequest)
class UpgradeRequestAdmin(admin.ModelAdmin):
    """Pending upgrade requests (the manual payment provider): approve moves the user to the new tier."""

    list_display = ("created_at", "user", "from_tier", "to_tier", "status", "provider", "note", "decided_by")
    list_filter = ("status", "to_tier", "provider")
    search_fields = ("user__username", "user__email", "note")
    list_select_related = ("user", "from_tier", "to_tier", "decided_by")
    readonly_fields = (
        "user",
        "from_tier",
        "to_tier",
        "provider",
        "provider_reference",
        "status",
        "note",
        "created_at",
        "decided_at",
        "decided_by",
    )
    actions = ("approve", "reject")

    def has_add_permission(self, request):
        return False

    def _decide(self, request, queryset, decide, verb):
        done = 0
        for upgrade in queryset:
            try:
                decide(request=upgrade, decided_by=request.user)
                done += 1
            except UpgradeError as exc:
                self.message_user(request, f"{upgrade}: {exc}", messages.WARNING)
        self.message_user(request, f"{verb} {done} request(s).", messages.SUCCESS)

    @admin.action(description="Approve (move the user to the requested tier)")
    def approve(self, request, queryset):
        self._decide(request, queryset, upgrade_request_approve, "Approved")

    @admin.action(description="Reject")
    def reject(self, request, queryset):
        self._decide(request, queryset, upgrade_request_reject, "Rejected")


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    list_display = ("model_name", "prompt_per_million", "completion_per_million", "currency")


from billing import subscription_admin  # noqa: E402,F401  (plans, subscriptions, invoices, webhook events)
