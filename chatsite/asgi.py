"""ASGI entry point served by daphne: HTTP through Django, WebSockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from accounts.channels_auth import auth_middleware_stack  # noqa: E402  (needs the app registry loaded above)
from chatsite import websocket_limits  # noqa: E402
from conversations.routing import websocket_urlpatterns  # noqa: E402

websocket_limits.apply()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(auth_middleware_stack(URLRouter(websocket_urlpatterns))),
    }
)
