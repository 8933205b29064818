"""The API keys settings page: list, create (the full secret is shown once), revoke."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from api.selectors import api_key_get_for_user, api_keys_for_user
from api.services import api_key_create, api_key_revoke


class ApiKeyForm(forms.Form):
    name = forms.CharField(
        max_length=100, required=False, help_text="To tell your keys apart, e.g. 'laptop'."
    )


@login_required
@require_http_methods(["GET", "POST"])
def api_keys(request):
    """GET: the user's keys (prefix, name, created, last used, revoked). POST: create one and show its
    secret in this response only (never stored, never shown again)."""
    form = ApiKeyForm(request.POST or None)
    new_key = None
    if request.method == "POST" and form.is_valid():
        _api_key, new_key = api_key_create(user=request.user, name=form.cleaned_data["name"])
        form = ApiKeyForm()
    context = {"form": form, "keys": api_keys_for_user(user=request.user), "new_key": new_key}
    response = render(request, "api/keys.html", context, status=400 if form.errors else 200)
    response["Cache-Control"] = "no-store"  # the page may hold a secret
    return response


@login_required
@require_POST
def api_key_revoke_view(request, key_id: int):
    """Revoke one of the user's keys (404 for someone else's)."""
    api_key = api_key_revoke(api_key=api_key_get_for_user(user=request.user, key_id=key_id))
    messages.success(request, f"Key cs-{api_key.prefix}_… revoked.")
    return redirect("api:keys")
