"""Teams: an organisation, its members (owner or member) and invitations.

An organisation is what a paid subscription belongs to (``billing.models.Subscription``): its members
share the plan's daily token pool (``billing/quota.py``). This app knows nothing of billing; billing reads
memberships to pool quotas and to move members between tiers.
"""

from django.conf import settings
from django.db import models


class Organization(models.Model):
    """A team. Created by its first owner; members join through invitations."""

    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    OWNER = "owner"
    MEMBER = "member"


class Membership(models.Model):
    """A user's place in an organisation. A user belongs to at most one organisation, so the token pool a
    reply is charged to is never ambiguous.

    ``daily_token_cap``: optional per-member limit (prompt + completion tokens per quota day) inside the
    organisation's pool; None = only the pool limits this member.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    daily_token_cap = models.PositiveIntegerField(null=True, blank=True)
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["organization", "-role", "user"]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.organization_id} ({self.role})"

    @property
    def is_owner(self) -> bool:
        return self.role == Role.OWNER


class Invitation(models.Model):
    """An owner's invitation for ``email`` to join with ``role``. The link carries ``token`` (unguessable);
    it can be accepted once, by a signed-in user whose e-mail matches, before ``expires_at``."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    token = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.email} -> {self.organization_id}"
