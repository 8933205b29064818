from django.contrib import admin

from organizations.models import Invitation, Membership, Organization


class MembershipInline(admin.TabularInline):
    model = Membership
    raw_id_fields = ("user",)
    extra = 0


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name", "memberships__user__username")
    inlines = [MembershipInline]


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ("email", "organization", "role", "created_at", "expires_at", "accepted_at")
    search_fields = ("email", "organization__name")
    raw_id_fields = ("invited_by", "accepted_by")
    readonly_fields = ("token",)
