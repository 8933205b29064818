"""Bearer API-key authentication for ``/v1`` (plain views) and ``/api`` (django-ninja)."""

from ninja.security import HttpBearer

from api.errors import invalid_api_key
from api.selectors import api_key_user


def bearer_key(request) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, "" when there is none."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def user_for_request(request):
    """The active user whose key the request carries. Raises ``ApiError`` 401 ``invalid_api_key``."""
    token = bearer_key(request)
    if not token:
        raise invalid_api_key(
            "You didn't provide an API key. Send it as 'Authorization: Bearer cs-...'; create one on "
            "your API keys page."
        )
    user = api_key_user(raw_key=token)
    if user is None:
        raise invalid_api_key()
    return user


class ApiKeyBearer(HttpBearer):
    """django-ninja auth: the key's user becomes ``request.auth`` (and ``request.user``)."""

    def authenticate(self, request, token):
        user = api_key_user(raw_key=token)
        if user is not None:
            request.user = user
        return user
