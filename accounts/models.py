"""The custom user model (present from the first migration, as Django recommends)."""

from django.contrib.auth.models import AbstractUser
from django.db import models

from billing.models import default_tier_id


class User(AbstractUser):
    """A person who chats. Every user belongs to exactly one tier: ``free`` unless an operator changes it."""

    tier = models.ForeignKey("billing.Tier", on_delete=models.PROTECT, related_name="users")
    # Copied into each new conversation's system prompt (editable per conversation afterwards).
    default_system_prompt = models.TextField(blank=True, default="", max_length=4000)

    def save(self, *args, **kwargs):
        # Not a field default: Django instantiates the user model in system checks, before any table exists.
        if self.tier_id is None:
            self.tier_id = default_tier_id()
        super().save(*args, **kwargs)
