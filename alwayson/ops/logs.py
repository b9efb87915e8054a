"""Log lines: text or JSON (ALWAYSON_LOG_FORMAT), each tagged with the run it was logged in.

The worker opens a run context around each run (`run_context`); every line logged in it,
by alwayson or by the agent, carries the run's id, inbox and generation, so the lines of one
run can be picked out of a busy worker's output. The context is a contextvar: each of a
pool's slots (threads) has its own.

The LOGGING setting names the formatters and the filter below by their dotted paths
(alwayson/settings/logs.py).
"""

import contextvars
import json
import logging
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime


@dataclass(frozen=True)
class RunContext:
    run_id: str
    inbox_id: int | None
    generation: int | None


_current_run: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "alwayson_run", default=None
)


@contextmanager
def run_context(inbox_id=None, generation=None):
    """The run's context for everything logged inside the block: a fresh run id. The
    worker opens it before its claim (what the claim logs belongs to the run) and names the
    inbox and generation with bind_run once the claim has taken them."""
    token = _current_run.set(RunContext(uuid.uuid4().hex[:12], inbox_id, generation))
    try:
        yield _current_run.get()
    finally:
        _current_run.reset(token)


def bind_run(inbox_id, generation):
    """Name the open run's inbox and generation; its run id stays."""
    run = _current_run.get()
    if run is not None:
        _current_run.set(replace(run, inbox_id=inbox_id, generation=generation))


class RunContextFilter(logging.Filter):
    """Adds the current run (run_id, inbox_id, generation; None outside a run) to records.

    On the handler, not a logger: a handler's filters see the records of every logger that
    reaches it. A field the call passed in `extra` is kept.
    """

    def filter(self, record):
        run = _current_run.get()
        for name in ("run_id", "inbox_id", "generation"):
            if not hasattr(record, name):
                setattr(record, name, getattr(run, name) if run else None)
        record.run_tag = f" [run {record.run_id}]" if record.run_id else ""
        return True


class TextFormatter(logging.Formatter):
    """The plain line, with ` [run <id>]` after the logger's name inside a run."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s%(run_tag)s %(message)s")

    def format(self, record):
        if not hasattr(record, "run_tag"):
            record.run_tag = ""  # a handler without the filter
        return super().format(record)


# What every LogRecord has; anything else on a record came from `extra` or a filter.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "run_tag"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the extra
    fields, and the traceback as `exc_info` when there is one."""

    def format(self, record):
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in line:
                line[name] = value
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def gunicorn_logging(log_format: str) -> dict:
    """gunicorn's logconfig_dict (alwayson/gunicorn_conf.py): its own lines and its access
    lines through the formatter and filter the LOGGING setting gives alwayson's loggers
    (alwayson/settings/logs.py), on stderr, so the web process writes the one format every
    process writes rather than gunicorn's two of its own."""
    if log_format not in ("text", "json"):
        raise ValueError(f"log format must be text or json, not {log_format!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {log_format: {"()": f"{__name__}.{FORMATTERS[log_format].__name__}"}},
        "filters": {"run": {"()": f"{__name__}.{RunContextFilter.__name__}"}},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": log_format,
                "filters": ["run"],
            }
        },
        # As in a process Django sets up: no handler of its own (gunicorn's default gives it
        # one, which would print every library's INFO lines).
        "root": {"level": "WARNING", "handlers": []},
        "loggers": {
            name: {"handlers": ["console"], "level": "INFO", "propagate": False}
            for name in ("gunicorn.error", "gunicorn.access")
        },
    }


FORMATTERS = {"text": TextFormatter, "json": JsonFormatter}
