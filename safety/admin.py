"""The staff review queue (flagged and blocked messages with each verdict, the guard that fired and the
user; staff read the blocked text here) and the per-tier safety policies."""

from django.contrib import admin, messages
from django.utils.html import format_html

from safety.models import ModerationVerdict, SafetyPolicy
from safety.policies import policy_cache_clear
from safety.services import verdict_mark_false_positive
from safety.strikes import strike_apply


class ReviewQueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [("open", "flagged or blocked, not reviewed"), ("all", "every verdict")]

    def queryset(self, request, queryset):
        if self.value() == "all":
            return queryset
        if self.value() == "open" or self.value() is None:
            return queryset.filter(action__in=["flag", "block"], reviewed_at__isnull=True)
        return queryset

    def choices(self, changelist):
        # "open" is the default view: the queue.
        for lookup, title in self.lookup_choices:
            yield {
                "selected": (self.value() or "open") == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


@admin.register(ModerationVerdict)
class ModerationVerdictAdmin(admin.ModelAdmin):
    list_display = (
        "created_at",
        "user",
        "tier",
        "stage",
        "action",
        "guard",
        "category_list",
        "false_positive",
    )
    list_filter = (ReviewQueueFilter, "action", "stage", "guard", "tier", "false_positive")
    search_fields = ("user__username", "user__email", "message__id")
    date_hierarchy = "created_at"
    list_select_related = ("user", "message")
    readonly_fields = (
        "created_at",
        "user",
        "tier",
        "stage",
        "action",
        "guard",
        "categories",
        "results",
        "failures",
        "message_link",
        "message_text",
        "reviewed_at",
        "reviewed_by",
        "strike_outcome",
    )
    fields = readonly_fields + ("false_positive",)
    actions = ["mark_false_positive", "apply_strike_policy"]

    @admin.display(description="categories")
    def category_list(self, obj):
        return ", ".join(obj.categories or []) or "-"

    @admin.display(description="message")
    def message_link(self, obj):
        if obj.message_id is None:
            return "-"
        return format_html(
            '<a href="/admin/conversations/message/{}/change/">message {}</a> ({})',
            obj.message_id,
            obj.message_id,
            obj.message.status,
        )

    @admin.display(description="text judged (staff only; a blocked reply's text is shown nowhere else)")
    def message_text(self, obj):
        return obj.text or (obj.message.content if obj.message_id else "-")

    def has_add_permission(self, request):
        return False

    def save_model(self, request, obj, form, change):
        if "false_positive" in form.changed_data:
            verdict_mark_false_positive(verdict=obj, reviewer=request.user, false_positive=obj.false_positive)
        else:
            super().save_model(request, obj, form, change)

    @admin.action(description="Mark as false positive (no longer a strike)")
    def mark_false_positive(self, request, queryset):
        for verdict in queryset:
            verdict_mark_false_positive(verdict=verdict, reviewer=request.user)
        self.message_user(request, f"{queryset.count()} verdict(s) marked false positive.")

    @admin.action(description="Apply the strike policy to these users")
    def apply_strike_policy(self, request, queryset):
        users = {v.user for v in queryset.select_related("user") if v.user is not None}
        done = [f"{u.username}: {strike_apply(user=u) or 'nothing (under the limit)'}" for u in users]
        self.message_user(request, "; ".join(done) or "No users.", messages.INFO)


@admin.register(SafetyPolicy)
class SafetyPolicyAdmin(admin.ModelAdmin):
    list_display = ("tier", "enabled", "action", "default_threshold", "on_failure", "moderate_output")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        policy_cache_clear()
