from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from accounts.forms import SignUpForm
from billing.selectors import usage_this_month, usage_today


@require_http_methods(["GET", "POST"])
def signup(request):
    """Create an account and log it in, then land on an empty chat."""
    if request.user.is_authenticated:
        return redirect("conversations:new")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("conversations:new")
    return render(request, "registration/signup.html", {"form": form}, status=400 if form.errors else 200)


@login_required
def profile(request):
    user = request.user
    context = {
        "tier": user.tier,
        "usage_today": usage_today(user=user),
        "usage_month": usage_this_month(user=user),
    }
    return render(request, "accounts/profile.html", context)
