"""Log-in throttling (django-axes) on the real log-in view: by account and by client address, with a clear
message, and an admin reset."""

import pytest
from axes.models import AccessAttempt
from axes.utils import reset
from django.conf import settings
from django.core.management import call_command
from django.urls import reverse

pytestmark = pytest.mark.django_db

RIGHT = "pw-Secret-123"


def attempt(client, username, password, ip="10.0.0.1"):
    return client.post(
        reverse("accounts:login"), {"username": username, "password": password}, REMOTE_ADDR=ip
    )


def test_thirty_wrong_passwords_lock_the_account_and_then_the_right_one_is_refused(client, alice):
    statuses = [attempt(client, "alice", f"wrong-{i}").status_code for i in range(30)]
    limit = settings.AXES_FAILURE_LIMIT
    assert statuses[: limit - 1] == [200] * (limit - 1)  # the form again, "wrong password"
    assert set(statuses[limit:]) == {429}
    locked = attempt(client, "alice", RIGHT)
    assert locked.status_code == 429 and b"Too many failed log-ins" in locked.content
    assert "_auth_user_id" not in client.session
    # The lock is per account: from a fresh address the account stays locked.
    assert attempt(client, "alice", RIGHT, ip="10.9.9.9").status_code == 429


def test_one_address_trying_many_accounts_is_locked_out(client, make_user):
    make_user("carol")
    for i in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, f"nobody-{i}", "guess", ip="10.0.0.7")
    assert attempt(client, "carol", RIGHT, ip="10.0.0.7").status_code == 429
    assert attempt(client, "carol", RIGHT, ip="10.0.0.8").status_code == 302  # other addresses unaffected


def test_admin_reset_unlocks_the_account(client, alice):
    for i in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, "alice", f"wrong-{i}")
    assert AccessAttempt.objects.filter(username="alice").exists()
    assert attempt(client, "alice", RIGHT).status_code == 429
    call_command("axes_reset_username", "alice")
    reset(ip="10.0.0.1")
    assert not AccessAttempt.objects.exists()
    response = attempt(client, "alice", RIGHT)
    assert response.status_code == 302 and client.session["_auth_user_id"] == str(alice.pk)


def test_a_success_clears_earlier_failures(client, alice):
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, "alice", f"wrong-{i}")
    assert attempt(client, "alice", RIGHT).status_code == 302
    client.logout()
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, "alice", f"wrong-again-{i}")
    assert attempt(client, "alice", RIGHT).status_code == 302
