"""alwayson: durable machinery around an always-on AI agent's loop (README.md).

`__version__` is the installed distribution's version, which is pyproject.toml's: the one
number /healthz, the `--version` of every alwayson command and each loop process's heartbeat
report, and the one CHANGELOG.md's upgrade notes are written against.
"""

from importlib import metadata

try:
    __version__ = metadata.version("alwayson")
except metadata.PackageNotFoundError:  # a checkout on sys.path that was never installed
    __version__ = "0+unknown"
