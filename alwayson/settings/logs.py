"""Log lines: text or JSON, each logged inside a worker's run carrying the run's id, in one
format for every process (docs/how-to/operations.md#logs-and-alerts; gunicorn's own lines go
through the same formatter: alwayson/gunicorn_conf.py).

The formatters and the filter are alwayson/ops/logs.py's, named by their dotted paths: the
logging configuration imports them when Django sets up, and the settings import no app.
"""

from . import env

# alwayson/gunicorn_conf.py reads the same variable with the same choices.
_FORMATS = ("text", "json")


def logging_config(log_format: str) -> dict:
    """The LOGGING setting for `log_format` (text or json): alwayson's loggers to stderr."""
    if log_format not in _FORMATS:
        raise ValueError(f"log format must be one of {', '.join(_FORMATS)}, not {log_format!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "text": {"()": "alwayson.ops.logs.TextFormatter"},
            "json": {"()": "alwayson.ops.logs.JsonFormatter"},
        },
        "filters": {"run": {"()": "alwayson.ops.logs.RunContextFilter"}},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": log_format,
                "filters": ["run"],
            }
        },
        "loggers": {
            # The loop commands set this logger's level from --verbosity
            # (alwayson/runtime/loop.py); the format stays the handler's.
            "alwayson": {"handlers": ["console"], "level": "INFO", "propagate": False},
            # httpx logs each request's full URL at INFO, and an egress service's credential
            # may be a query parameter: the gateway logs its calls itself, without it.
            "httpx": {"level": "WARNING"},
            # A request that failed (500) and its traceback: Django's own handler for these
            # prints only under DEBUG, so a production web process would say nothing.
            "django.request": {"handlers": ["console"], "level": "ERROR"},
            "httpcore": {"level": "WARNING"},
        },
    }


# text: one plain line per record; json: one JSON object per line.
ALWAYSON_LOG_FORMAT = env.one_of("ALWAYSON_LOG_FORMAT", _FORMATS, "text")
LOGGING = logging_config(ALWAYSON_LOG_FORMAT)
