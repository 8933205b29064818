"""The bed's hosts, addresses, ports and the environment each role's processes get."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "chb-"
SWITCH = f"{PREFIX}switch"
SUBNET = "10.231.0"
BED_DIR = Path(os.environ.get("BED_DIR", "/tmp/chatsite-bed"))


@dataclass(frozen=True)
class Host:
    name: str
    octet: int

    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.name}"

    @property
    def addr(self) -> str:
        return f"{SUBNET}.{self.octet}"


DATA = Host("data", 2)
LB = Host("lb", 10)
WEB = (Host("web1", 11), Host("web2", 12))
GPU = (Host("gpu1", 21), Host("gpu2", 22))
CLIENT = Host("client", 100)
HOSTS = (DATA, LB, *WEB, *GPU, CLIENT)

WEB_PORT = 8000
PG_PORT = 5432
REDIS_PORT = 6379
AMQP_PORT = 5672
#: Where the web and worker hosts reach the broker: a delay proxy on their own loopback
#: (``devtools/bed/delay_proxy.py``) forwarding to the data host; it adds the delay written in
#: ``BROKER_DELAY_FILE`` (ms, none by default), which the slow-broker drill switches on.
BROKER_PROXY_PORT = 5673
BROKER_DELAY_FILE = BED_DIR / "broker-delay-ms"
HTTPS_PORT = 443
SITE_HOST = "chatsite.bed"
MODEL = os.environ.get("INFERENCE_DEFAULT_MODEL", "smollm2-135m-instruct")


def site_url() -> str:
    """The site as a browser on the client host sees it (through the load balancer, TLS)."""
    return f"https://{LB.addr}"


def broker_via_proxy(host: Host | None) -> bool:
    """Whether ``host`` reaches the broker through its delay proxy (the web and worker hosts)."""
    return host in (*WEB, *GPU)


def app_env(host: Host | None = None) -> dict[str, str]:
    """Environment of every product process on ``host`` (web, worker, manage.py; None: the client host):
    production settings pointed at the data host, the broker through the host's delay proxy where it has
    one. MODEL_CACHE_DIR comes from the caller's environment or its ``.env``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_", "REDIS_", "CELERY_", "TEST_", "DJANGO_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="chatsite.settings.prod",
        SECRET_KEY="bed-only-secret-key-not-for-production-0123456789",
        ALLOWED_HOSTS=f"{SITE_HOST},{LB.addr},{','.join(h.addr for h in WEB)}",
        CSRF_TRUSTED_ORIGINS=f"https://{LB.addr},https://{SITE_HOST}",
        SECURE_HSTS_SECONDS="0",
        SECURE_HSTS_PRELOAD="false",
        DATABASE_URL=f"postgres://postgres@{DATA.addr}:{PG_PORT}/chatsite",
        REDIS_URL=f"redis://{DATA.addr}:{REDIS_PORT}/0",
        CELERY_BROKER_URL=(
            f"amqp://guest:guest@127.0.0.1:{BROKER_PROXY_PORT}//"
            if broker_via_proxy(host)
            else f"amqp://guest:guest@{DATA.addr}:{AMQP_PORT}//"
        ),
        METRICS_ALLOWED_NETWORKS=f"{SUBNET}.0/24,127.0.0.0/8",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        # The drills judge delivery and recovery of sampled replies of the small default model; the output guard
        # chain is tested on its own (tests/integration/test_safety_stream.py), and one of its verdicts on such
        # a reply would read here as a failed drill.
        SAFETY_MODERATE_OUTPUT="false",
        # Light: the machine is shared. One engine thread and a few task threads per worker host.
        INFERENCE_NUM_THREADS=os.environ.get("BED_ENGINE_THREADS", "1"),
        INFERENCE_MAX_NUM_SEQS=os.environ.get("BED_MAX_NUM_SEQS", "8"),
        WORKER_CONCURRENCY=os.environ.get("BED_WORKER_CONCURRENCY", "10"),
        INFERENCE_DEFAULT_MODEL=MODEL,
    )
    return env


def haproxy_env(pem: Path, socket: Path) -> dict[str, str]:
    """The variables ``deploy/haproxy/haproxy.cfg`` reads, for the bed's load balancer host."""
    return {
        **os.environ,
        "HAPROXY_HTTPS_BIND": f"{LB.addr}:{HTTPS_PORT}",
        "HAPROXY_HTTP_BIND": f"{LB.addr}:80",
        "HAPROXY_TLS_PEM": str(pem),
        "HAPROXY_RUNTIME_SOCKET": str(socket),
        "CHATSITE_HOST": SITE_HOST,
        "CHATSITE_WEB1": f"{WEB[0].addr}:{WEB_PORT}",
        "CHATSITE_WEB2": f"{WEB[1].addr}:{WEB_PORT}",
    }
