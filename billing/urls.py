from django.urls import path

from billing import views

app_name = "billing"
urlpatterns = [
    path("usage/", views.usage, name="usage"),
    path("upgrade/", views.upgrade, name="upgrade"),
    path("upgrade/<int:request_id>/cancel/", views.upgrade_cancel, name="upgrade_cancel"),
]
