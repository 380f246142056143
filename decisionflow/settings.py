"""decisionflow settings: everything that varies between machines comes from the environment.

See .env.example for the variables. A new checkout runs on a SQLite file with DEBUG on;
production sets DATABASE_URL to PostgreSQL, DEBUG off and a SECRET_KEY.
"""

import importlib.util
from pathlib import Path

import environ
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env.bool("DEBUG", default=False)

# A production secret never has a default: without one, start-up stops here.
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Set SECRET_KEY in the environment (or in .env), "
            "or set DEBUG=1 for a local development run."
        )
    SECRET_KEY = "django-insecure-local-development-only"

# Old secrets still accepted when verifying what was signed with them (sessions, checkpoint
# HMACs), so the secret can be rotated without refusing every pending review at once.
SECRET_KEY_FALLBACKS = env.list("SECRET_KEY_FALLBACKS", default=[])

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"] if DEBUG else [])

# Test-only switches (crash points, the lost-receipt fault) exist only when this is on.
DECISIONFLOW_FAULT_INJECTION = env.bool("DECISIONFLOW_FAULT_INJECTION", default=False)

# How long a decision or an edit waits for its case (the case lock, then row locks) before it
# answers "busy" (API 409 case_busy, exit 6, an admin message). Bulk commands keep their own.
DECISIONFLOW_DECISION_LOCK_TIMEOUT = env.float("DECISIONFLOW_DECISION_LOCK_TIMEOUT", default=3.0)

# Four eyes: whoever made a human change in a proposal cannot approve it (they may decline).
# Off only where one person is the whole review team (docs/CONFIGURATION.md, docs/ADMIN.md).
DECISIONFLOW_FOUR_EYES = env.bool("DECISIONFLOW_FOUR_EYES", default=True)

# The review queue (docs/QUEUE.md). The SLA target of a pending review ("4h", "30m", "2d"),
# per policy name where set; a review is at risk past DECISIONFLOW_REVIEW_AT_RISK of its
# target (the last 25%), breached past all of it. A claim lasts the lease unless renewed.
# On breach: stay_pending, or decline (fail closed, as the system actor; never approve).
DECISIONFLOW_REVIEW_SLA = env.str("DECISIONFLOW_REVIEW_SLA", default="4h")
DECISIONFLOW_REVIEW_SLA_BY_POLICY = env.json("DECISIONFLOW_REVIEW_SLA_BY_POLICY", default={})
DECISIONFLOW_REVIEW_AT_RISK = env.float("DECISIONFLOW_REVIEW_AT_RISK", default=0.75)
DECISIONFLOW_REVIEW_CLAIM_LEASE = env.str("DECISIONFLOW_REVIEW_CLAIM_LEASE", default="15m")
DECISIONFLOW_REVIEW_ON_BREACH = env.str("DECISIONFLOW_REVIEW_ON_BREACH", default="stay_pending")
DECISIONFLOW_REVIEW_ON_BREACH_BY_POLICY = env.json("DECISIONFLOW_REVIEW_ON_BREACH_BY_POLICY", default={})
# Escalation steps per policy name (docs/QUEUE.md, "Escalation"): at_risk / breached ->
# notify:GROUP, reassign:GROUP or (breached) expire. Outside the policy's identity.
DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY = env.json("DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY", default={})
# How often each task worker takes the due escalation steps (seconds; sla_report does too).
DECISIONFLOW_ESCALATION_SWEEP_INTERVAL = env.float("DECISIONFLOW_ESCALATION_SWEEP_INTERVAL", default=60.0)

