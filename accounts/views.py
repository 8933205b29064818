from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth import login, logout
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from accounts.forms import AccountDeleteForm, DefaultSystemPromptForm, SignUpForm
from accounts.services import account_delete as delete_account
from billing.selectors import usage_this_month, usage_today


class LoginView(auth_views.LoginView):
    """Django's log-in form, plus the single sign-on button when an identity provider is configured."""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {
            **super().get_context_data(**kwargs),
            "sso_name": settings.SSO_OIDC_NAME if settings.SSO_OIDC_ISSUER else "",
            "sso_provider_id": settings.SSO_PROVIDER_ID,
            "password_login": settings.PASSWORD_LOGIN_ENABLED,
        }


@require_http_methods(["GET", "POST"])
def signup(request):
    """Create an account and log it in, then land on an empty chat. Closed while password log-in is off
    (people get accounts through single sign-on then)."""
    if request.user.is_authenticated:
        return redirect("conversations:new")
    if not settings.PASSWORD_LOGIN_ENABLED:
        flash.info(request, "Accounts are created by signing in with single sign-on.")
        return redirect("accounts:login")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("conversations:new")
    return render(request, "registration/signup.html", {"form": form}, status=400 if form.errors else 200)


def _profile(request, *, prompt_form=None, delete_form=None, status=200):
    user = request.user
    context = {
        "tier": user.tier,
        "usage_today": usage_today(user=user),
        "usage_month": usage_this_month(user=user),
        "prompt_form": prompt_form or DefaultSystemPromptForm(instance=user),
        "delete_form": delete_form or AccountDeleteForm(user=user),
    }
    return render(request, "accounts/profile.html", context, status=status)


@login_required
def profile(request):
    """Plan, usage, default system prompt, password and account deletion."""
    return _profile(request)


@login_required
@require_POST
def default_system_prompt(request):
    """POST ``default_system_prompt`` (at most 4,000 characters)."""
    form = DefaultSystemPromptForm(request.POST, instance=request.user)
    if not form.is_valid():
        return _profile(request, prompt_form=form, status=400)
    form.save()
    flash.success(request, "Default system prompt saved; new chats start with it.")
    return redirect("accounts:profile")


@login_required
@require_POST
def account_delete(request):
    """POST ``password`` and ``confirm``: delete the account and all its data, then log out."""
    form = AccountDeleteForm(request.POST, user=request.user)
    if not form.is_valid():
        return _profile(request, delete_form=form, status=400)
    user = request.user
    logout(request)
    delete_account(user=user)
    flash.success(request, "Your account and all its conversations were deleted.")
    return redirect("accounts:login")
