"""Authentication backends: log-in throttling in front of Django's model backend."""

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.core.exceptions import PermissionDenied


def password_login_allowed(username: str | None) -> bool:
    """Whether ``username`` may log in with a password: everyone while ``PASSWORD_LOGIN_ENABLED``, else
    only the ``PASSWORD_LOGIN_BREAK_GLASS_USERS`` (the administrators who must get in when the identity
    provider is down)."""
    return settings.PASSWORD_LOGIN_ENABLED or (username or "") in settings.PASSWORD_LOGIN_BREAK_GLASS_USERS


class PasswordLoginGate:
    """First backend: with password log-in turned off, a password for anyone but a break-glass user stops
    authentication here (``PermissionDenied`` ends Django's backend loop; the form says the credentials are
    wrong and axes counts a failure). Never authenticates anyone itself, and has no ``get_user``, so no
    session is ever bound to it (Django's test client and allauth pick the first backend that has one)."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if password is not None and not password_login_allowed(username):
            raise PermissionDenied("password log-in is turned off")
        return None


class LoginThrottleBackend(AxesStandaloneBackend):
    """django-axes' lockout check (by account and by client address, see ``AXES_*`` settings) for every
    authentication that comes with a request (log-in form, admin log-in). Calls without a request (the test
    client's ``login()``, shell scripts) are not throttled, as there is no client to throttle; axes'
    standalone backend would raise for them instead."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
