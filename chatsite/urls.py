from django.contrib import admin
from django.urls import include, path

from api.urls import history_urls, settings_urlpatterns, v1_urlpatterns
from conversations.views import home

urlpatterns = [
    path("", home, name="home"),
    path("accounts/", include("accounts.urls")),
    path("chat/", include("conversations.urls")),
    path("billing/", include("billing.urls")),
    path("admin/", admin.site.urls),
    # OpenAI-compatible API, history JSON API and the API keys page (issue 10)
    path("v1/", include((v1_urlpatterns, "v1"))),
    path("api/", history_urls),
    path("settings/", include((settings_urlpatterns, "api"))),
]
