"""URLs of single sign-on under ``/sso/``: allauth's OpenID Connect log-in and callback
(``oidc/<provider_id>/login/`` and ``.../login/callback/``), its error/cancel pages, and the names of
allauth's own account pages, pointed at chatsite's (allauth's password forms are not exposed)."""

from allauth.urls import build_provider_urlpatterns
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", include(build_provider_urlpatterns())),
    path("3rdparty/", include("allauth.socialaccount.urls")),
    path("login/", RedirectView.as_view(pattern_name="accounts:login"), name="account_login"),
    path("signup/", RedirectView.as_view(pattern_name="accounts:signup"), name="account_signup"),
    path("logout/", RedirectView.as_view(pattern_name="accounts:logout"), name="account_logout"),
    path("inactive/", RedirectView.as_view(pattern_name="accounts:login"), name="account_inactive"),
    path("email/", RedirectView.as_view(pattern_name="accounts:profile"), name="account_email"),
]
