from django.contrib import admin

from conversations.models import Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    can_delete = False
    show_change_link = True
    fields = (
        "created_at",
        "role",
        "status",
        "content",
        "model_name",
        "prompt_tokens",
        "completion_tokens",
        "ttft_ms",
    )
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "owner", "created_at", "updated_at")
    list_filter = (("created_at", admin.DateFieldListFilter), "owner__tier")
    search_fields = ("title", "owner__username", "owner__email")
    list_select_related = ("owner",)
    raw_id_fields = ("owner",)
    date_hierarchy = "created_at"
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "conversation",
        "role",
        "status",
        "finish_reason",
        "model_name",
        "completion_tokens",
        "ttft_ms",
        "created_at",
    )
    list_filter = ("role", "status", "finish_reason", "model_name")
    search_fields = ("content", "conversation__owner__username")
    raw_id_fields = ("conversation",)
    list_select_related = ("conversation",)
    readonly_fields = ("created_at", "updated_at")