# Notifications (docs/QUEUE.md): a review begun, at risk or breached, sent by the task
# workers by email (Django's mail framework, EMAIL_* below) and/or a Slack incoming webhook.
# Both unset (the default): nothing is written or enqueued.
DECISIONFLOW_NOTIFY_EMAIL_TO = env.list("DECISIONFLOW_NOTIFY_EMAIL_TO", default=[])
DECISIONFLOW_NOTIFY_WEBHOOK_URL = env.str("DECISIONFLOW_NOTIFY_WEBHOOK_URL", default="")
# The most one webhook call may take, connecting and the whole answer included (a duration);
# an answer that has not ended by then is a failed try.
DECISIONFLOW_NOTIFY_WEBHOOK_DEADLINE = env.str("DECISIONFLOW_NOTIFY_WEBHOOK_DEADLINE", default="10s")
DECISIONFLOW_NOTIFY_MAX_ATTEMPTS = env.int("DECISIONFLOW_NOTIFY_MAX_ATTEMPTS", default=5)
# A Sending row older than this is taken for a dead worker's: Unknown, then sent once more.
DECISIONFLOW_NOTIFY_LEASE = env.str("DECISIONFLOW_NOTIFY_LEASE", default="5m")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="decisionflow@localhost")
# The remote delivery of an approved reply to the customer's ticket (docs/DELIVERY.md): the
# helpdesk's base URL (POST {url}/replies, GET {url}/replies/{operation id}) and its bearer
# token. Unset URL (the default): no delivery is written or sent, the local effect is the only one.
DECISIONFLOW_DELIVERY_URL = env.str("DECISIONFLOW_DELIVERY_URL", default="")
DECISIONFLOW_DELIVERY_TOKEN = env.str("DECISIONFLOW_DELIVERY_TOKEN", default="")
# httpx timeouts, in seconds: connecting, each read and write of the request, and the wait for
# a pooled connection. A send whose answer does not come within the read timeout is Unknown.
DECISIONFLOW_DELIVERY_CONNECT_TIMEOUT = env.float("DECISIONFLOW_DELIVERY_CONNECT_TIMEOUT", default=5.0)
DECISIONFLOW_DELIVERY_READ_TIMEOUT = env.float("DECISIONFLOW_DELIVERY_READ_TIMEOUT", default=15.0)
DECISIONFLOW_DELIVERY_WRITE_TIMEOUT = env.float("DECISIONFLOW_DELIVERY_WRITE_TIMEOUT", default=15.0)
DECISIONFLOW_DELIVERY_POOL_TIMEOUT = env.float("DECISIONFLOW_DELIVERY_POOL_TIMEOUT", default=5.0)
# The most one request to the helpdesk may take, all of the above and the whole answer (a
# duration); each timeout above is capped by what is left of it. An answer cut off after the
# request went out is Unknown, as a read timeout is.
DECISIONFLOW_DELIVERY_DEADLINE = env.str("DECISIONFLOW_DELIVERY_DEADLINE", default="20s")
# The longest helpdesk answer read; a longer one is a bad answer (the try is Unknown).
DECISIONFLOW_DELIVERY_MAX_RESPONSE_BYTES = env.int("DECISIONFLOW_DELIVERY_MAX_RESPONSE_BYTES", default=64 * 1024)
# The wait before try n+1 after n failed tries: base * 2^(n-1), at most max (seconds).
DECISIONFLOW_DELIVERY_BACKOFF = env.float("DECISIONFLOW_DELIVERY_BACKOFF", default=5.0)
DECISIONFLOW_DELIVERY_BACKOFF_MAX = env.float("DECISIONFLOW_DELIVERY_BACKOFF_MAX", default=600.0)
# A worker holds a Sending delivery this long; past it the sweep takes the worker for dead and
# turns the delivery Unknown. Longer than a whole try (the timeouts above) by far.
DECISIONFLOW_DELIVERY_LEASE = env.str("DECISIONFLOW_DELIVERY_LEASE", default="5m")
# How often each worker (`manage.py db_worker`) runs the delivery sweep, in seconds.
DECISIONFLOW_DELIVERY_SWEEP_INTERVAL = env.float("DECISIONFLOW_DELIVERY_SWEEP_INTERVAL", default=30.0)
# reconcile alerts (its exit bits, docs/COMMANDS.md) on a delivery Unknown, or still Queued or
# Sending, this long after its approval.
DECISIONFLOW_DELIVERY_UNKNOWN_ALERT = env.str("DECISIONFLOW_DELIVERY_UNKNOWN_ALERT", default="15m")
DECISIONFLOW_DELIVERY_QUEUED_ALERT = env.str("DECISIONFLOW_DELIVERY_QUEUED_ALERT", default="15m")
# The task backend: the database (SQLite or PostgreSQL, no broker); a team may name another,
# e.g. django_tasks.backends.immediate.ImmediateBackend to send within the request, or
# django_tasks_rq.RQBackend for Redis and `manage.py rqworker` (docs/QUEUE.md, "Workers on RQ").
TASKS_RQ_BACKEND = "django_tasks_rq.RQBackend"
TASKS = {
    "default": {
        "BACKEND": env.str("DECISIONFLOW_TASKS_BACKEND", default="django_tasks_db.DatabaseBackend"),
    }
}
# The Redis that the RQ backend queues on (django-rq's RQ_QUEUES), read only with that backend.
DECISIONFLOW_TASKS_REDIS_URL = env.str("DECISIONFLOW_TASKS_REDIS_URL", default="redis://127.0.0.1:6379/0")
RQ_QUEUES = {"default": {"URL": DECISIONFLOW_TASKS_REDIS_URL}}

