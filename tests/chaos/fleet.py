"""The chaos run's processes: the product's loop commands, runall, and the clients.

Each role (w1, s2, d1, i3, a1, r1) is one process at a time, restarted as a new incarnation
after it dies; a worker's id (and so its lease holder name and its PostgreSQL
application_name) carries the incarnation: `w2.3`. Every incarnation logs to its own file.
Processes run in sessions of their own, so a Ctrl-C of the chaos run reaches only the chaos
run, which then kills what it started.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from tests.chaos.plan import ANSWERER, DISPATCHER, INGESTER, RUNALL, SCHEDULER, WORKER, role_of

LOOP_COMMANDS = {WORKER: "runworker", SCHEDULER: "runscheduler", DISPATCHER: "rundispatcher"}
RUNALL_CHILDREN = ("devserver", "runworker", "runscheduler", "rundispatcher")
STOP_TIMEOUT = 25  # runall gives its children 15 s to stop gracefully


def children_of(pid: int) -> list[int]:
    """Live direct children of `pid` (from /proc/<child>/status's PPid)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        if fields.get("PPid", "").strip() == str(pid) and not fields.get("State", "").startswith(
            ("Z", "X")
        ):
            found.append(int(status.parent.name))
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def alive(pid: int) -> bool:
    """Running or stopped; False once exited (a zombie counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass
class Exit:
    name: str
    incarnation: int
    pid: int
    code: int
    at: float
    expected: bool
    why: str


@dataclass
class Proc:
    name: str
    argv_for: object  # callable(incarnation) -> argv
    env: dict
    logdir: Path
    database_url: str  # through the process's own proxy (tests.chaos.proxies)
    incarnation: int = 0
    popen: subprocess.Popen | None = None
    started_at: float = 0.0
    stopped: bool = False  # SIGSTOPped and not yet continued
    finished: bool = False  # a client that completed its work and exited 0
    # Set by the fault injector before it kills or stops this process on purpose.
    expecting_exit: str = ""
    children: list = field(default_factory=list)  # runall: its children, as last seen

    @property
    def role(self) -> str:
        return role_of(self.name)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def worker_id(self) -> str:
        return f"{self.name}.{self.incarnation}"

    @property
    def log_path(self) -> Path:
        return self.logdir / f"{self.name}.{self.incarnation}.log"

    def start(self):
        self.incarnation += 1
        self.stopped = False
        self.expecting_exit = ""
        self.children = []
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv_for(self),
                cwd=settings.BASE_DIR,
                env=self.env_for(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.time()

    @property
    def application_name(self) -> str:
        """Its connections' name in pg_stat_activity: the loop commands set theirs to
        "<role> <worker id>", the clients get theirs from the environment."""
        if self.role in LOOP_COMMANDS:
            return f"alwayson-{self.role} {self.worker_id}"
        return f"chaos-{self.role} {self.worker_id}"

    def env_for(self) -> dict:
        return {
            **self.env,
            "DATABASE_URL": self.database_url,
            "ALWAYSON_APPLICATION_NAME": self.application_name,
        }

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, signum):
        """To the process, or for runall to its whole process group (its children too), as a
        service manager stopping or freezing the unit would."""
        if not self.running():
            return
        try:
            if self.role == RUNALL:
                os.killpg(self.popen.pid, signum)
            else:
                self.popen.send_signal(signum)
        except ProcessLookupError:
            pass

    def kill(self, why: str):
        self.expecting_exit = why
        self.signal(signal.SIGKILL)

    def stop(self):
        self.signal(signal.SIGSTOP)
        self.stopped = True

    def cont(self):
        self.signal(signal.SIGCONT)
        self.stopped = False

    def remember_children(self):
        """runall: note its children while it runs, to check none outlives it."""
        if self.role == RUNALL and self.running():
            current = children_of(self.popen.pid)
            if current:
                self.children = current

    def ask_to_stop(self):
        """SIGCONT and one SIGTERM: the graceful stop (a second SIGTERM means "now")."""
        self.expecting_exit = "shut down"
        self.cont()
        self.signal(signal.SIGTERM)

    def wait_stopped(self, timeout=STOP_TIMEOUT) -> int | None:
        """After ask_to_stop: the exit code; SIGKILL (the group, for runall) past `timeout`."""
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(timeout=10)

    def force_kill(self):
        """At exit, whatever state the run ended in."""
        if self.popen is None:
            return
        with_group = self.role == RUNALL
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                if with_group:
                    os.killpg(self.popen.pid, signum)
                elif self.popen.poll() is None:
                    self.popen.send_signal(signum)
            except (ProcessLookupError, PermissionError):
                pass
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


class Fleet:
    """Every process of the run; `watch()` notices exits and restarts after a short delay."""

    def __init__(self, plan, env, workdir: Path, runall_addr: str, plan_path: Path, t0_of, url_of):
        self.plan = plan
        self.env = env
        self.logdir = workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.plan_path = plan_path
        self.runall_addr = runall_addr
        self.t0_of = t0_of  # the run's start, once known (the ingesters' clock)
        self.procs = {
            name: Proc(name, self.argv, env, self.logdir, url_of(name))
            for name in plan.process_names
        }
        self.exits: list[Exit] = []
        self.restart_at: dict[str, float] = {}
        self.orphans: list[tuple[str, int, str]] = []
        self.restarting = True

    def argv(self, proc: Proc) -> list[str]:
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        role = proc.role
        if role in LOOP_COMMANDS:
            argv = [*manage, LOOP_COMMANDS[role], "--interval", "0.5"]
            argv += ["--worker-id", proc.worker_id, "-v", "1"]
            if role == WORKER:
                argv += ["--concurrency", str(self.plan.concurrency)]
            return argv
        if role == RUNALL:
            return [
                *manage,
                "runall",
                "--addr",
                self.runall_addr,
                "--concurrency",
                "2",
            ]
        client = [sys.executable, "-m", "tests.chaos.clients"]
        log = str(self.workdir / f"{proc.name}.jsonl")
        if role == INGESTER:
            t0 = str(self.t0_of())
            return [*client, "ingest", "--plan", str(self.plan_path), "--name", proc.name,
                    "--log", log, "--t0", t0]  # fmt: skip
        assert role == ANSWERER
        return [*client, "answer", "--plan", str(self.plan_path), "--name", proc.name, "--log", log]

    def of_role(self, role: str) -> list[Proc]:
        return [proc for proc in self.procs.values() if proc.role == role]

    def start(self, roles):
        for proc in self.procs.values():
            if proc.role in roles:
                proc.start()

    def watch(self, database_down: bool):
        """Record exits; schedule restarts (a client that finished its work stays finished)."""
        now = time.time()
        for proc in self.procs.values():
            proc.remember_children()
            if proc.popen is None or proc.finished or proc.name in self.restart_at:
                continue
            code = proc.popen.poll()
            if code is None:
                continue
            if proc.role == INGESTER and code == 0 and not proc.expecting_exit:
                proc.finished = True
                self.exits.append(Exit(proc.name, proc.incarnation, proc.pid, 0, now, True, "done"))
                continue
            why = proc.expecting_exit
            if not why and proc.role == RUNALL and database_down:
                # runall migrates before it starts its children, waiting out an outage
                # within a bound (START_OUTAGE in runall.py): a longer one stops it.
                why = "runall could not start while the database was down"
            self.exits.append(
                Exit(
                    proc.name, proc.incarnation, proc.pid, code, now, bool(why), why or "on its own"
                )
            )
            if proc.role == RUNALL:
                self._check_orphans(proc)
            if self.restarting:
                self.restart_at[proc.name] = now + (0.5 if why else 2.0)
        for name, at in list(self.restart_at.items()):
            if at <= now and self.restarting:
                del self.restart_at[name]
                self.procs[name].start()

    def _check_orphans(self, proc: Proc):
        """runall waits for its children before it exits: none may outlive it (a SIGKILL of
        the group takes them all). Checked a moment later, for the reaping."""
        deadline = time.time() + 3
        left = [pid for pid in proc.children if alive(pid)]
        while left and time.time() < deadline:
            time.sleep(0.1)
            left = [pid for pid in left if alive(pid)]
        for pid in left:
            self.orphans.append((proc.worker_id, pid, " ".join(cmdline(pid))))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def restart_now(self):
        """Drain: every process that should run, running and not stopped."""
        for proc in self.procs.values():
            if proc.stopped:
                proc.cont()
        for name in list(self.restart_at):
            del self.restart_at[name]
            self.procs[name].start()

    def shut_down(self) -> dict[str, int | None]:
        """SIGTERM to every process at once, then wait for each (SIGKILL past the timeout)."""
        self.restarting = False
        live = [proc for proc in self.procs.values() if proc.running()]
        for proc in live:
            proc.ask_to_stop()
        return {proc.worker_id: proc.wait_stopped() for proc in live}

    def force_kill(self):
        self.restarting = False
        for proc in self.procs.values():
            proc.force_kill()
