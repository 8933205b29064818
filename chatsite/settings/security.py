"""Security settings read from the environment like every setting (``.env.example``): the
Content-Security-Policy and log-in throttling; star-imported by ``base.py``, which has read ``.env`` into
the environment already. The production-only ones (HSTS, secure cookies, HTTPS redirect) are in
``prod.py``; docs/security.md lists what the site answers with."""

from datetime import timedelta

import environ as _environ

from chatsite.content_security import content_security_policy, origin_of

_env = _environ.Env()

# Content-Security-Policy (django-csp; the policy: chatsite/content_security.py). CSP_CONNECT_SRC adds origins
# the page must reach besides its own (e.g. a separate WebSocket host: "wss://ws.example.com").
# Forms may also lead to Stripe's Checkout and customer portal (or the Stripe API base's own pages) and to the
# identity provider's log-in (settings/billing_sso.py reads the same variables).
_FORM_ACTION = [
    origin_of(_env("STRIPE_API_BASE", default="")),
    origin_of(_env("SSO_OIDC_ISSUER", default="")),
]
if _env("STRIPE_SECRET_KEY", default=""):
    _FORM_ACTION += ["https://checkout.stripe.com", "https://billing.stripe.com"]
CONTENT_SECURITY_POLICY = content_security_policy(
    connect_src=_env.list("CSP_CONNECT_SRC", default=[]), form_action=[o for o in _FORM_ACTION if o]
)

# Log-in throttling (django-axes): after AXES_FAILURE_LIMIT failed log-ins for one account, or from one
# client address, further attempts are refused (429, templates/registration/locked_out.html) for
# AXES_COOLOFF_MINUTES. Admins unlock in /admin/axes/ or with `manage.py axes_reset[_username|_ip]`.
AUTHENTICATION_BACKENDS = [
    "accounts.backends.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ENABLED = _env.bool("AXES_ENABLED", default=True)
AXES_FAILURE_LIMIT = _env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=_env.float("AXES_COOLOFF_MINUTES", default=15.0))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_USERNAME_FORM_FIELD = "username"
# The client address is REMOTE_ADDR; behind a reverse proxy, set AXES_CLIENT_IP_CALLABLE to read its header.
