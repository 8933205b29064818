"""Admin for API keys: an admin creates a key for a user (the secret is shown once, in the success message)
and revokes keys; the stored hash is never shown."""

from django.contrib import admin, messages
from django.utils import timezone

from api.models import ApiKey
from api.services import api_key_create, api_key_revoke


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("__str__", "user", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at", "created_at")
    search_fields = ("prefix", "name", "user__username", "user__email")
    list_select_related = ("user",)
    raw_id_fields = ("user",)
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        return (
            ("user", "name")
            if obj is None
            else ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
        )

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else ("user", "prefix", "created_at", "last_used_at", "revoked_at")

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["name"])
            return
        created, raw_key = api_key_create(user=obj.user, name=obj.name)
        obj.pk, obj.prefix, obj.key_hash, obj.created_at = (
            created.pk,
            created.prefix,
            created.key_hash,
            created.created_at,
        )
        messages.warning(
            request, f"New API key for {obj.user}: {raw_key} — copy it now, it will not be shown again."
        )

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        for api_key in queryset.filter(revoked_at__isnull=True):
            api_key_revoke(api_key=api_key)
        self.message_user(request, f"Revoked at {timezone.now():%H:%M:%S}.")
