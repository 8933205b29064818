from django.contrib import admin
from django.urls import include, path

from conversations.share_views import share_view
from conversations.views import home

urlpatterns = [
    path("", home, name="home"),
    path("accounts/", include("accounts.urls")),
    path("chat/", include("conversations.urls")),
    path("s/<str:token>/", share_view, name="share_view"),
    path("admin/", admin.site.urls),
]
