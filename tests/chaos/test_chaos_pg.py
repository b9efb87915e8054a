"""The chaos run against PostgreSQL: its own cluster, and the run itself (`-m chaos`).

The run is `python -m tests.chaos` as a subprocess, as CI and a person run it; its table
goes to the output (`pytest -m chaos -s` shows it). Two runs: the standard one (processes,
their network to PostgreSQL, restarts and an outage) and the failover scenario (a synchronous
standby promoted mid-run). ALWAYSON_CHAOS_SECONDS, ALWAYSON_CHAOS_OUTAGE,
ALWAYSON_CHAOS_FAILOVER_SECONDS and ALWAYSON_CHAOS_SEED set the fault windows, the outage and
the seed (a failing seed replays its schedule).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.cluster import Cluster, _run
from tests.chaos.plan import FAILOVER, FAILOVER_FAULT_KINDS, FAULT_KINDS
from tests.support.paths import ROOT

pytestmark = pytest.mark.postgres_only


def clusters():
    """This process's clusters: others (a chaos run, another test worker) come and go meanwhile."""
    listing = [line.split()[:3] for line in _run("pg_lsclusters", "--no-header").splitlines()]
    return [fields for fields in listing if fields[1].startswith(f"chaos{os.getpid()}")]


def server_uid(cluster) -> int:
    """The user the cluster's postmaster runs as (its pid heads postmaster.pid)."""
    listing = _run("pg_lsclusters", "--no-header", cluster.version, cluster.name).split()
    pid = (Path(listing[5]) / "postmaster.pid").read_text().split()[0]
    return os.stat(f"/proc/{pid}").st_uid


def test_the_run_s_cluster_is_its_own_and_is_dropped_even_when_the_run_fails():
    before = clusters()

    with pytest.raises(RuntimeError, match="the run failed"), Cluster.create() as cluster:
        assert cluster.port != 5432
        assert [cluster.version, cluster.name, str(cluster.port)] in clusters()
        assert cluster.is_up()
        assert server_uid(cluster) != 0  # pg_ctlcluster runs the server as its owner
        cluster.restart("immediate")
        assert cluster.is_up()
        raise RuntimeError("the run failed")

    assert clusters() == before
    assert not cluster.exists()


def chaos_run(tmp_path, seconds, *options):
    """`python -m tests.chaos`: its report, after asserting every invariant held and every
    kind of fault of its plan was injected."""
    seed = os.environ.get("ALWAYSON_CHAOS_SEED")
    report_path = tmp_path / "report.json"
    argv = [
        sys.executable,
        "-m",
        "tests.chaos",
        "--seconds",
        seconds,
        "--report",
        str(report_path),
        *options,
    ]
    if seed:
        argv += ["--seed", seed]
    # The table and the fault log go straight to the output, as the command prints them.
    done = subprocess.run(argv, cwd=ROOT, timeout=float(seconds) + 400)

    assert report_path.exists(), f"python -m tests.chaos exited {done.returncode} before its checks"
    report = json.loads(report_path.read_text())
    failed = [row["label"] for row in report["rows"] if not row["ok"]]
    assert done.returncode == 0 and report["ok"], f"seed {report['seed']}: {failed}"
    return {row["label"]: row["value"] for row in report["rows"]}


@pytest.mark.chaos
def test_chaos_run_holds_every_invariant(tmp_path):
    seconds = os.environ.get("ALWAYSON_CHAOS_SECONDS", "60")
    outage = os.environ.get("ALWAYSON_CHAOS_OUTAGE", "20")
    injected = chaos_run(tmp_path, seconds, "--outage", outage)

    assert all(injected[kind] >= 1 for kind in FAULT_KINDS)
    assert FAILOVER not in injected


@pytest.mark.chaos
def test_a_failover_to_a_synchronous_standby_loses_nothing_acknowledged(tmp_path):
    seconds = os.environ.get("ALWAYSON_CHAOS_FAILOVER_SECONDS", "45")
    injected = chaos_run(tmp_path, seconds, "--failover")

    assert injected[FAILOVER] == 1
    assert all(injected[kind] >= 1 for kind in FAILOVER_FAULT_KINDS)
