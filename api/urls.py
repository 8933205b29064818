"""Routes of the API app: the OpenAI-compatible ``/v1``, the history JSON API ``/api`` and the keys page."""

from django.urls import path, re_path

from api import documents, moderations, v1, views  # noqa: F401  (documents: routes on the history API)
from api.history import history_api

app_name = "api"
v1_urlpatterns = [
    path("chat/completions", v1.chat_completions, name="chat-completions"),
    path("models", v1.models_list, name="models"),
    path("moderations", moderations.moderations, name="moderations"),
    path("models/<path:model_id>", v1.model_detail, name="model"),
    path("openapi.json", v1.openapi_json, name="openapi"),
    re_path(r"^(?P<rest>.*)$", v1.not_found),
]
settings_urlpatterns = [
    path("api-keys/", views.api_keys, name="keys"),
    path("api-keys/<int:key_id>/revoke/", views.api_key_revoke_view, name="key-revoke"),
]
history_urls = history_api.urls
