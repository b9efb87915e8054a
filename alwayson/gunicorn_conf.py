"""gunicorn's settings for the web process: `gunicorn --config python:alwayson.gunicorn_conf
alwayson.wsgi` (alwayson/ops/processes.py). Read from the environment, strictly, like the rest.

Its workers are alwayson/web/serving.py's: gunicorn's threaded workers serving Django's WSGI
application, each handing the live pages' streams (alwayson/web/live.py) to an event loop of
its own, and refusing a body larger than any view accepts before it is read.
"""

import os

from alwayson.ops.logs import gunicorn_logging


def _one_of(name, choices, default):
    raw = os.environ.get(name, default).strip().lower()
    if raw not in choices:
        raise SystemExit(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw


def _positive(name, default):
    raw = os.environ.get(name, str(default)).strip()
    if not raw.isdigit() or int(raw) <= 0:
        raise SystemExit(f"{name} must be a positive integer, not {raw!r}")
    return int(raw)


# Where the web server listens: 0.0.0.0:8000 in a container, 127.0.0.1:8000 behind a proxy.
bind = [os.environ.get("ALWAYSON_WEB_BIND", "127.0.0.1:8000")]
# Worker processes; each request is short (webhooks answer at once, agents run elsewhere), and
# each process holds its open pages' streams on one event loop and one LISTEN connection.
workers = _positive("WEB_CONCURRENCY", 2)
# Requests each worker process serves at once, at most, each thread keeping its own PostgreSQL
# connection between requests (ALWAYSON_DB_CONN_MAX_AGE). They take turns: one at a time
# unless one runs long (alwayson/web/serving.py's Turns). Streams take none of them.
threads = _positive("WEB_THREADS", 4)
worker_class = "alwayson.web.serving.Worker"
# How long, in milliseconds, a worker holding more kept-alive connections than another leaves
# a new one for the other to accept before it takes it itself (alwayson/web/serving.py,
# Worker.accept; post_fork gives it each worker): on a host so busy that a woken worker may
# wait longer than that for a core, a longer hold keeps the connections spread.
accept_hold_ms = _positive("ALWAYSON_WEB_ACCEPT_HOLD_MS", 20)

# Requests in flight get this long to finish after SIGTERM: under runall's, compose's and
# systemd's stop timeouts (15 s, 30 s, 30 s).
graceful_timeout = 10
timeout = 30
# gunicorn's own lines and one line per request, in the format every alwayson process writes
# (ALWAYSON_LOG_FORMAT, on stderr; the process manager keeps them): the loggers gunicorn.error
# and gunicorn.access, through alwayson's handler. The time, level and logger are the
# formatter's; an access line says the client, the request, the status, the bytes sent, the
# milliseconds it took, the referrer and the user agent.
accesslog = "-"
errorlog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms "%(f)s" "%(a)s"'
logconfig_dict = gunicorn_logging(_one_of("ALWAYSON_LOG_FORMAT", ("text", "json"), "text"))
# No control socket (gunicorn 25.1 on, for gunicornc): the process manager starts and stops
# gunicorn, and its default place, ~/.gunicorn, is unwritable for a user without a home (the
# units' and the image's), which logged "Control server error" at every start.
control_socket_disable = True


def on_starting(server):
    """The master holds every credential the web needs (SECRET_KEY, the webhooks' secrets):
    in a sealed deployment the worker, the same Unix user, must not read its environment.
    Each web worker is hidden again by the egress app's ready(), after it forks."""
    if os.environ.get("ALWAYSON_EGRESS_SOCKET"):
        from alwayson.egress.sealing import hide_from_same_user

        hide_from_same_user()


def post_fork(server, worker):
    worker.accept_hold = accept_hold_ms / 1000


def post_worker_init(worker):
    """Each web worker adds its metrics every heartbeat interval, not one transaction per
    counted request (alwayson/ops/metrics/)."""
    from django.conf import settings

    from alwayson.ops.metrics import flush_periodically

    worker.stop_metrics = flush_periodically(settings.ALWAYSON_HEARTBEAT_INTERVAL)


def worker_exit(server, worker):
    stop = getattr(worker, "stop_metrics", None)
    if stop is not None:
        stop()
