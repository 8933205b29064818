"""Single sign-on over OpenID Connect through django-allauth: just-in-time accounts, and the identity
provider's groups mapped to tiers and to staff at every log-in.

allauth runs the authorization code flow with PKCE (``OAUTH_PKCE_ENABLED``), discovers the provider's
endpoints from ``<SSO_OIDC_ISSUER>/.well-known/openid-configuration`` and checks the ID token against its
JWKS. This module only decides what a verified identity means here:

* a new person gets an account at once (``SOCIALACCOUNT_AUTO_SIGNUP``), username from
  ``preferred_username`` (made unique by allauth), no usable password;
* ``SSO_GROUP_TIERS`` (group -> tier name): the best tier among the person's groups (claim
  ``SSO_GROUPS_CLAIM``) at each log-in; someone who left every mapped group goes back to free if their tier
  came from the mapping (a tier an admin or a team subscription set is left alone);
* ``SSO_STAFF_GROUPS``: staff exactly while in one of these groups (superusers are never changed here).

Log-out is chatsite's own (``accounts:logout``): ``user_logged_out`` ends that session's sockets
(``accounts/sessions.py``) whichever way the person logged in.
"""

from __future__ import annotations

from allauth.account.adapter import DefaultAccountAdapter
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django.conf import settings

from billing.models import FREE_TIER_NAME, Tier

#: The backend a session from an SSO log-in is bound to (``ModelBackend.get_user`` loads its user).
SESSION_BACKEND = "django.contrib.auth.backends.ModelBackend"


def claims_of(sociallogin) -> dict:
    """The person's claims: the ID token's, overlaid with the userinfo endpoint's."""
    data = sociallogin.account.extra_data or {}
    if "id_token" in data or "userinfo" in data:
        return {**(data.get("id_token") or {}), **(data.get("userinfo") or {})}
    return dict(data)


def groups_of(claims: dict) -> set[str]:
    """The groups in claim ``SSO_GROUPS_CLAIM``: a list, or one string of comma/space separated names."""
    raw = claims.get(settings.SSO_GROUPS_CLAIM) or []
    if isinstance(raw, str):
        raw = raw.replace(",", " ").split()
    return {str(g) for g in raw}


def mapped_tier(groups: set[str]) -> Tier | None:
    """The best tier (queue priority, then tokens per day) that ``SSO_GROUP_TIERS`` gives these groups, or
    None when no group is mapped. An unknown tier name in the mapping is ignored."""
    names = {tier for group, tier in settings.SSO_GROUP_TIERS.items() if group in groups}
    tiers = list(Tier.objects.filter(name__in=names))
    return max(tiers, key=lambda t: (t.queue_priority, t.tokens_per_day), default=None)


def user_apply_claims(*, user, claims: dict) -> list[str]:
    """Set ``user``'s tier and staff flag from ``claims`` per the mappings (in memory); returns the changed
    field names (empty when no mapping is configured or nothing changes)."""
    groups = groups_of(claims)
    changed = []
    if settings.SSO_GROUP_TIERS:
        tier = mapped_tier(groups)
        if tier is None and user.tier_id is not None:
            mapped_names = set(settings.SSO_GROUP_TIERS.values()) - {FREE_TIER_NAME}
            if Tier.objects.filter(pk=user.tier_id, name__in=mapped_names).exists():
                tier = Tier.objects.get(name=FREE_TIER_NAME)
        if tier is not None and tier.pk != user.tier_id:
            user.tier = tier
            changed.append("tier")
    if settings.SSO_STAFF_GROUPS and not user.is_superuser:
        staff = bool(groups & set(settings.SSO_STAFF_GROUPS))
        if staff != user.is_staff:
            user.is_staff = staff
            changed.append("is_staff")
    return changed


class SsoAccountAdapter(DefaultSocialAccountAdapter):
    """allauth's social-account hooks: JIT sign-up always open, claims mapped at every log-in."""

    def is_open_for_signup(self, request, sociallogin) -> bool:
        return True

    def populate_user(self, request, sociallogin, data):
        user = super().populate_user(request, sociallogin, data)
        user_apply_claims(user=user, claims=claims_of(sociallogin))
        return user

    def pre_social_login(self, request, sociallogin) -> None:
        user = sociallogin.user
        if sociallogin.is_existing and user is not None and user.pk:
            changed = user_apply_claims(user=user, claims=claims_of(sociallogin))
            if changed:
                user.save(update_fields=changed)
        if user is not None:
            user.backend = SESSION_BACKEND


class AccountAdapter(DefaultAccountAdapter):
    """allauth's account hooks: no sign-up through allauth's own forms (chatsite has its own page, and SSO
    sign-up goes through :class:`SsoAccountAdapter`); log-ins bound to Django's model backend."""

    def is_open_for_signup(self, request) -> bool:
        return False

    def login(self, request, user) -> None:
        if not hasattr(user, "backend"):
            user.backend = SESSION_BACKEND
        super().login(request, user)


def sso_enabled() -> bool:
    return bool(settings.SSO_OIDC_ISSUER)
