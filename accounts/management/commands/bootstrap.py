"""``manage.py bootstrap``: idempotent first-run set-up.

Ensures the default tiers exist and, when ``DJANGO_SUPERUSER_EMAIL`` and ``DJANGO_SUPERUSER_PASSWORD`` are
set, an admin user (username ``DJANGO_SUPERUSER_USERNAME``, default ``admin``). Running it twice changes
nothing the second time; an existing admin's password is left alone.
"""

import os

from django.core.management.base import BaseCommand, CommandError

from accounts.models import User
from billing.services import tiers_ensure


class Command(BaseCommand):
    help = "Ensure default tiers and (from DJANGO_SUPERUSER_* variables) an admin user exist."

    def handle(self, *args, **options):
        self.ensure_tiers()
        self.ensure_superuser(
            username=os.environ.get("DJANGO_SUPERUSER_USERNAME", "admin"),
            email=os.environ.get("DJANGO_SUPERUSER_EMAIL", ""),
            password=os.environ.get("DJANGO_SUPERUSER_PASSWORD", ""),
        )

    def ensure_tiers(self) -> None:
        tiers = tiers_ensure()
        self.stdout.write(f"tiers: {', '.join(t.name for t in tiers)}")

    def ensure_superuser(self, *, username: str, email: str, password: str) -> User | None:
        if not email and not password:
            self.stdout.write("admin: skipped (DJANGO_SUPERUSER_EMAIL / _PASSWORD not set)")
            return None
        if not (email and password):
            raise CommandError("set both DJANGO_SUPERUSER_EMAIL and DJANGO_SUPERUSER_PASSWORD, or neither")
        user = User.objects.filter(username=username).first()
        if user is not None:
            self.stdout.write(f"admin: {username} exists")
            return user
        user = User.objects.create_superuser(username=username, email=email, password=password)
        self.stdout.write(self.style.SUCCESS(f"admin: created {username}"))
        return user
