"""The deployment files in deploy/, read as the tests compare them with the production
process list."""

import re
from pathlib import Path

from tests.support.paths import ROOT

DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"


def normalized(argv):
    """A command as alwayson/ops/processes.py writes it: `python` for any Python interpreter,
    `gunicorn` for its script wherever installed, `manage.py` wherever the checkout is."""
    argv = list(argv)
    script = len(argv) > 1 and Path(argv[1]).name == "gunicorn"  # as /proc shows it run
    if script and re.fullmatch(r"python[\d.]*", Path(argv[0]).name):
        argv = argv[1:]
    program = Path(argv[0]).name
    program = "python" if re.fullmatch(r"python[\d.]*", program) else program
    rest = ["manage.py" if Path(arg).name == "manage.py" else arg for arg in argv[1:]]
    return (program, *rest)


def unit_values(path, key):
    return [
        line.split("=", 1)[1]
        for line in path.read_text().splitlines()
        if line.startswith(f"{key}=")
    ]
