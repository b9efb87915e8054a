"""Which version of an agent ran a run, kept on its record (RunRecord.produced["version"]).

A version is three things: the agent's dotted path, a fingerprint of its code, and the
revision of the inbox's AgentConfig the run read. The fingerprint is the installed
distribution's name and version when the agent's module comes from one (site-packages),
else a hash of the .py files of the agent's module's directory: an edit to the agent, or to
a module beside it, changes it, and a deployment of the same code keeps it.
"""

import hashlib
import inspect
from functools import cache
from importlib import metadata
from pathlib import Path

# A version's keys, in RunRecord.produced["version"] and the run list's filter.
AGENT, CODE, CONFIG = "agent", "code", "config"


def dotted_path(agent) -> str:
    """The agent's dotted path, for one given as a callable rather than a path."""
    target = agent if hasattr(agent, "__qualname__") else type(agent)
    return f"{target.__module__}.{target.__qualname__}"


def fingerprint(agent) -> str:
    """The agent's code, in short: "dist 1.2.0" or "sha256:<12 hex>" of its module files;
    "unknown" for an agent with no module file (a built-in)."""
    module = inspect.getmodule(agent if hasattr(agent, "__qualname__") else type(agent))
    path = getattr(module, "__file__", None)
    if module is None or not path:
        return "unknown"
    return _fingerprint_of(module.__name__, str(Path(path).resolve()))


@cache
def _fingerprint_of(module_name: str, path: str) -> str:
    # Once per process and module: the files do not change under a running worker, and a
    # deployment restarts it.
    installed = _distribution_of(module_name, path)
    if installed:
        return installed
    digest = hashlib.sha256()
    for file in sorted(Path(path).parent.glob("*.py")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return f"sha256:{digest.hexdigest()[:12]}"


def _distribution_of(module_name: str, path: str) -> str:
    """ "name version" of the distribution that installed the module, when its file is in
    site-packages (an editable install is hashed instead: its files change without a new
    version)."""
    if not any(part in ("site-packages", "dist-packages") for part in Path(path).parts):
        return ""
    top = module_name.split(".")[0]
    names = metadata.packages_distributions().get(top) or []
    for name in names:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:  # pragma: no cover - a broken install
            continue
    return ""


def version(path: str, agent, config_revision: int | None) -> dict:
    """The version a run is stamped with."""
    return {AGENT: path, CODE: fingerprint(agent), CONFIG: config_revision}


def label(value: dict | None) -> str:
    """A version in words, as the run list and timeline show it."""
    if not value:
        return ""
    config = value.get(CONFIG)
    revision = f" config r{config}" if config else ""
    return f"{value.get(AGENT, '?')} @ {value.get(CODE, '?')}{revision}"


__all__ = ["AGENT", "CODE", "CONFIG", "dotted_path", "fingerprint", "label", "version"]
