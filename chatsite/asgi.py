"""ASGI entry point served by daphne: HTTP through Django, WebSockets through Channels."""

import os

import django
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from chatsite.asgi_handler import InlineHooksASGIHandler  # noqa: E402  (imports Django's middleware)

django_asgi_app = InlineHooksASGIHandler()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from accounts.channels_auth import auth_middleware_stack  # noqa: E402  (needs the app registry loaded above)
from chatsite import websocket_debug_args, websocket_limits  # noqa: E402
from conversations.routing import websocket_urlpatterns  # noqa: E402
from observability.gc_pauses import startup_done  # noqa: E402
from safety.chain import guards_loaded  # noqa: E402

websocket_limits.apply()
websocket_debug_args.apply()  # Autobahn's per-frame debug arguments unformatted (lever 59)
# The guard chain at start (the classifier's tables take ~0.3 s idle, seconds on a busy box): a
# misconfigured guard stops the process here, and the first send does not pay for the load.
guards_loaded()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(auth_middleware_stack(URLRouter(websocket_urlpatterns))),
    }
)
# Start-up's heap out of the garbage collector's full collections, which paused every socket (lever 38).
startup_done(freeze=settings.GC_FREEZE_AT_START)
