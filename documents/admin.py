from django.contrib import admin

from documents.models import Document


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    """Read-only: files are added and removed by their owners (removing here would skip the chunk delete)."""

    list_display = (
        "name",
        "owner",
        "conversation",
        "kind",
        "size_bytes",
        "pages",
        "status",
        "chunk_count",
        "created_at",
    )
    list_filter = ("status", "kind")
    search_fields = ("name", "owner__username")
    readonly_fields = [f.name for f in Document._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