# The largest request body the API accepts; larger ones get 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DECISIONFLOW_MAX_BODY_BYTES", default=256 * 1024)
# The longest draft body an edit or a case file may bring, in characters (code points); a
# longer one is refused (docs/TEXT.md). A reply is read by a person: the demo's longest is
# about 500.
DECISIONFLOW_MAX_BODY_CHARS = env.int("DECISIONFLOW_MAX_BODY_CHARS", default=20_000)
# The pipeline's Idempotency-Keys (docs/INTAKE.md): how long a key and its answer are kept
# (then `manage.py prune_checkpoints` deletes them), and how long a first request may run
# before a retry with its key takes it over (its process is then taken to have stopped).
DECISIONFLOW_IDEMPOTENCY_KEEP = env.str("DECISIONFLOW_IDEMPOTENCY_KEEP", default="24h")
DECISIONFLOW_IDEMPOTENCY_LEASE = env.str("DECISIONFLOW_IDEMPOTENCY_LEASE", default="60s")

# Prometheus metrics (docs/DEPLOY.md). PROMETHEUS_MULTIPROC_DIR is the folder that every process
# of a host (gunicorn workers, cron commands) writes its counts to; /metrics sums them. Metrics
# are on when it is set (the shipped gunicorn config sets it), or with DECISIONFLOW_METRICS=1
# for a single process. Off, nothing imports prometheus_client (a faster command start).
DECISIONFLOW_METRICS = env.bool("DECISIONFLOW_METRICS", default=bool(env.str("PROMETHEUS_MULTIPROC_DIR", default="")))

# Traces (core/tracing.py; docs/DEPLOY.md, "Tracing"): on, the web server and the task
# workers send OpenTelemetry spans over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (the SDK reads
# it and the other OTEL_* variables itself). On when that is set, or with
# DECISIONFLOW_TRACING=1 (the SDK's default endpoint, localhost:4318). Off, nothing imports
# the OpenTelemetry SDK or its instrumentations.
DECISIONFLOW_TRACING = env.bool(
    "DECISIONFLOW_TRACING", default=bool(env.str("OTEL_EXPORTER_OTLP_ENDPOINT", default=""))
)

# /metrics (docs/DEPLOY.md): served only to these addresses or networks (comma-separated, e.g.
# "10.0.0.0/8,127.0.0.1") and to requests carrying this bearer token: each one that is set must
# pass; with neither, to nobody (loopback only with DEBUG). REMOTE_ADDR is the peer: behind a proxy on the same host, that is
# the proxy, so protect it with the token or keep /metrics off the proxy.
DECISIONFLOW_METRICS_ALLOW = env.list("DECISIONFLOW_METRICS_ALLOW", default=["127.0.0.1", "::1"] if DEBUG else [])
DECISIONFLOW_METRICS_TOKEN = env.str("DECISIONFLOW_METRICS_TOKEN", default="")

# The Ed25519 key that signs audit exports and the chain's seals (core/signing.py,
# docs/AUDIT.md): the PEM text, or a PEM file (the text wins when both are set). Neither
# set: with DEBUG a development key is made once in var/; without DEBUG, signing refuses
# (exit 78, HTTP 503). `manage.py audit_keygen DIR` makes a pair; rotation: docs/DEPLOY.md.
DECISIONFLOW_AUDIT_SIGNING_KEY = env.str("DECISIONFLOW_AUDIT_SIGNING_KEY", default="")
DECISIONFLOW_AUDIT_SIGNING_KEY_FILE = env.str("DECISIONFLOW_AUDIT_SIGNING_KEY_FILE", default="")
DECISIONFLOW_AUDIT_DEV_KEY_FILE = BASE_DIR / "var" / "audit-signing-key.dev.pem" if DEBUG else None
# The public keys that verify the chain's seals (docs/AUDIT.md, "Verifying"): PEM files, every
# key that signed a seal still kept; empty: the signing key's own public half.
DECISIONFLOW_AUDIT_PUBLIC_KEY_FILES = env.list("DECISIONFLOW_AUDIT_PUBLIC_KEY_FILES", default=[])

