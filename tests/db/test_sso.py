"""Single sign-on against a real OpenID Connect provider on loopback (django-oauth-toolkit in its own
process, tests/idp/): discovery, authorization code with PKCE, the code exchange, JWKS and userinfo over
real HTTP; just-in-time accounts, group mapping, log-out closing the session's sockets, and password
log-in turned off except for a break-glass admin."""

from urllib.parse import parse_qs, urlparse

import pytest
from allauth.socialaccount.models import SocialAccount
from channels.db import database_sync_to_async as db
from django.test import Client

from accounts.models import User
from accounts.sessions import session_is_current
from tests.db.test_consumer_hardening import expect_closed
from tests.fakes.idp import identity_provider, provider_login, sso_settings
from tests.sockets import open_socket

CALLBACK = "http://testserver/sso/oidc/sso/login/callback/"


@pytest.fixture(scope="module")
def idp(tmp_path_factory):
    with identity_provider(tmp_path_factory.mktemp("idp"), [CALLBACK]) as issuer:
        yield issuer


def sso_login(client: Client, *, next_url: str = "/billing/usage/"):
    """The whole log-in: start at chatsite (POST), the provider's form, back to chatsite's callback."""
    start = client.post("/sso/oidc/sso/login/", {"next": next_url})
    assert start.status_code == 302
    query = parse_qs(urlparse(start["Location"]).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) >= 43  # PKCE
    assert query["response_type"] == ["code"] and "openid" in query["scope"][0]
    callback = provider_login(start["Location"])
    assert callback.startswith(CALLBACK) and "code=" in callback
    return client.get(callback.removeprefix("http://testserver"))


@pytest.mark.django_db
def test_first_sso_log_in_creates_the_account_and_maps_groups_to_tier_and_staff(settings, idp, make_user):
    make_user("someone")  # tiers exist
    sso_settings(settings, idp, SSO_GROUP_TIERS={"engineering": "paid"}, SSO_STAFF_GROUPS=["admins"])
    client = Client()
    done = sso_login(client)
    assert done.status_code == 302 and done["Location"] == "/billing/usage/"
    ivy = User.objects.get(username="ivy")
    assert (ivy.email, ivy.tier.name, ivy.is_staff, ivy.is_superuser, ivy.has_usable_password()) == (
        "ivy@corp.example",
        "paid",
        True,
        False,
        False,
    )
    account = SocialAccount.objects.get(user=ivy)
    assert account.provider == "sso" and account.extra_data["id_token"]["groups"] == ["admins", "engineering"]
    assert client.get("/billing/usage/").status_code == 200

    # Next log-in with other mappings: the tier the mapping gave goes back to free, staff follows the groups.
    sso_settings(settings, idp, SSO_GROUP_TIERS={"sales": "paid"}, SSO_STAFF_GROUPS=["ops"])
    assert sso_login(Client()).status_code == 302
    ivy.refresh_from_db()
    assert (ivy.tier.name, ivy.is_staff) == ("free", False)
    assert User.objects.filter(username__startswith="ivy").count() == 1  # the same account, not a new one


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_log_out_after_sso_ends_the_session_and_closes_its_sockets(
    settings, idp, make_user, redis_clean
):
    await db(make_user)("someone")
    sso_settings(settings, idp)
    client = Client()
    assert (await db(sso_login)(client)).status_code == 302
    session_key = client.cookies[settings.SESSION_COOKIE_NAME].value
    ws = await open_socket(f"{settings.SESSION_COOKIE_NAME}={session_key}")
    ivy = await db(User.objects.get)(username="ivy")
    await db(client.post)("/accounts/logout/")
    await expect_closed(ws, "logged_out")
    assert not await db(session_is_current)(session_key=session_key, user_id=ivy.pk)


@pytest.mark.django_db
def test_password_log_in_off_lets_only_the_break_glass_admin_in(settings, client, make_user):
    settings.PASSWORD_LOGIN_ENABLED = False
    settings.PASSWORD_LOGIN_BREAK_GLASS_USERS = ["root"]
    make_user("alice")
    make_user("root", is_staff=True, is_superuser=True)
    refused = client.post("/accounts/login/", {"username": "alice", "password": "pw-Secret-123"})
    assert refused.status_code == 200 and "_auth_user_id" not in client.session
    allowed = client.post("/accounts/login/", {"username": "root", "password": "pw-Secret-123"})
    assert allowed.status_code == 302 and client.session["_auth_user_id"] == str(
        User.objects.get(username="root").pk
    )
    assert Client().get("/accounts/signup/")["Location"] == "/accounts/login/"
    assert not User.objects.filter(username="mallory").exists()
    Client().post(
        "/accounts/signup/",
        {
            "username": "mallory",
            "email": "m@example.com",
            "password1": "x-Secret-9876",
            "password2": "x-Secret-9876",
        },
    )
    assert not User.objects.filter(username="mallory").exists()


@pytest.mark.django_db
def test_log_in_page_offers_sso_when_configured(settings, client, idp):
    assert "sso-login" not in client.get("/accounts/login/").content.decode()
    sso_settings(settings, idp)
    page = client.get("/accounts/login/").content.decode()
    assert 'id="sso-login"' in page and "Sign in with Company SSO" in page


@pytest.mark.django_db
def test_an_e_mail_already_taken_asks_for_the_account_details_instead_of_linking(settings, idp, make_user):
    User.objects.filter(pk=make_user("ivy-password").pk).update(email="ivy@corp.example")
    sso_settings(settings, idp)
    client = Client()
    done = sso_login(client)
    assert done.status_code == 302 and done["Location"] == "/sso/3rdparty/signup/"
    page = client.get("/sso/3rdparty/signup/")
    assert page.status_code == 200 and "ivy@corp.example" in page.content.decode()
    assert not SocialAccount.objects.exists()
    assert User.objects.filter(email="ivy@corp.example").count() == 1
