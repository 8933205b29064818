from django.contrib import admin

from billing.models import Tier, UsageRecord


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "display_name",
        "model_name",
        "requests_per_minute",
        "tokens_per_day",
        "max_reply_tokens",
        "max_context_tokens",
        "queue_priority",
        "max_concurrent_generations",
    )
    search_fields = ("name", "display_name")


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("created_at", "user", "model_name", "prompt_tokens", "completion_tokens", "message")
    list_filter = ("model_name", "user__tier", ("created_at", admin.DateFieldListFilter))
    search_fields = ("user__username", "user__email")
    date_hierarchy = "created_at"
    list_select_related = ("user",)
    raw_id_fields = ("user", "message")
    readonly_fields = ("created_at",)
