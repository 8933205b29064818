"""Settings of the metrics endpoints, the engine's step log and OpenTelemetry's traces (docs/operations.md),
read from the environment like every setting (``.env.example``); star-imported by ``base.py``, which has read
``.env`` into the environment already."""

import environ as _environ

_env = _environ.Env()

# Each worker process serves Prometheus metrics on this port ("" disables, 0 picks a free port).
_metrics_port = _env("METRICS_WORKER_PORT", default="9101")
METRICS_WORKER_PORT = int(_metrics_port) if _metrics_port else None
# Loopback unless configured: the endpoint has no authentication (0.0.0.0 for a Prometheus elsewhere).
METRICS_WORKER_ADDR = _env("METRICS_WORKER_ADDR", default="127.0.0.1")
# A JSON line per engine step to this file, empty for none (observability/step_log.py).
ENGINE_STEP_LOG = _env("ENGINE_STEP_LOG", default="")
# Web /metrics: allowed with this bearer token, or from these networks (CIDR).
METRICS_BEARER_TOKEN = _env("METRICS_BEARER_TOKEN", default="")
METRICS_ALLOWED_NETWORKS = _env.list("METRICS_ALLOWED_NETWORKS", default=["127.0.0.1/32", "::1/128"])
# OpenTelemetry: exporter none | console | otlp | jsonfile (OTEL_TRACES_FILE); OTLP reads OTEL_EXPORTER_OTLP_*.
OTEL_TRACES_EXPORTER = _env("OTEL_TRACES_EXPORTER", default="none")
if OTEL_TRACES_EXPORTER not in ("none", "console", "otlp", "jsonfile"):
    raise _environ.ImproperlyConfigured("OTEL_TRACES_EXPORTER must be none, console, otlp or jsonfile")
OTEL_TRACES_FILE = _env("OTEL_TRACES_FILE", default="traces.jsonl")
OTEL_SERVICE_NAME = _env("OTEL_SERVICE_NAME", default="chatsite")
OTEL_INSTRUMENT = _env.list("OTEL_INSTRUMENT", default=["django", "celery", "psycopg", "redis"])
