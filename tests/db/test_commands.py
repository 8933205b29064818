import io
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts.management.commands.bootstrap import Command as Bootstrap
from accounts.models import User
from billing.models import Tier

pytestmark = pytest.mark.django_db


def test_bootstrap_is_idempotent(monkeypatch):
    monkeypatch.setenv("DJANGO_SUPERUSER_EMAIL", "ops@example.com")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "Ops-secret-123")
    Tier.objects.filter(name="paid").delete()
    call_command("bootstrap", stdout=io.StringIO())
    call_command("bootstrap", stdout=io.StringIO())
    assert set(Tier.objects.values_list("name", flat=True)) == {"free", "paid"}
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("Ops-secret-123")
    assert User.objects.filter(is_superuser=True).count() == 1


def test_bootstrap_step_skips_admin_without_variables():
    out = io.StringIO()
    command = Bootstrap(stdout=out)
    assert command.ensure_superuser(username="admin", email="", password="") is None
    assert "skipped" in out.getvalue()
    assert not User.objects.filter(username="admin").exists()


def test_bootstrap_step_refuses_half_configured_admin():
    with pytest.raises(CommandError, match="both"):
        Bootstrap(stdout=io.StringIO()).ensure_superuser(username="admin", email="a@example.com", password="")


def test_bootstrap_step_leaves_existing_admin_password(make_user):
    make_user("admin", password="Original-pw-1", is_superuser=True, is_staff=True)
    Bootstrap(stdout=io.StringIO()).ensure_superuser(
        username="admin", email="x@example.com", password="New-pw-222"
    )
    assert User.objects.get(username="admin").check_password("Original-pw-1")


def _manage(*args, **env):
    unset = ("SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ALLOW_ASYNC_UNSAFE")
    full_env = {k: v for k, v in os.environ.items() if k not in unset}
    full_env.update(env, DJANGO_SETTINGS_MODULE="chatsite.settings.prod")
    return subprocess.run([sys.executable, "manage.py", *args], capture_output=True, text=True, env=full_env)


def test_prod_settings_refuse_to_start_without_secret_key():
    result = _manage("check", ALLOWED_HOSTS="chat.example.com")
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_prod_settings_refuse_to_start_without_allowed_hosts():
    result = _manage("check", SECRET_KEY="x" * 60)
    assert result.returncode != 0
    assert "ALLOWED_HOSTS" in result.stderr


def test_check_deploy_is_clean_with_prod_settings():
    result = _manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY="k3y-" + "z9Q" * 20,
        ALLOWED_HOSTS="chat.example.com",
    )
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout
