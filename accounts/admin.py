from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from accounts.models import User


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    list_display = ("username", "email", "tier", "is_active", "is_staff", "date_joined", "last_login")
    list_filter = ("tier", "is_active", "is_staff", "is_superuser", "date_joined")
    list_select_related = ("tier",)
    list_editable = ("tier",)
    search_fields = ("username", "email", "first_name", "last_name")
    fieldsets = BaseUserAdmin.fieldsets + (("Plan", {"fields": ("tier",)}),)
    add_fieldsets = BaseUserAdmin.add_fieldsets + (("Plan", {"fields": ("email", "tier")}),)
