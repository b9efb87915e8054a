"""The chaos run's own PostgreSQL cluster: Debian's pg_createcluster on a free port, trust
authentication for 127.0.0.1, restarted and stopped at will, dropped at the end.

It is never the shared cluster: its name is `chaos<pid>` and every command names it. The
server processes run as the `postgres` user (pg_ctlcluster switches to the cluster's owner),
so the run itself may be root, as in CI, or postgres.
"""

import os
import pwd
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psycopg

NAME = re.compile(r"^chaos(\d+)(?:standby)?$")
START_TIMEOUT = 60


class ClusterError(RuntimeError):
    pass


def _run(*argv, timeout=120) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ClusterError(f"{argv[0]} not found: the chaos run needs postgresql-common") from None
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{' '.join(argv)} did not finish within {timeout}s") from None
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr.strip()}")
    return done.stdout


def installed_version() -> str:
    """The newest PostgreSQL server installed (Debian keeps each in /usr/lib/postgresql/N)."""
    versions = [p.parent.parent.name for p in Path("/usr/lib/postgresql").glob("*/bin/postgres")]
    if not versions:
        raise ClusterError("no PostgreSQL server found under /usr/lib/postgresql")
    return max(versions, key=lambda v: [int(part) for part in v.split(".")])


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        return listener.getsockname()[1]


def check_user():
    """pg_createcluster writes under /etc/postgresql and /var/lib/postgresql."""
    user = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() != 0 and user != "postgres":
        raise ClusterError(
            f"the chaos run creates its own cluster with pg_createcluster: run it as root or as"
            f" postgres, not {user}"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_leftovers(version: str) -> list[str]:
    """Drop clusters left by chaos runs that died without cleaning up (SIGKILL): named
    chaos<pid> with that pid gone. Returns their names."""
    dropped = []
    for line in _run("pg_lsclusters", "--no-header").splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] != version:
            continue
        match = NAME.match(fields[1])
        if match and not _pid_alive(int(match.group(1))):
            _run("pg_dropcluster", "--stop", version, fields[1])
            dropped.append(fields[1])
    return dropped


class Cluster:
    """Use as a context manager: the cluster is dropped on the way out, whatever happened."""

    def __init__(self, version: str, name: str, port: int):
        self.version = version
        self.name = name
        self.port = port

    @classmethod
    def create(cls, version: str | None = None) -> "Cluster":
        check_user()
        version = version or installed_version()
        drop_leftovers(version)
        cluster = cls(version, f"chaos{os.getpid()}", free_port())
        cluster._create()
        try:
            cluster.start()
        except BaseException:
            cluster.drop()
            raise
        return cluster

    def _create(self):
        _run(
            "pg_createcluster",
            self.version,
            self.name,
            "--port",
            str(self.port),
            "--start-conf",
            "manual",
            "-o",
            "max_connections=200",
            "--",
            "--auth=trust",
            "--no-sync",  # initdb's own sync: a scratch cluster; the server keeps fsync on
        )

    def add_standby(self, via_port: int, synchronous: bool = True) -> "Cluster":
        """A streaming standby of this cluster (pg_basebackup -R into a cluster of its own),
        replicating through `via_port` (a proxy the run can silence, for a replication lag).
        Synchronous: from here on a commit returns once the standby has flushed it
        (synchronous_standby_names, synchronous_commit = on), so promoting it loses nothing
        acknowledged. Set after the copy, the standby's own settings stay those of a lone
        primary, which is what it becomes."""
        standby = Cluster(self.version, f"{self.name}standby", free_port())
        standby._create()
        try:
            data = standby.data_directory()
            # pg_basebackup fills an empty directory; the directory itself stays the owner's.
            for entry in Path(data).iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
            _run(
                *as_owner,
                "pg_basebackup",
                f"--dbname=host=127.0.0.1 port={via_port} user=postgres",
                "--pgdata",
                data,
                "--write-recovery-conf",  # primary_conninfo: through via_port too
                "--wal-method=stream",
                "--checkpoint=fast",
                "--no-sync",
            )
            standby.start()
            state = "sync" if synchronous else "async"
            with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
                if synchronous:
                    conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                    conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
                    conn.execute("SELECT pg_reload_conf()")
                deadline = time.monotonic() + START_TIMEOUT
                while not conn.execute(
                    "SELECT 1 FROM pg_stat_replication WHERE sync_state = %s", [state]
                ).fetchone():
                    if time.monotonic() > deadline:
                        raise ClusterError(f"{standby.name} did not stream as an {state} standby")
                    time.sleep(0.1)
        except BaseException:
            standby.drop()
            raise
        return standby

    def data_directory(self) -> str:
        listing = _run("pg_lsclusters", "--no-header", self.version, self.name).split()
        return listing[5]

    def promote(self, timeout: float = START_TIMEOUT):
        """A standby becomes a primary: out of recovery, accepting writes."""
        self.ctl("promote")
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
                    if not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                        return
            except psycopg.Error:
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name} was not promoted within {timeout}s")
            time.sleep(0.1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.drop()

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def ctl(self, action: str, *options: str):
        # --skip-systemctl-redirect: on a host with systemd, act on this cluster directly.
        _run(
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            self.version,
            self.name,
            action,
            *options,
        )

    def start(self):
        self.ctl("start")
        self.wait_up()

    def stop(self, mode: str = "fast"):
        self.ctl("stop", "-m", mode)

    def restart(self, mode: str = "fast"):
        self.ctl("restart", "-m", mode)
        self.wait_up()

    def is_up(self) -> bool:
        try:
            with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def wait_up(self, timeout: float = START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while not self.is_up():
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster {self.name} did not accept connections in {timeout}s")
            time.sleep(0.1)

    def create_database(self, dbname: str):
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')

    def log_tail(self, lines: int = 40) -> str:
        path = Path(f"/var/log/postgresql/postgresql-{self.version}-{self.name}.log")
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def exists(self) -> bool:
        listing = _run("pg_lsclusters", "--no-header")
        return any(line.split()[:2] == [self.version, self.name] for line in listing.splitlines())

    def drop(self):
        if self.exists():
            _run("pg_dropcluster", "--stop", self.version, self.name)
