"""gunicorn's settings for the web process: `gunicorn --config python:alwayson.gunicorn_conf
--worker-class alwayson.gunicorn_conf.Worker alwayson.asgi` (alwayson/ops/processes.py). Read
from the environment, strictly, like the rest.

Its workers (Worker, below) are uvicorn's, serving the ASGI application: the live pages'
streams (alwayson/web/live.py) stay open for as long as a page is, which only an event loop
holds cheaply. Named on the command line, not here, so `gunicorn --config ... alwayson.wsgi`
still serves WSGI with gunicorn's own workers (pages then poll).
"""

import os

from uvicorn_worker import UvicornWorker


def _positive(name, default):
    raw = os.environ.get(name, str(default)).strip()
    if not raw.isdigit() or int(raw) <= 0:
        raise SystemExit(f"{name} must be a positive integer, not {raw!r}")
    return int(raw)


# Where the web server listens: 0.0.0.0:8000 in a container, 127.0.0.1:8000 behind a proxy.
bind = [os.environ.get("ALWAYSON_WEB_BIND", "127.0.0.1:8000")]
# Worker processes; each request is short (webhooks answer at once, agents run elsewhere), and
# each process holds its open pages' streams on one LISTEN connection.
workers = _positive("WEB_CONCURRENCY", 2)


class Worker(UvicornWorker):
    """uvicorn's gunicorn worker. On a stop, what is still running after 5 s is cancelled:
    the open pages' streams, which never end by themselves (their browsers reconnect to a
    running process), rather than holding the stop for graceful_timeout. Django speaks no
    ASGI lifespan."""

    CONFIG_KWARGS = {
        **UvicornWorker.CONFIG_KWARGS,
        "lifespan": "off",
        "timeout_graceful_shutdown": 5,
    }


# Requests in flight get this long to finish after SIGTERM: under runall's, compose's and
# systemd's stop timeouts (15 s, 30 s, 30 s).
graceful_timeout = 10
timeout = 30
# Access log lines on stdout, errors on stderr: the process manager keeps them.
accesslog = "-"
errorlog = "-"
# No control socket (gunicorn 25.1 on, for gunicornc): the process manager starts and stops
# gunicorn, and its default place, ~/.gunicorn, is unwritable for a user without a home (the
# units' and the image's), which logged "Control server error" at every start. Older gunicorns
# ignore the name.
control_socket_disable = True


def on_starting(server):
    """The master holds every credential the web needs (SECRET_KEY, the webhooks' secrets):
    in a sealed deployment the worker, the same Unix user, must not read its environment.
    Each web worker is hidden again by the egress app's ready(), after it forks."""
    if os.environ.get("ALWAYSON_EGRESS_SOCKET"):
        from alwayson.egress.sealing import hide_from_same_user

        hide_from_same_user()


def post_worker_init(worker):
    """Each web worker adds its metrics every heartbeat interval, not one transaction per
    counted request (alwayson/ops/metrics.py)."""
    from django.conf import settings

    from alwayson.ops.metrics import flush_periodically

    worker.stop_metrics = flush_periodically(settings.ALWAYSON_HEARTBEAT_INTERVAL)


def worker_exit(server, worker):
    stop = getattr(worker, "stop_metrics", None)
    if stop is not None:
        stop()
