"""Authentication backends: log-in throttling in front of Django's model backend."""

from axes.backends import AxesStandaloneBackend


class LoginThrottleBackend(AxesStandaloneBackend):
    """django-axes' lockout check (by account and by client address, see ``AXES_*`` settings) for every
    authentication that comes with a request (log-in form, admin log-in). Calls without a request (the test
    client's ``login()``, shell scripts) are not throttled, as there is no client to throttle; axes'
    standalone backend would raise for them instead."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
