"""Brakeline settings: one module, driven by the environment.

Two modes, chosen by what is set:

* **embedded** (neither ``DATABASE_URL`` nor ``REDIS_URL``): a SQLite file, the in-memory
  channel layer and Celery tasks executed in-process. One command, no services: the demo.
* **server** (both set): PostgreSQL for data, Redis for the Celery broker, the channel layer
  and the cache. This is what production and the test suite run.

Setting only one of the two is a mistake we refuse at start-up with a sentence that says what
to set, rather than silently running half-embedded.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

from config.env import (
    env_bool,
    env_choice,
    env_host_ports,
    env_int,
    env_seconds,
    env_seconds_by_kind,
)
from config.schedule import beat_schedule
from config.services import celery_broker, channel_layer_host, patroni_database
from core.hardening import refuse_inspection

BASE_DIR = Path(__file__).resolve().parent.parent


DATABASE_URL = os.environ.get("DATABASE_URL", "").strip()
REDIS_URL = os.environ.get("REDIS_URL", "").strip()

if bool(DATABASE_URL) != bool(REDIS_URL):
    missing, present = (
        ("REDIS_URL", "DATABASE_URL") if DATABASE_URL else ("DATABASE_URL", "REDIS_URL")
    )
    raise ImproperlyConfigured(
        f"{present} is set but {missing} is not. The server mode needs both "
        "(DATABASE_URL=postgresql://user@host:5432/brakeline and REDIS_URL=redis://host:6379/0); "
        "unset both to run the embedded mode (SQLite, in-process worker)."
    )

EMBEDDED = not DATABASE_URL
# The fail-over set-ups (config/services.py): Patroni's members, Redis Sentinel's sentinels.
DATABASE_HOSTS = env_host_ports("BRAKELINE_DATABASE_HOSTS", 5432)
REDIS_SENTINELS = env_host_ports("BRAKELINE_REDIS_SENTINELS", 26379)
REDIS_SENTINEL_MASTER = os.environ.get("BRAKELINE_REDIS_SENTINEL_MASTER", "").strip() or "brakeline"

if not EMBEDDED and not DATABASE_URL.startswith(("postgres://", "postgresql://")):
    raise ImproperlyConfigured(
        f"DATABASE_URL must be a PostgreSQL URL (postgresql://user@host:5432/name), "
        f"got scheme {DATABASE_URL.split(':', 1)[0]!r}."
    )
if not EMBEDDED and not REDIS_URL.startswith(("redis://", "rediss://")):
    raise ImproperlyConfigured(
        f"REDIS_URL must be a Redis URL (redis://host:6379/0), "
        f"got scheme {REDIS_URL.split(':', 1)[0]!r}."
    )

DEBUG = env_bool("BRAKELINE_DEBUG", EMBEDDED)
# Outside the embedded mode the key signs sessions, password resets and CSRF tokens: a missing
# or short one is refused whatever BRAKELINE_DEBUG says (a debug server reachable from a
# network must not run on the public development key). BRAKELINE_INSECURE_DEV_KEY=true, said
# out loud, runs a server-mode development set-up on the development key.
MIN_SECRET_KEY_CHARS = 32
DEVELOPMENT_SECRET_KEY = "brakeline-embedded-development-key-not-for-production"
SECRET_KEY = os.environ.get("BRAKELINE_SECRET_KEY", "")
if not EMBEDDED:
    if not SECRET_KEY and not env_bool("BRAKELINE_INSECURE_DEV_KEY", False):
        raise ImproperlyConfigured(
            "BRAKELINE_SECRET_KEY is not set: set it to a long random string "
            "(python -c 'import secrets; print(secrets.token_urlsafe(50))')."
        )
    if SECRET_KEY and len(SECRET_KEY) < MIN_SECRET_KEY_CHARS:
        raise ImproperlyConfigured(
            f"BRAKELINE_SECRET_KEY is too short: {len(SECRET_KEY)} characters, at least "
            f"{MIN_SECRET_KEY_CHARS} are needed "
            "(python -c 'import secrets; print(secrets.token_urlsafe(50))')."
        )
    if SECRET_KEY and len(set(SECRET_KEY)) < 5:
        raise ImproperlyConfigured(
            "BRAKELINE_SECRET_KEY is too simple: fewer than 5 different characters "
            "(python -c 'import secrets; print(secrets.token_urlsafe(50))')."
        )
SECRET_KEY = SECRET_KEY or DEVELOPMENT_SECRET_KEY

ALLOWED_HOSTS = [
    host.strip()
    for host in os.environ.get("BRAKELINE_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")
    if host.strip()
]
CSRF_TRUSTED_ORIGINS = [
    origin.strip()
    for origin in os.environ.get("BRAKELINE_CSRF_TRUSTED_ORIGINS", "").split(",")
    if origin.strip()
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "incidents",
    "breakers",
    "console",
]

MIDDLEWARE = [
    "console.request_log.request_log_middleware",  # outermost: it logs every answer
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "console.security.content_security_policy_middleware",
    # django-axes: turns a locked-out sign-in into its 429 answer.
    "axes.middleware.AxesMiddleware",
    # Last: sync only, so Django runs the whole chain in the request's one thread instead of
    # switching to the event loop and back around each middleware (console/sync_chain.py).
    "console.sync_chain.sync_request_chain",
]

# --- Signing in: django-axes counts failed sign-ins (the login page and the admin) ----------
# After BRAKELINE_LOGIN_FAILURE_LIMIT failures for one user name (from one address, or from all
# of them together), further attempts of that user (the right password included) are refused
# with 429 until the cool-off has passed. Never per address alone: behind a reverse proxy one
# address is every user, and one user's mistyped password must not lock the on-call out.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("BRAKELINE_LOGIN_FAILURE_LIMIT", 10)
if AXES_FAILURE_LIMIT < 1:
    raise ImproperlyConfigured(f"BRAKELINE_LOGIN_FAILURE_LIMIT={AXES_FAILURE_LIMIT} is below 1.")
AXES_COOLOFF_TIME = timedelta(seconds=env_seconds("BRAKELINE_LOGIN_COOLOFF_SECONDS", 900.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "username"]
AXES_RESET_ON_SUCCESS = True
# The cool-off runs from the failure that locked: attempts during the lock-out do not extend it.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "console.security.client_ip"
AXES_VERBOSE = False

# --- Behind TLS -----------------------------------------------------------------------------
# BRAKELINE_SECURE=true: people reach the console over https (Daphne with TLS, or a proxy);
# BRAKELINE_TLS_PROXY=true: a reverse proxy terminates TLS and says so in X-Forwarded-Proto
# (and the client's address in X-Forwarded-For). Either turns on Secure cookies, HSTS and the
# redirect of http to https (the health check excepted, for probes inside the network).
TLS_PROXY = env_bool("BRAKELINE_TLS_PROXY", False)
SECURE = env_bool("BRAKELINE_SECURE", False) or TLS_PROXY
if TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = SECURE
CSRF_COOKIE_SECURE = SECURE
SECURE_SSL_REDIRECT = SECURE
SECURE_REDIRECT_EXEMPT = [r"^api/v1/health$"]
SECURE_HSTS_SECONDS = env_int("BRAKELINE_HSTS_SECONDS", 31_536_000) if SECURE else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE
SECURE_HSTS_PRELOAD = SECURE
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
# The pages' policy (console.security): scripts and style sheets of our own origin only (no
# inline script), style attributes allowed (the review's bars), websockets to this host.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; style-src-elem 'self'; "
    "style-src-attr 'unsafe-inline'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self' {websocket}; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'"
)

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
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
                "console.context.console",
            ],
        },
    },
]

DATA_DIR = Path(os.environ.get("BRAKELINE_DATA_DIR", BASE_DIR / "var"))
# Where fire drills' sandbox jobs write (checkpoints, logs): docs/drills.md.
DRILL_DIR = Path(os.environ.get("BRAKELINE_DRILL_DIR", "").strip() or DATA_DIR / "drills")

if EMBEDDED:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES: dict[str, Any] = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "brakeline.sqlite3",
            # The demo's server and simulator write at the same time; wait instead of failing.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }
else:
    # CONN_HEALTH_CHECKS: the psycopg pool checks a connection before it lends it (one empty
    # round trip). After a PostgreSQL restart every idle pooled connection is dead; unchecked,
    # each was lent to a request or a task, which failed on it (a 500 or a failed evaluation
    # per dead connection). Checked, a dead one is discarded and a fresh one opened.
    DATABASES = {
        "default": patroni_database(
            dj_database_url.parse(DATABASE_URL, conn_health_checks=True), DATABASE_HOSTS
        )
    }
    # Under ASGI, Django runs each request's sync code in a thread of its own, so "persistent"
    # connections are reconnected per request (≈10 ms each here). psycopg's pool keeps them.
    # A request waits at most BRAKELINE_DB_POOL_TIMEOUT for a connection (then 503: agents
    # retry), and a connection attempt to an unreachable host gives up after as long.
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "pool": {
            "min_size": env_int("BRAKELINE_DB_POOL_MIN", 2),
            "max_size": env_int("BRAKELINE_DB_POOL_MAX", 20),
            "timeout": env_seconds("BRAKELINE_DB_POOL_TIMEOUT", 3.0),
        },
        "connect_timeout": max(1, round(env_seconds("BRAKELINE_DB_POOL_TIMEOUT", 3.0))),
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(os.environ.get("BRAKELINE_STATIC_ROOT", DATA_DIR / "static"))
# collectstatic fills it in production; whitenoise warns about a missing folder otherwise.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "console" / "static"]
# Daphne serves no static files; whitenoise does, from the finders when no collectstatic ran.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# --- Redis-backed pieces: channel layer, cache, Celery -------------------------------------
CHANNEL_PREFIX = os.environ.get("BRAKELINE_CHANNEL_PREFIX", "brakeline")
if EMBEDDED:
    CHANNEL_LAYERS: dict[str, dict[str, Any]] = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}
    }
    CACHES: dict[str, dict[str, Any]] = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            # Pub/sub, not the list-based core layer: the core layer's receive() cancels and
            # restarts a blocking BZPOPMIN, and an event arriving in that gap is dropped
            # (channels_redis#366) — a pushed command lost. Pushes are at-most-once either
            # way; commands also ride on every heartbeat reply until acknowledged.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [channel_layer_host(REDIS_URL, REDIS_SENTINELS, REDIS_SENTINEL_MASTER)],
                "prefix": CHANNEL_PREFIX,
            },
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": CHANNEL_PREFIX,
            # A cache read never waits forever on a Redis that went away under it.
            "OPTIONS": {
                "socket_timeout": 10,
                "socket_connect_timeout": 5,
                **(
                    {"pool_class": "core.redis_clients.SentinelCachePool"}
                    if REDIS_SENTINELS
                    else {}
                ),
            },
        }
    }

# A host: kombu warns without one.
CELERY_BROKER_URL = (
    celery_broker(REDIS_URL, REDIS_SENTINELS) if REDIS_URL else "memory://localhost/"
)
CELERY_TASK_ALWAYS_EAGER = EMBEDDED
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
# The worker keeps its PostgreSQL connections: Celery's Django fixup otherwise closes them (and,
# under prefork, the whole psycopg pool) before and after every task, two new connections per
# task (~20 µs per point of it, measured by bench/ingest.py). Recycled every 2 x 500 tasks instead.
CELERY_DB_REUSE_MAX = env_int("BRAKELINE_WORKER_DB_REUSE_MAX", 500)
DEFAULT_CELERY_QUEUE = "brakeline"  # what docker-compose.yml's worker consumes
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("BRAKELINE_CELERY_QUEUE", DEFAULT_CELERY_QUEUE)
# The watchdog (heartbeats, hung jobs) has a queue of its own: a backlog of evaluations must
# never delay the detection of a silent job. The periodic evaluation ticks (one per running job
# every 5 s) go last: with many jobs they would otherwise queue ahead of the evaluation that
# brakes a NaN. WORKER_QUEUES lists the three in priority order (the test fixtures and the
# health check read it; Celery does not).
WATCHDOG_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}-watchdog"
TICK_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}-ticks"
WORKER_QUEUES = [WATCHDOG_QUEUE, CELERY_TASK_DEFAULT_QUEUE, TICK_QUEUE]
# What a worker consumes when started without -Q: all three, in that order. Each queue is
# bound as Celery binds a queue it creates itself (exchange and routing key = its name).
CELERY_TASK_QUEUES = [Queue(name, Exchange(name), routing_key=name) for name in WORKER_QUEUES]
CELERY_TASK_ROUTES = {
    "control.watchdog": {"queue": WATCHDOG_QUEUE},
    "control.stop_job": {"queue": WATCHDOG_QUEUE},
    "detection.tick_evaluations": {"queue": TICK_QUEUE},
    "detection.tick_job": {"queue": TICK_QUEUE},
    # Housekeeping of metric storage: behind every evaluation, never ahead of a brake.
    "storage.roll_up": {"queue": TICK_QUEUE},
    "storage.prune": {"queue": TICK_QUEUE},
    "storage.compact": {"queue": TICK_QUEUE},
    "pace.check_stragglers": {"queue": TICK_QUEUE},
}
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 300,
    # BRPOP on the queues in the order consumed, always: the default strategy (round robin)
    # rotates the queue just served to the back, which would make the order no priority.
    "queue_order_strategy": "priority",
    # No broker read may wait forever (docs/degraded-modes.md, "Redis is restarted"). kombu's
    # default is no socket timeout: a read on a broker socket that will never answer (a publish
    # or an ack on a connection that died with Redis, a poll error read on a socket whose
    # descriptor a reconnect reused) blocks the worker's only thread, so it neither consumes
    # nor answers a ping, for good. With a timeout the read fails, the consumer restarts,
    # reconnects and declares its queues and bindings again (a Redis restarted without
    # persistence has lost them). Longer than the BRPOP timeout (1 s) and any reply.
    "socket_timeout": 10.0,
    "socket_connect_timeout": 5.0,
    "socket_keepalive": True,
    # kombu pings its pub/sub connection and drops a BRPOP connection whose reply is overdue
    # every so often (default 25 s): a half-open connection is replaced within about 21 s.
    "health_check_interval": 10,
}
if REDIS_SENTINELS:
    # kombu asks these sentinels for the master named here (config/services.py).
    CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = REDIS_SENTINEL_MASTER
    CELERY_BROKER_TRANSPORT_OPTIONS["sentinel_kwargs"] = {"socket_timeout": 1.0}
# The worker reconnects to the broker for as long as it takes, at start-up too (a worker
# started while Redis is away waits for it instead of exiting), instead of giving up after
# 100 attempts (Celery's default: about 45 minutes) and leaving the console without workers.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# A task still running when the broker connection is lost cannot be acknowledged any more: its
# message is delivered again (acks_late), so the running copy is cancelled rather than left to
# finish alongside the redelivered one (every task is idempotent either way). Celery 6's default.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True

# --- REST API ------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
    "DEFAULT_THROTTLE_RATES": {
        "agent": os.environ.get("BRAKELINE_AGENT_RATE", "6000/min"),
        # Alertmanager webhooks per team (each may carry hundreds of alerts); 429 beyond, and
        # Alertmanager retries with its backoff.
        "alertmanager": os.environ.get("BRAKELINE_ALERTMANAGER_RATE", "60/min"),
    },
}
# A job of many ranks may send this many requests per rank (console/ratelimit.agent_rate):
# 2.5 a second, twice what a rank sends at the SDK's defaults, room for acks and retries.
AGENT_RATE_PER_RANK = os.environ.get("BRAKELINE_AGENT_RATE_PER_RANK", "150/min")

SPECTACULAR_SETTINGS = {
    "TITLE": "Brakeline API",
    "DESCRIPTION": (
        "The agent protocol (training processes: metrics, heartbeats, commands) and the console "
        "API. Agent endpoints take `Authorization: Bearer <agent token>`."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # One name per choice set used by several serializers (tests/console: no schema warnings).
    "ENUM_NAME_OVERRIDES": {
        "SeverityEnum": "incidents.models.Severity",
        "ReviewStatusEnum": "incidents.models.ReviewStatus",
        "JobStatusEnum": "incidents.models.JobStatus",
        "JobKindEnum": "incidents.models.JobKind",
    },
}

# --- Agent protocol limits (documented in the README and the OpenAPI schema) --------------
AGENT_MAX_BATCH_POINTS = env_int("BRAKELINE_MAX_BATCH_POINTS", 10_000)
# /metrics for Prometheus (docs/monitoring.md): a bearer token, or public on an internal port.
METRICS_TOKEN = os.environ.get("BRAKELINE_METRICS_TOKEN", "")
METRICS_PUBLIC = env_bool("BRAKELINE_METRICS_PUBLIC", False)
AGENT_MAX_BATCH_BYTES = env_int("BRAKELINE_MAX_BATCH_BYTES", 4 * 1024 * 1024)
# The hot path's POSTs skip Django's middleware and DRF (console/agent_lean.py); 0: all DRF.
AGENT_LEAN = env_bool("BRAKELINE_AGENT_LEAN", True)
AGENT_MAX_SNAPSHOT_BYTES = env_int("BRAKELINE_MAX_SNAPSHOT_BYTES", 1024 * 1024)
# Point and snapshot times further than this from the server's clock are refused (400).
AGENT_TIME_WINDOW_SECONDS = env_seconds("BRAKELINE_AGENT_TIME_WINDOW_SECONDS", 24 * 3600.0)
# Metric storage (breakers.storage): raw points for this long, then only their 10 s / 1 min
# rollups per rank (kept for months); raw points around an incident are never deleted.
METRIC_RAW_RETENTION_SECONDS = env_seconds("BRAKELINE_RAW_RETENTION_SECONDS", 72 * 3600.0)
METRIC_INCIDENT_MARGIN_STEPS = env_int("BRAKELINE_INCIDENT_MARGIN_STEPS", 1000)
METRIC_ROLLUP_RETENTION_DAYS = env_int("BRAKELINE_ROLLUP_RETENTION_DAYS", 180)
# Raw points are compacted into blocks (~8 B a point) once the evaluator and the rollups are
# past them and they are this old (or the job logged nothing for this long): the recent tail
# stays one row per point, and a round's blocks are ~this long a stretch of each rank's steps.
METRIC_COMPACT_AFTER_SECONDS = env_seconds("BRAKELINE_COMPACT_AFTER_SECONDS", 600.0)
if METRIC_INCIDENT_MARGIN_STEPS < 0 or METRIC_ROLLUP_RETENTION_DAYS < 1:
    raise ImproperlyConfigured(
        "BRAKELINE_INCIDENT_MARGIN_STEPS must be ≥ 0 and BRAKELINE_ROLLUP_RETENTION_DAYS ≥ 1."
    )
# Django refuses larger bodies itself; we check first so the answer is our 413, not a 400.
DATA_UPLOAD_MAX_MEMORY_SIZE = AGENT_MAX_BATCH_BYTES + 1024

# Logging: warnings and errors of every part, with their level and origin; the request log
# (console.request_log) at INFO: people's requests one line each, agent traffic summed up in
# one line per AGENT_TRAFFIC_LOG_SECONDS. Daphne's own access log is off where we start it.
LOG_LEVEL = env_choice(
    "BRAKELINE_LOG_LEVEL", "WARNING", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
)
AGENT_TRAFFIC_LOG_SECONDS = env_seconds("BRAKELINE_AGENT_TRAFFIC_LOG_SECONDS", 60.0)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"not_agent_traffic": {"()": "console.request_log.NotAgentTraffic"}},
    "formatters": {"console": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "console"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # Django's default handlers would print its records a second time in DEBUG.
        "django": {"handlers": [], "level": LOG_LEVEL},
        "django.request": {"filters": ["not_agent_traffic"]},
        # `manage.py runserver`'s access log: the request log below says it once.
        "django.channels.server": {"level": "WARNING", "filters": ["not_agent_traffic"]},
        "brakeline.requests": {"level": "DEBUG" if LOG_LEVEL == "DEBUG" else "INFO"},
    },
}

CELERY_BEAT_SCHEDULE = beat_schedule()  # config/schedule.py: every periodic task, once
# Run two beats or more: only the one holding a lease in Redis sends (config/beat.py).
CELERY_BEAT_SCHEDULER = "config.beat:LeasedScheduler"

# Jobs on Slurm: where scancel/scontrol/squeue live (empty: PATH), and an optional slurm.conf.
SLURM_BIN_DIR = os.environ.get("BRAKELINE_SLURM_BIN_DIR", "")
SLURM_CONF = os.environ.get("SLURM_CONF") or None
SLURM_COMMAND_TIMEOUT_SECONDS = env_seconds("BRAKELINE_SLURM_COMMAND_TIMEOUT_SECONDS", 30.0)
SLURM_CANCEL_WAIT_SECONDS = env_seconds("BRAKELINE_SLURM_CANCEL_WAIT_SECONDS", 40.0)

# --- The control plane: deadlines the watchdog enforces ----------------------------------
# A command not acknowledged in time presumes the job hung. Saving a checkpoint of a large
# model takes minutes; a learning-rate change takes a step. The keys are the command kinds.
COMMAND_ACK_TIMEOUT_SECONDS = env_seconds_by_kind(
    "BRAKELINE_COMMAND_ACK_TIMEOUT_SECONDS",
    {
        "lower_lr": 120.0,
        "pause_data": 120.0,
        "checkpoint_and_pause": 300.0,
        "resume": 120.0,
        "terminate": 120.0,
        "isolate_node": 120.0,
        "inject_fault": 120.0,
    },
)
# Between the executor's polite stop (SIGTERM, Slurm's USR1) and the forced one.
EXECUTOR_GRACE_SECONDS = env_seconds("BRAKELINE_EXECUTOR_GRACE_SECONDS", 10.0)
# Multi-rank jobs (breakers.control.apply_at, breakers.control.acks): a command that changes
# the training state applies at a step this many seconds' worth of steps ahead of the highest
# step any rank reported (time for it to reach every rank, websocket or not); and a command
# some ranks acknowledged and others not after this long is a "split job" alert (L3).
COMMAND_APPLY_MARGIN_SECONDS = env_seconds("BRAKELINE_COMMAND_APPLY_MARGIN_SECONDS", 3.0)
COMMAND_SPLIT_SECONDS = env_seconds("BRAKELINE_COMMAND_SPLIT_SECONDS", 30.0)
# A multi-rank job's brake while some of its ranks hold on their step guard and the others'
# holds are still on their way: issued once every rank holds (at the held step), or after
# this long (with the margin above); breakers.control.apply_at. 0: never wait.
HOLD_GATHER_SECONDS = env_seconds("BRAKELINE_HOLD_GATHER_SECONDS", 2.0)
# Silences and acknowledgement deadlines are judged only up to the web tier's last beacon
# (breakers.control.hearing): the console's own outage is not the jobs' silence. Not an
# operator's setting: the test suite's in-process watchdog, whose clock tests move, turns it
# off (tests/conftest.py), since the beacon is written by web processes on the real clock.
JUDGE_SILENCE_BY_BEACON = True
# A web process that started this recently and has not heard the watchdog beat yet answers
# its health check "starting" (503, no error logged) rather than "degraded".
HEALTH_STARTING_SECONDS = env_seconds("BRAKELINE_HEALTH_STARTING_SECONDS", 15.0)
# Inference jobs (breakers.control.inference): HAProxy's runtime API (a UNIX socket path or
# host:port; empty: no traffic executor), and how long a drained replica's requests in
# flight may take to finish before it is put in maintenance anyway.
HAPROXY_SOCKET = os.environ.get("BRAKELINE_HAPROXY_SOCKET", "").strip()
# Checkpoints: the operator's default root for jobs whose team declared none ("" = none: a
# checkpoint report is refused until a team admin declares a root), and the object-store
# schemes a declared root may use (file:// never: a path is a path).
CHECKPOINT_ROOT = os.environ.get("BRAKELINE_CHECKPOINT_ROOT", "").strip()
CHECKPOINT_SCHEMES = tuple(
    scheme.strip()
    for scheme in os.environ.get("BRAKELINE_CHECKPOINT_SCHEMES", "s3,gs").split(",")
    if scheme.strip() and scheme.strip() != "file"
)
INFERENCE_DRAIN_SECONDS = env_seconds("BRAKELINE_INFERENCE_DRAIN_SECONDS", 30.0)
# A job's heartbeat deadline: its own timeout, else 8 measured step times but never below the
# floor (a fast toy job must not be declared hung by one slow garbage collection), and the
# default until a step time has been measured.
HEARTBEAT_TIMEOUT_FLOOR_SECONDS = env_seconds("BRAKELINE_HEARTBEAT_FLOOR_SECONDS", 10.0)
HEARTBEAT_TIMEOUT_DEFAULT_SECONDS = env_seconds("BRAKELINE_HEARTBEAT_DEFAULT_SECONDS", 60.0)
# Fire drills: each team's full drill set is due once per this period (default 30 days), on the
# beat (breakers.detection.rulesets.due_drills).
DRILL_INTERVAL_SECONDS = env_seconds("BRAKELINE_DRILL_INTERVAL_SECONDS", 30 * 86400.0)
# false: the beat starts no drills (a benchmark's or a test's stack: a drill set is nine real
# PyTorch processes, which would skew what is measured there).
DRILL_SCHEDULE = env_bool("BRAKELINE_DRILL_SCHEDULE", True)
# A drill still queued or running this long after it was asked for lost its runner (the process
# died with the machine): the hourly schedule marks it "error", which pages when it was
# scheduled. A whole drill set takes minutes; an hour leaves room for a slow Slurm queue.
DRILL_RUN_TIMEOUT_SECONDS = env_seconds("BRAKELINE_DRILL_RUN_TIMEOUT_SECONDS", 3600.0)
# May a team's admins make their own training command the drill workload? It runs on this
# machine (or its Slurm) as the console's user, so the operator opts in; off by default.
DRILL_TEAM_COMMANDS = env_bool("BRAKELINE_DRILL_TEAM_COMMANDS", False)
# What a sandbox's environment keeps of the console's: these names only (never its database
# URL, secret key or provider tokens), plus what the drill sets (docs/drills.md).
DRILL_ENVIRONMENT_ALLOWLIST = tuple(
    name.strip()
    for name in os.environ.get(
        "BRAKELINE_DRILL_ENVIRONMENT",
        "PATH,HOME,USER,LOGNAME,LANG,LC_ALL,LC_CTYPE,TZ,TMPDIR,VIRTUAL_ENV,SLURM_CONF",
    ).split(",")
    if name.strip()
)
# Automatic recovery's verdict (docs/recovery.md): how many healthy steps after an automatic
# recovery count as progress (the same cause sooner than that stops and pages: a loop
# otherwise), and at most how many steps a recovery may skip (a wider window is not one bad
# batch: a person looks).
RECOVERY_MIN_PROGRESS_STEPS = env_int("BRAKELINE_RECOVERY_MIN_PROGRESS_STEPS", 10)
RECOVERY_MAX_SKIP_STEPS = env_int("BRAKELINE_RECOVERY_MAX_SKIP_STEPS", 100)
if RECOVERY_MIN_PROGRESS_STEPS < 1:
    raise ImproperlyConfigured(
        f"BRAKELINE_RECOVERY_MIN_PROGRESS_STEPS={RECOVERY_MIN_PROGRESS_STEPS} is below 1."
    )
if RECOVERY_MAX_SKIP_STEPS < 0:
    raise ImproperlyConfigured(
        f"BRAKELINE_RECOVERY_MAX_SKIP_STEPS={RECOVERY_MAX_SKIP_STEPS} is below 0."
    )
# An escalation request nobody decides within this long expires (the next manager is told).
ESCALATION_DECISION_SECONDS = env_seconds("BRAKELINE_ESCALATION_DECISION_SECONDS", 15 * 60.0)

# Notifications (the provider, answers to a page, e-mail, retries): config/notifications.py.
from config.notifications import *  # noqa: E402, F403

# A team's drill command runs as this user when the console runs as root (a name or uid; empty:
# the console's user, without any capability). Either way it cannot read the console's
# environment: every console process is made not dumpable here (core.hardening).
DRILL_SANDBOX_USER = os.environ.get("BRAKELINE_DRILL_SANDBOX_USER", "").strip()
refuse_inspection()
