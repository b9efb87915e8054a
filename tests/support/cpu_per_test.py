"""A pytest plugin that writes, per test, its wall time, the CPU of the process running it,
and the CPU of the processes it started and waited for: where the suite's time goes, and
whether a test waits or works. Not loaded by default:

    CPU_PER_TEST=/tmp/cpu CI=true .venv/bin/python -m pytest -n auto -p tests.support.cpu_per_test

writes /tmp/cpu.<xdist worker>.jsonl, one JSON object per test (id, wall, self, children, in
seconds). A test's wall minus both CPUs is what it waited for (a server, a sleep, a commit's
fsync). What its processes' children did not wait for (Chromium's renderers, a daemon) is in
neither: `.ci/cpu_by_process.py` counts every process."""

import json
import os
import resource
import time

import pytest


def _cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started, (own, children) = time.monotonic(), _cpu()
    yield
    wall, (own_after, children_after) = time.monotonic() - started, _cpu()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    record = {
        "id": item.nodeid,
        "wall": wall,
        "self": own_after - own,
        "children": children_after - children,
    }
    with open(f"{os.environ.get('CPU_PER_TEST', 'cpu-per-test')}.{worker}.jsonl", "a") as out:
        out.write(json.dumps(record) + "\n")
