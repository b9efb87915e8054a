"""The production process set: one source for `runall --production`, `deploy/` and the tests.

Commands are written as the deployment files write them, run from the project directory:
`python manage.py ...`, and `gunicorn ...` from the same environment; the deployment files
must run exactly these.
"""

import shutil
import sys
from pathlib import Path

# Once per release, before the processes start: one host, one at a time. `workerrole`, as the
# tables' owner after migrate, gives the sealed worker's own role (ALWAYSON_WORKER_DATABASE_URL)
# what this release's runs need, and nothing more (docs/how-to/egress.md).
RELEASE = {
    "migrate": ("python", "manage.py", "migrate", "--noinput"),
    "workerrole": ("python", "manage.py", "workerrole"),
    "collectstatic": ("python", "manage.py", "collectstatic", "--noinput"),
}

# The long-running processes. Run as many of each as you like (PostgreSQL), but one egress
# per socket; each of the three loops beats its Process row, which /healthz and
# `manage.py status` read.
PROCESSES = {
    # gunicorn serving Django's WSGI application with alwayson/web/serving.py's threaded
    # workers (named in the config), which hand the live pages' streams to an event loop of
    # their own; /healthz and every other page as before.
    "web": ("gunicorn", "--config", "python:alwayson.gunicorn_conf", "alwayson.wsgi"),
    # The one process with the credentials; the worker is sealed and calls through its
    # socket, ALWAYSON_EGRESS_SOCKET (docs/how-to/egress.md#the-sealed-worker).
    "egress": ("python", "manage.py", "runegress"),
    "worker": ("python", "manage.py", "runworker", "--concurrency", "4"),
    "scheduler": ("python", "manage.py", "runscheduler"),
    "dispatcher": ("python", "manage.py", "rundispatcher"),
}

# Run on a schedule, one pass each: deploy/systemd/alwayson-prune.timer runs it daily.
SCHEDULED = {
    "prune": ("python", "manage.py", "prune"),
}


def local_argv(command, base_dir: Path) -> list[str]:
    """`command` for this interpreter and checkout: `python` is this interpreter, `manage.py`
    this project's, `gunicorn` the script installed beside this interpreter."""
    program, *args = command
    if program == "python":
        program = sys.executable
    elif program == "gunicorn":
        beside = Path(sys.executable).with_name("gunicorn")
        program = str(beside) if beside.exists() else shutil.which("gunicorn") or "gunicorn"
    return [program, *(str(base_dir / arg) if arg == "manage.py" else arg for arg in args)]
