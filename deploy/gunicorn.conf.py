"""gunicorn configuration for decisionflow (docs/DEPLOY.md): `gunicorn -c deploy/gunicorn.conf.py`.

Every value can be changed from the environment (the GUNICORN_* variables below), so the
systemd unit and the deployment test use this very file. The access log and gunicorn's
own log lines are JSON, one object per line, on stdout and stderr.

Metrics: PROMETHEUS_MULTIPROC_DIR (default var/metrics) is where every worker, and every
command run from cron with the same variable, writes its counts; /metrics sums the folder.
The folder is emptied when the server starts (counters restart from zero, which Prometheus
reads as a reset) and a dead worker's live gauges are dropped.
"""

import json
import logging
import os
import shutil
import time
from pathlib import Path

from gunicorn import glogging

ROOT = Path(__file__).resolve().parent.parent

wsgi_app = "decisionflow.wsgi:application"
chdir = str(ROOT)
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000").split(",")
# Threads, not more processes: a decision spends most of its time waiting on PostgreSQL, and
# each worker process holds its own copy of Django and the workflow engine (~100 MB). One
# worker per core: more processes than cores cost CPU per request (measured under the
# two-host load on 2 cores: 4x2 per host 34 ms, 2x4 26 ms, 1x8 25 ms; docs/DEPLOY.md). Each
# thread keeps its own database connection (DATABASE_CONN_MAX_AGE in the settings).
worker_class = "gthread"
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
# A decision waits at most DECISIONFLOW_DECISION_LOCK_TIMEOUT (3 s) for its case, then
# commits in milliseconds; 30 s leaves room for a slow database without hiding a stuck worker.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
keepalive = 5
# Recycle workers now and then (a leak stays bounded); jitter keeps them from all restarting together.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "5000"))
max_requests_jitter = 500
# Trust X-Forwarded-Proto only from the proxy in front (comma-separated addresses).
forwarded_allow_ips = os.environ.get("GUNICORN_FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
accesslog = os.environ.get("GUNICORN_ACCESSLOG", "-")
errorlog = os.environ.get("GUNICORN_ERRORLOG", "-")
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")

# Set before any worker imports prometheus_client (workers inherit the environment).
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(ROOT / "var" / "metrics"))


def on_starting(server):
    """Start the metrics folder empty: files of workers from a previous run would be summed."""
    folder = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)


def child_exit(server, worker):
    """A dead worker's counters stay in the sum; its live gauges must not."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


class _JsonLine(logging.Formatter):
    def format(self, record):
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}+00:00",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False, separators=(",", ":"))


class JsonLogger(glogging.Logger):
    """gunicorn's logger with every line as JSON; one access line per request."""

    def setup(self, cfg):
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                handler.setFormatter(_JsonLine())

    def access(self, resp, req, environ, request_time):
        if not self.access_log_enabled:
            return
        status = resp.status.split(None, 1)[0] if isinstance(resp.status, str) else resp.status
        fields = {
            "remote_addr": environ.get("REMOTE_ADDR"),
            "method": environ.get("REQUEST_METHOD"),
            "path": environ.get("PATH_INFO"),
            # The query string can carry filters and ids; no secret travels there (tokens are headers).
            "query": environ.get("QUERY_STRING") or None,
            "status": int(status),
            "bytes": getattr(resp, "sent", None),
            "duration_ms": round(request_time.total_seconds() * 1000, 2),
            "user_agent": environ.get("HTTP_USER_AGENT"),
            "pid": os.getpid(),
        }
        try:
            self.access_log.info("access", extra={"fields": fields})
        except Exception:  # noqa: BLE001 - a log line must never fail the request (gunicorn does the same)
            self.exception("could not write the access log line")


logger_class = JsonLogger
# gunicorn 27 opens a control socket at one fixed path per user: two servers on one host (or a
# test beside a running one) would fight over it, and nothing here uses it.
control_socket_disable = True