INSTALLED_APPS = [
    # Admin modules are imported by decisionflow/urls.py, not at start-up: the admin pages
    # import the workflow and through it agent-framework (~0.3 s), which no cron command needs.
    "django.contrib.admin.apps.SimpleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "cases",
    "reviews",
    "effects",
    "workflow",
    "audit",
    "workplace",
    "api",
    # Django's task framework (the django.tasks backport) and its database backend: the
    # workers that send notifications (docs/QUEUE.md); `manage.py db_worker` runs one.
    "django_tasks",
    "django_tasks_db",
]
# /api/docs serves the Swagger UI bundled in the pinned django-ninja package (its static/ and
# templates/ folders, api.api.LocalSwagger), never a CDN that an offline network cannot reach.
# Found without importing ninja: as an installed app it would load pydantic (~0.1 s) at the
# start of every command, cron's reconcile included.
NINJA_DIR = Path(importlib.util.find_spec("ninja").origin).parent  # type: ignore[arg-type, union-attr]
STATICFILES_DIRS = [NINJA_DIR / "static"]
if DECISIONFLOW_METRICS:
    INSTALLED_APPS.append("django_prometheus")
# django-rq (the RQ backend's queues and its checks) only with that backend: it imports rq and
# redis, which no command of the database backend needs.
if TASKS["default"]["BACKEND"] == TASKS_RQ_BACKEND:
    INSTALLED_APPS.append("django_rq")

MIDDLEWARE = [
    # Request counts and latencies for /metrics; its "after" half is the last entry.
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    # /healthz, /readyz and /metrics, answered before host validation and the HTTPS redirect.
    "decisionflow.health.OperationsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # The Content-Security-Policy header (CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    # Static files from STATIC_ROOT (collectstatic), compressed and cached forever by hash.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]
if not DECISIONFLOW_METRICS:
    MIDDLEWARE = [m for m in MIDDLEWARE if not m.startswith("django_prometheus.")]

ROOT_URLCONF = "decisionflow.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", NINJA_DIR / "templates"],
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

WSGI_APPLICATION = "decisionflow.wsgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Writers queue for the lock instead of failing at once with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update({"timeout": 30, "transaction_mode": "IMMEDIATE"})
else:
    # Persistent connections: a new PostgreSQL connection per request forks a server backend
    # (~8 ms, and more of the server's CPU than the request's own statements), so each web
    # thread keeps its connection for this many seconds (0: close after every request, as
    # Django does by default). Checked before reuse, so one the server dropped is replaced,
    # never handed to a request. Needs max_connections >= hosts x workers x threads + cron.
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=300))
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
    # psycopg's own prepared statements for the commit's two statements and begin's write
    # (effects/store.py, workflow/store.py): each is planned once per connection, after it
    # has run this many times there (empty: never). Turned off by itself on a connection
    # that a pooler answers (core/poolers.py), where a statement prepared on one server
    # session is missing on the next. Figures: docs/PERFORMANCE.md, "Prepared statements".
    _prepare_threshold = env.str("DATABASE_PREPARE_THRESHOLD", default="5").strip()
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = (
        int(_prepare_threshold) if _prepare_threshold else None
    )
