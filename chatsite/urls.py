from django.contrib import admin
from django.urls import include, path

from conversations.views import home

urlpatterns = [
    path("", home, name="home"),
    path("accounts/", include("accounts.urls")),
    path("chat/", include("conversations.urls")),
    path("billing/", include("billing.urls")),
    path("admin/", admin.site.urls),
]
