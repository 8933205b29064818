from django.contrib import admin
from django.contrib.staticfiles.storage import staticfiles_storage
from django.http import HttpResponsePermanentRedirect
from django.urls import include, path

from api.urls import history_urls, settings_urlpatterns, v1_urlpatterns
from conversations.share_views import share_view
from conversations.views import home


def favicon(request):
    """``/favicon.ico`` for browsers that ask before reading the page's ``<link rel=icon>``."""
    return HttpResponsePermanentRedirect(staticfiles_storage.url("favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon),
    path("", home, name="home"),
    path("accounts/", include("accounts.urls")),
    path("sso/", include("accounts.sso_urls")),  # single sign-on over OpenID Connect (issue 32)
    path("chat/", include("conversations.urls")),
    path("s/<str:token>/", share_view, name="share_view"),
    path("billing/", include("billing.urls")),
    path("memory/", include("memory.urls")),
    path("admin/", admin.site.urls),
    path("", include("operations.urls")),  # /healthz /readyz /metrics /ops/fleet/
    # OpenAI-compatible API, history JSON API and the API keys page (issue 10)
    path("v1/", include((v1_urlpatterns, "v1"))),
    path("api/", history_urls),
    path("settings/", include((settings_urlpatterns, "api"))),
]