# A streaming replica for the read-only pages (core/replicas.py; docs/DEPLOY.md, "Read
# replicas"): the case, proposal and queue lists, the history pages, the history export and
# the API's case view read it while it is at most DECISIONFLOW_REPLICA_MAX_LAG behind (a
# duration); everything that answers "did it commit?" reads the primary. A replica that does
# not answer within DATABASE_REPLICA_CONNECT_TIMEOUT seconds is left for the primary.
DATABASE_REPLICA_URL = env.str("DATABASE_REPLICA_URL", default="")
DECISIONFLOW_REPLICA_MAX_LAG = env.str("DECISIONFLOW_REPLICA_MAX_LAG", default="5s")
if DATABASE_REPLICA_URL:
    if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_REPLICA_URL: a read replica needs DATABASE_URL on PostgreSQL")
    DATABASES["replica"] = env.db_url_config(DATABASE_REPLICA_URL)
    if DATABASES["replica"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_REPLICA_URL: name a PostgreSQL standby (postgres://...)")
    DATABASES["replica"].update(
        CONN_MAX_AGE=DATABASES["default"]["CONN_MAX_AGE"],
        CONN_HEALTH_CHECKS=True,
        # Read-only pages are plain reads: never the primary's prepared statements.
        OPTIONS={"connect_timeout": env.int("DATABASE_REPLICA_CONNECT_TIMEOUT", default=2)},
        TEST={"MIRROR": "default"},
    )
    DATABASE_ROUTERS = ["core.replicas.ReplicaRouter"]
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
        "core.replicas.OwnWritesMiddleware",
    )
# The same backends, counting queries, errors and their durations for /metrics.
_PROMETHEUS_BACKENDS = {
    "django.db.backends.sqlite3": "django_prometheus.db.backends.sqlite3",
    "django.db.backends.postgresql": "django_prometheus.db.backends.postgresql",
}
if DECISIONFLOW_METRICS:
    for _database in DATABASES.values():
        _database["ENGINE"] = _PROMETHEUS_BACKENDS.get(_database["ENGINE"], _database["ENGINE"])
    # Django's default cache (local memory, per process), counted for /metrics.
    CACHES = {"default": {"BACKEND": "django_prometheus.cache.backends.locmem.LocMemCache"}}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Every admin page shows times with seconds and the zone, like the custom pages (13:08:35 UTC).
FORMAT_MODULE_PATH = ["decisionflow.formats"]

STATIC_URL = "static/"
# Files served at the site's root by WhiteNoise, as they are (no collectstatic): the favicon,
# which every browser asks for at /favicon.ico on each page, so no page logs a 404 for it.
WHITENOISE_ROOT = BASE_DIR / "decisionflow" / "root"
# `manage.py collectstatic` writes here; WhiteNoise serves it (docs/DEPLOY.md).
STATIC_ROOT = env.path("STATIC_ROOT", default=BASE_DIR / "var" / "static")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Hashed names (cache-busting) and gzip copies; with DEBUG off, collectstatic must run first.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

LOGIN_URL = "admin:login"

# Production hardening; `manage.py check --deploy` is clean with DEBUG off.
# (The operations endpoints answer plain HTTP by address: OperationsMiddleware serves them first.)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not DEBUG)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
# An internal tool's host name does not belong on the browsers' public HSTS preload list
# (submitting is public and slow to undo), so preloading stays an explicit choice and
# `check --deploy` does not nag about it until someone makes that choice.
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# Content-Security-Policy (django-csp; docs/DEPLOY.md, "Content-Security-Policy"). Every script
# and style of every page is a static file of ours, the admin's or Swagger UI's: no inline
# script, style or event handler anywhere, so neither 'unsafe-inline' nor a nonce is needed.
# /api/docs alone adds data: images (Swagger UI's icons are data: URLs in its CSS; api/urls.py).
# DECISIONFLOW_CSP_REPORT_ONLY=1 sends the same policy as Content-Security-Policy-Report-Only:
# browsers report what it would block and block nothing (to try it behind a proxy that adds
# its own scripts). DECISIONFLOW_CSP_REPORT_URI is where browsers POST those reports.
_CSP = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
        "report-uri": env.str("DECISIONFLOW_CSP_REPORT_URI", default="") or None,
    }
}
if env.bool("DECISIONFLOW_CSP_REPORT_ONLY", default=False):
    CONTENT_SECURITY_POLICY_REPORT_ONLY = _CSP
else:
    CONTENT_SECURITY_POLICY = _CSP

LOG_LEVEL = env.str("LOG_LEVEL", default="WARNING")
# Logs go to stderr. The decision events (logger decisionflow.events) are one JSON line each,
# at INFO (DECISIONFLOW_EVENT_LOG_LEVEL=WARNING silences them), on the web's stderr and, when
# DECISIONFLOW_EVENT_LOG_FILE is set, in that file (the only place a command writes them).
# LOG_FORMAT=json makes every other log line JSON too. One log line per event: a single
# console handler, on the root; Django's own "django" logger (which under DEBUG printed every
# line a second time) only propagates to it, and 4xx responses are logged without their traceback. The format: docs/DEPLOY.md, "Logs".
LOG_FORMAT = env.str("LOG_FORMAT", default="text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"client_errors_on_one_line": {"()": "core.logfilters.ClientErrorsOnOneLine"}},
    "formatters": {
        "json": {"()": "core.observability.JsonFormatter"},
        "text": {"format": "%(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "text",
            "filters": ["client_errors_on_one_line"],
        },
        "events": {"class": "logging.StreamHandler", "formatter": "json"},
        # Commands keep stderr for their one error line: their events go only to this file.
        **(
            {
                "events_file": {
                    "class": "logging.handlers.WatchedFileHandler",  # reopened after logrotate
                    "filename": env.str("DECISIONFLOW_EVENT_LOG_FILE"),
                    "formatter": "json",
                }
            }
            if env.str("DECISIONFLOW_EVENT_LOG_FILE", default="")
            else {}
        ),
    },
    "loggers": {
        "django": {"handlers": [], "level": LOG_LEVEL, "propagate": True},
        "decisionflow.events": {
            "handlers": ["events"] + (["events_file"] if env.str("DECISIONFLOW_EVENT_LOG_FILE", default="") else []),
            "level": env.str("DECISIONFLOW_EVENT_LOG_LEVEL", default="INFO"),
            "propagate": False,
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}
