"""Which installed distributions differ from a lock file, run with the virtualenv's Python.

CI's newest-versions lane prints this before its suite, so when the suite fails there and not
from the lock, the log names the releases that did it: `python .ci/newer_than_lock.py
requirements/test.txt`. It only reports; the suite decides.
"""

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

# `name==version ; marker \` (the marker, and the backslash before the hashes, are optional).
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s*;\s*(.+?))?\s*\\?$")


def pinned(lock: Path) -> dict[str, str]:
    """The lock's pins that apply to this interpreter, by normalized name."""
    pins = {}
    for line in lock.read_text().splitlines():
        match = PIN.match(line)
        if match and (match[3] is None or Marker(match[3]).evaluate()):
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def main(lock: Path) -> None:
    pins = pinned(lock)
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version
        for dist in metadata.distributions()
        if dist.metadata["Name"]
    }
    newer = [
        f"  {name} {installed[name]} (the lock has {pins[name]})"
        for name in sorted(pins.keys() & installed.keys())
        if installed[name] != pins[name]
    ]
    # alwayson itself, and the venv's own pip, are not in the lock.
    unlocked = sorted(installed.keys() - pins.keys() - {"alwayson", "pip"})
    if not newer and not unlocked:
        print(f"the same versions as {lock}")
        return
    if newer:
        print(f"installed here, not as {lock} pins them:", *newer, sep="\n")
    if unlocked:
        print(f"not in {lock} at all:", *(f"  {n} {installed[n]}" for n in unlocked), sep="\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
