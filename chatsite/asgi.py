"""ASGI entry point served by daphne: HTTP through Django, WebSockets through Channels."""

import os
import sys

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
django_asgi_app = get_asgi_application()

from django.conf import settings  # noqa: E402

# The event loop takes the GIL back from the database-call threads at most this often: CPython's 5 ms default
# let a burst of sends' threads hold it for tens of ms per loop step (docs/overhead.md, refusals).
sys.setswitchinterval(settings.WEB_GIL_SWITCH_INTERVAL_MS / 1000)

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
