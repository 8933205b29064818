from django.urls import path

from operations import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics_endpoint, name="metrics"),
    path("ops/fleet/", views.fleet_page, name="ops-fleet"),
]
