"""API keys. Only a SHA-256 digest of each secret is stored (the secret is 256 bits of randomness, so a fast
hash is enough, as GitHub and Stripe do for their tokens); the visible ``prefix`` lets a user tell keys apart."""

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    """A bearer secret ``cs-<prefix>_<secret>`` that acts as its user on ``/v1`` and ``/api``.

    ``revoked_at`` set => refused at once; ``last_used_at``: the last authenticated request, to a minute
    (``api.selectors.LAST_USED_RESOLUTION_S``).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"cs-{self.prefix}_… ({self.name or 'unnamed'})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
