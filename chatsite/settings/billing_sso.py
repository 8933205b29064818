"""Settings of paid plans through Stripe and of single sign-on over OpenID Connect (issue 32,
docs/billing-and-sso.md), imported at the end of ``base.py``. Read from the environment like the rest
(``base.py`` has already loaded ``.env`` into it), strictly: a bad combination refuses to start.
"""

import environ as _environ

_env = _environ.Env()

#: Added to INSTALLED_APPS: teams, and allauth's social accounts with only the OpenID Connect provider.
BILLING_SSO_APPS = [
    "organizations",
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
]

#: Put first in AUTHENTICATION_BACKENDS: with password log-in off it refuses every password but the
#: break-glass ones (accounts/backends.py).
PASSWORD_LOGIN_GATE = "accounts.backends.PasswordLoginGate"

# --- Payments ---
# Payment provider for upgrade requests (billing/payments.py): manual admin approval (default) or Stripe
# (billing.stripe_provider.StripeProvider; docs/billing-and-sso.md).
BILLING_PAYMENT_PROVIDER = _env("BILLING_PAYMENT_PROVIDER", default="billing.payments.ManualApprovalProvider")
STRIPE_SECRET_KEY = _env("STRIPE_SECRET_KEY", default="")
STRIPE_WEBHOOK_SECRET = _env("STRIPE_WEBHOOK_SECRET", default="")
# Where the Stripe client sends API calls; blank = Stripe's own address (set to a local fake in tests).
STRIPE_API_BASE = _env("STRIPE_API_BASE", default="")
# A webhook whose signature timestamp is older than this is refused (seconds; Stripe's default 300).
STRIPE_WEBHOOK_TOLERANCE_S = _env.int("STRIPE_WEBHOOK_TOLERANCE_S", default=300)
# After a failed payment a team keeps its plan this long (days), then drops to the free tier.
BILLING_GRACE_PERIOD_DAYS = _env.float("BILLING_GRACE_PERIOD_DAYS", default=7.0)
if BILLING_PAYMENT_PROVIDER.endswith("StripeProvider") and not (STRIPE_SECRET_KEY and STRIPE_WEBHOOK_SECRET):
    raise _environ.ImproperlyConfigured(
        "BILLING_PAYMENT_PROVIDER is Stripe: set STRIPE_SECRET_KEY and STRIPE_WEBHOOK_SECRET"
    )
if BILLING_GRACE_PERIOD_DAYS < 0:
    raise _environ.ImproperlyConfigured("BILLING_GRACE_PERIOD_DAYS must be >= 0")

# --- Single sign-on over OpenID Connect (issue 32; docs/billing-and-sso.md) ---
# The identity provider's issuer URL (discovery at <issuer>/.well-known/openid-configuration); blank = no SSO.
SSO_OIDC_ISSUER = _env("SSO_OIDC_ISSUER", default="")
SSO_OIDC_CLIENT_ID = _env("SSO_OIDC_CLIENT_ID", default="")
SSO_OIDC_CLIENT_SECRET = _env("SSO_OIDC_CLIENT_SECRET", default="")
# The button's label on the log-in page.
SSO_OIDC_NAME = _env("SSO_OIDC_NAME", default="Company SSO")
SSO_OIDC_SCOPES = _env.list("SSO_OIDC_SCOPES", default=["openid", "profile", "email"])
# The claim that lists a person's groups, and optional mappings: group -> tier name, groups that make staff.
SSO_GROUPS_CLAIM = _env("SSO_GROUPS_CLAIM", default="groups")
SSO_GROUP_TIERS = _env.dict("SSO_GROUP_TIERS", default={})
SSO_STAFF_GROUPS = _env.list("SSO_STAFF_GROUPS", default=[])
# Link an SSO log-in to an existing account with the same (provider-verified) e-mail.
SSO_LINK_BY_EMAIL = _env.bool("SSO_LINK_BY_EMAIL", default=False)
# Password log-in (and sign-up); false leaves it only to the break-glass usernames listed.
PASSWORD_LOGIN_ENABLED = _env.bool("PASSWORD_LOGIN_ENABLED", default=True)
PASSWORD_LOGIN_BREAK_GLASS_USERS = _env.list("PASSWORD_LOGIN_BREAK_GLASS_USERS", default=[])
if SSO_OIDC_ISSUER and not (SSO_OIDC_CLIENT_ID and SSO_OIDC_CLIENT_SECRET):
    raise _environ.ImproperlyConfigured(
        "SSO_OIDC_ISSUER is set: set SSO_OIDC_CLIENT_ID and SSO_OIDC_CLIENT_SECRET"
    )
if not PASSWORD_LOGIN_ENABLED and not (SSO_OIDC_ISSUER or PASSWORD_LOGIN_BREAK_GLASS_USERS):
    raise _environ.ImproperlyConfigured(
        "PASSWORD_LOGIN_ENABLED=false needs SSO_OIDC_ISSUER or PASSWORD_LOGIN_BREAK_GLASS_USERS: nobody could log in"
    )
#: The provider id in allauth's URLs: /sso/oidc/<SSO_PROVIDER_ID>/login/ and .../login/callback/.
SSO_PROVIDER_ID = "sso"
SOCIALACCOUNT_PROVIDERS = {
    "openid_connect": {
        "OAUTH_PKCE_ENABLED": True,
        "APPS": (
            [
                {
                    "provider_id": SSO_PROVIDER_ID,
                    "name": SSO_OIDC_NAME,
                    "client_id": SSO_OIDC_CLIENT_ID,
                    "secret": SSO_OIDC_CLIENT_SECRET,
                    "settings": {
                        "server_url": SSO_OIDC_ISSUER,
                        "oauth_pkce_enabled": True,
                        "scope": SSO_OIDC_SCOPES,
                    },
                }
            ]
            if SSO_OIDC_ISSUER
            else []
        ),
    }
}
SOCIALACCOUNT_ADAPTER = "accounts.sso.SsoAccountAdapter"
ACCOUNT_ADAPTER = "accounts.sso.AccountAdapter"
SOCIALACCOUNT_AUTO_SIGNUP = True  # just-in-time accounts
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"  # the identity provider vouches for its people
SOCIALACCOUNT_EMAIL_AUTHENTICATION = SSO_LINK_BY_EMAIL
SOCIALACCOUNT_EMAIL_AUTHENTICATION_AUTO_CONNECT = SSO_LINK_BY_EMAIL
SOCIALACCOUNT_LOGIN_ON_GET = False  # starting a log-in is a POST with a CSRF token
SOCIALACCOUNT_STORE_TOKENS = False
ACCOUNT_EMAIL_VERIFICATION = "none"
