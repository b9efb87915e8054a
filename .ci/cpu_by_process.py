"""CPU by process name over a command, from the kernel's process accounting (acct(2), as
root): every process that exits while the command runs is counted, those no one waited for
(Chromium's renderers, PostgreSQL's backends) included. Where CI's CPU goes:

    sudo .venv/bin/python .ci/cpu_by_process.py -- .ci/run

Python processes are grouped by how long they lived (a pytest worker lives for the whole
lane; a `manage.py` a test starts, seconds). Accounting is on for the machine while the command
runs; the records go to a temporary file, read and removed at the end."""

import collections
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
import time

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float, ticks), then eight comp_t (utime, stime, ...), then the command's name.
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
TICKS = 100  # AHZ


def seconds(comp_t: int) -> float:
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent, in ticks."""
    return ((comp_t & 0x1FFF) << (3 * (comp_t >> 13))) / TICKS


def lifetime(elapsed: float) -> str:
    for bound in (2, 10, 60, 300):
        if elapsed < bound:
            return f"< {bound} s"
    return ">= 300 s"


def main(command):
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    with tempfile.NamedTemporaryFile(prefix="pacct-", delete=False) as records:
        path = records.name
    if libc.acct(path.encode()) != 0:
        sys.exit(f"acct: {os.strerror(ctypes.get_errno())} (it needs root)")
    started = time.monotonic()
    try:
        code = subprocess.call(command)
    finally:
        libc.acct(None)
    wall = time.monotonic() - started
    with open(path, "rb") as records:
        data = records.read()
    os.unlink(path)
    totals = collections.defaultdict(lambda: [0, 0.0])
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        fields = RECORD.unpack_from(data, offset)
        name = fields[-1].rstrip(b"\0").decode(errors="replace")
        if name.startswith("python"):
            name = f"{name} (lived {lifetime(fields[9] / TICKS)})"
        totals[name][0] += 1
        totals[name][1] += seconds(fields[10]) + seconds(fields[11])
    cpu = sum(total for _, total in totals.values())
    print(f"\n{len(data) // RECORD.size} processes, {cpu:.0f} CPU-seconds in {wall:.0f} s")
    for name, (count, total) in sorted(totals.items(), key=lambda item: -item[1][1])[:25]:
        print(f"{total:9.1f} s {total / cpu:6.1%} {count:6} x {name}")
    return code


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == ["--"]:
        arguments = arguments[1:]
    if not arguments:
        sys.exit("usage: cpu_by_process.py -- COMMAND [ARGS...]")
    sys.exit(main(arguments))
