"""A worker's metrics endpoint (no authentication) listens on loopback unless METRICS_WORKER_ADDR says
otherwise."""

import psutil
from django.conf import settings

from observability.metrics import start_worker_endpoint


def listening_addresses(port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def test_worker_metrics_bind_loopback_by_default():
    assert settings.METRICS_WORKER_ADDR == "127.0.0.1"  # nothing in the environment overrides the default
    port = start_worker_endpoint(0, settings.METRICS_WORKER_ADDR)
    assert listening_addresses(port) == {"127.0.0.1"}
    port = start_worker_endpoint(0)
    assert listening_addresses(port) == {"127.0.0.1"}
