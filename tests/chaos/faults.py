"""The fault injector: carries out the plan's schedule against the fleet and the cluster.

Process faults happen in the chaos process's main loop; database restarts and the outage run
in a thread of their own, one at a time, so the loop keeps restarting what they knock over.
Every fault is recorded with its wall-clock interval, which is what explains a repeated or a
lost delivery later.
"""

import heapq
import itertools
import os
import queue
import signal
import threading
import time
from collections import Counter

from django.db import DatabaseError, connection
from django.utils import timezone

from inbox.models import Lease
from tests.chaos.fleet import RUNALL_CHILDREN, children_of, cmdline
from tests.chaos.plan import (
    DATABASE_FAULTS,
    FAILOVER,
    KILL,
    PG_OUTAGE,
    PG_RESTART_FAST,
    PG_RESTART_IMMEDIATE,
    PROXY_BLACKHOLE,
    PROXY_LATENCY,
    PROXY_RESET,
    RUNALL,
    RUNALL_CHILD_KILL,
    STOP,
    TERMINATE,
    WORKER,
)

TERMINATE_SEARCH = 3.0  # seconds spent looking for a backend inside a transaction
STALL_SEARCH = 5.0  # seconds spent looking for a worker in the middle of a slow run
REPLICATION_LAG = 3.0  # seconds the standby falls behind before the failover
DISTURBED_AFTER = 10.0  # seconds after a database fault in which a failed start is expected


class Injector:
    def __init__(self, plan, fleet, cluster, t0, say, proxies, standby=None, replication=None):
        self.plan = plan
        self.fleet = fleet
        self.cluster = cluster  # the primary: the standby, once it is promoted
        self.standby = standby
        self.replication = replication  # the standby's link to the primary (a TcpProxy)
        self.proxies = proxies
        self._silenced = Counter()  # blackholes in force, by proxy
        self.t0 = t0
        self.say = say
        self.records: list[dict] = []
        self._queue = []
        self._seq = itertools.count()
        self._database_faults = queue.Queue()
        self._database_busy = threading.Event()
        self._database_thread = threading.Thread(target=self._database_loop, daemon=True)
        self._last_database_fault = 0.0
        self._lock = threading.RLock()  # the queue, and choosing a process and hitting it
        self._searches: set[threading.Thread] = set()
        for fault in plan.faults:
            self._push(t0 + fault.at, self._inject, fault)

    def start(self):
        self._database_thread.start()

    def _push(self, at, action, *args):
        with self._lock:
            heapq.heappush(self._queue, (at, next(self._seq), action, args))

    def _record(self, fault, target, start, end=None, **detail) -> dict:
        """`target`: the process hit (its role is what explains a lost or repeated send
        later), or None for the database."""
        record = {
            "kind": fault.kind,
            "planned": fault.at,
            "target": target.worker_id if target else self.cluster.name,
            "role": target.role if target else None,
            "start": start,
            "end": start if end is None else end,
            "detail": detail.pop("text", ""),
            **detail,
        }
        self.records.append(record)
        self.say(
            f"[+{start - self.t0:5.1f}s] {fault.kind:<20} {record['target']} {record['detail']}"
        )
        return record

    def database_disturbed(self) -> bool:
        return (
            self._database_busy.is_set()
            or time.time() - self._last_database_fault < DISTURBED_AFTER
        )

    def tick(self):
        now = time.time()
        while True:
            with self._lock:
                if not self._queue or self._queue[0][0] > now:
                    return
                _, _, action, args = heapq.heappop(self._queue)
            action(*args)

    def end_window(self):
        """End of the fault window: no new faults. Stalls run their course (`pending`)."""
        with self._lock:
            self._queue = [entry for entry in self._queue if entry[2] != self._inject]
            heapq.heapify(self._queue)
        self._database_faults.put(None)

    def pending(self) -> bool:
        """A stall not yet resumed, a search not over, or a database fault in progress."""
        with self._lock:
            searching = any(thread.is_alive() for thread in self._searches)
            return bool(self._queue) or searching or self._database_thread.is_alive()

    def _in_thread(self, action, fault):
        """Faults that look for their moment (a run in flight, a transaction open) search in
        a thread of their own, so the main loop keeps restarting processes meanwhile."""

        def search():
            try:
                action(fault)
            finally:
                connection.close()

        thread = threading.Thread(target=search, daemon=True)
        with self._lock:
            self._searches = {t for t in self._searches if t.is_alive()} | {thread}
        thread.start()

    # --- faults ------------------------------------------------------------------------------

    def _inject(self, fault):
        if fault.kind in DATABASE_FAULTS:
            self._database_busy.set()
            self._database_faults.put(fault)
        elif fault.kind == KILL:
            self._kill(fault)
        elif fault.kind == STOP:
            self._in_thread(self._stop, fault)
        elif fault.kind == TERMINATE:
            self._in_thread(self._terminate, fault)
        elif fault.kind == RUNALL_CHILD_KILL:
            self._kill_runall_child(fault)
        elif fault.kind == PROXY_LATENCY:
            self._delay(fault)
        elif fault.kind == PROXY_BLACKHOLE:
            self._blackhole(fault)
        elif fault.kind == PROXY_RESET:
            self._reset(fault)

    def _candidates(self, role, pick):
        procs = [p for p in self.fleet.of_role(role) if p.running() and not p.finished]
        if not procs:  # the role's processes are all down or done: hit another one
            procs = [p for p in self.fleet.procs.values() if p.running() and not p.finished]
        return procs[pick % len(procs) :] + procs[: pick % len(procs)] if procs else []

    def _kill(self, fault):
        # A stalled process is killed only if nothing else is left: its stall has a wake-up
        # to prove.
        with self._lock:
            candidates = sorted(self._candidates(fault.role, fault.pick), key=lambda p: p.stopped)
            if not candidates:
                return
            proc = candidates[0]
            pid = proc.pid
            proc.kill("killed by the chaos run")
        self._record(fault, proc, time.time(), text=f"pid {pid}")

    def _leases_held(self) -> set[tuple]:
        try:
            held = Lease.objects.filter(until__gte=timezone.now())
            return set(held.values_list("inbox_id", "holder", "generation"))
        except DatabaseError:
            connection.close()
            return set()

    def _in_slow_run(self, candidates):
        """A candidate in the middle of a slow run (the same lease held a quarter second
        apart), and that run: a stall there is a stalled worker waking up with a run to
        finish. (None, None) if none shows up within STALL_SEARCH seconds."""
        by_id = {proc.worker_id: proc for proc in candidates}
        deadline = time.time() + STALL_SEARCH
        held = self._leases_held()
        while time.time() < deadline:
            time.sleep(0.25)
            now_held = self._leases_held()
            for inbox_id, holder, generation in sorted(held & now_held):
                if holder in by_id:
                    return by_id[holder], f"mid-run: inbox {inbox_id} gen {generation}"
            held = now_held
        return None, None

    def _stop(self, fault):
        candidates = [p for p in self._candidates(fault.role, fault.pick) if not p.stopped]
        if not candidates:
            return
        proc, run = None, None
        if fault.role == WORKER:
            proc, run = self._in_slow_run([p for p in candidates if p.role == WORKER])
        with self._lock:
            if proc is None or not proc.running() or proc.stopped:
                proc, run = (
                    next((p for p in candidates if p.running() and not p.stopped), None),
                    None,
                )
            if proc is None:
                return
            proc.stop()
        start = time.time()
        text = f"for {fault.duration:.1f}s" + (f", {run}" if run else "")
        record = self._record(fault, proc, start, start + fault.duration, text=text)
        self._push(start + fault.duration, self._resume, proc, proc.incarnation, record)

    def _resume(self, proc, incarnation, record):
        if proc.incarnation == incarnation and proc.stopped:
            proc.cont()
        record["end"] = time.time()

    # --- the network between a process and PostgreSQL: its own proxy ---------------------------

    def _proxy_target(self, fault):
        candidates = self._candidates(fault.role, fault.pick)
        if not candidates:
            return None, None
        proc = candidates[0]
        return proc, self.proxies[proc.name]

    def _delay(self, fault):
        proc, proxy = self._proxy_target(fault)
        if proc is None:
            return
        proxy.delay(fault.latency)
        start = time.time()
        text = f"+{fault.latency * 1000:.0f} ms a chunk, each way, for {fault.duration:.1f}s"
        record = self._record(
            fault, proc, start, start + fault.duration, text=text, latency=fault.latency
        )
        self._push(start + fault.duration, self._undelay, proxy, fault.latency, record)

    def _undelay(self, proxy, latency, record):
        if proxy.latency == latency:  # not since changed by a later latency fault
            proxy.delay(0)
        record["end"] = time.time()

    def _blackhole(self, fault):
        proc, proxy = self._proxy_target(fault)
        if proc is None:
            return
        proxy.blackhole()
        self._silenced[proc.name] += 1
        start = time.time()
        text = f"for {fault.duration:.1f}s, {proxy.open_connections} connections held open"
        record = self._record(fault, proc, start, start + fault.duration, text=text)
        self._push(start + fault.duration, self._heal, proc.name, record)

    def _heal(self, name, record):
        self._silenced[name] -= 1
        if not self._silenced[name]:  # the last overlapping blackhole of this proxy is over
            self.proxies[name].heal()
        record["end"] = time.time()

    def _reset(self, fault):
        proc, proxy = self._proxy_target(fault)
        if proc is None:
            return
        reset = proxy.reset()
        self._record(fault, proc, time.time(), text=f"{reset} connections reset (RST)", reset=reset)

    def _terminate(self, fault):
        procs = self._candidates(fault.role, fault.pick)
        names = {p.application_name: p for p in procs if p.role != RUNALL}
        if not names:
            return
        deadline = time.time() + TERMINATE_SEARCH
        try:
            with connection.cursor() as cursor:
                while True:
                    cursor.execute(
                        "SELECT pid, application_name, state, left(query, 70),"
                        " xact_start IS NOT NULL AND state <> 'idle'"
                        " FROM pg_stat_activity"
                        " WHERE application_name = ANY(%s) AND pid <> pg_backend_pid()"
                        " ORDER BY xact_start NULLS LAST",
                        [list(names)],
                    )
                    rows = cursor.fetchall()
                    inside = [row for row in rows if row[4]]
                    if inside:
                        chosen = inside[0]
                        break
                    if time.time() > deadline:
                        if not rows:
                            return
                        chosen = rows[0]  # nobody was inside a transaction: any backend
                        break
                    time.sleep(0.003)
                pid, app, state, query, mid = chosen
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        except DatabaseError:
            connection.close()
            return
        text = f"backend {pid} ({state}: {' '.join(query.split())[:60]})"
        self._record(fault, names[app], time.time(), mid_transaction=mid, text=text)

    def _kill_runall_child(self, fault, attempt=0):
        runall = self.fleet.procs["r1"]
        children = children_of(runall.pid) if runall.running() else []
        named = sorted(
            (name, pid) for pid in children for name in RUNALL_CHILDREN if name in cmdline(pid)
        )
        if len(named) < len(RUNALL_CHILDREN) or runall.stopped:
            if attempt < 90:  # runall is (re)starting (slowly on a busy host): try again shortly
                self._push(time.time() + 1, self._kill_runall_child, fault, attempt + 1)
            return
        name, pid = named[fault.pick % len(named)]
        runall.expecting_exit = f"its {name} child was killed"
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self._record(
            fault,
            runall,
            time.time(),
            text=f"{name} (pid {pid})",
            child=name,
            incarnation=runall.incarnation,
            answered=None,
        )

    # --- the database, in its own thread -----------------------------------------------------

    def _failover(self) -> str:
        """The standby falls behind (its replication link silenced for REPLICATION_LAG while
        the load goes on), then the primary dies (-m immediate: no shutdown checkpoint,
        sessions cut), the standby is promoted, and every proxy sends new connections to it,
        as a virtual IP or a connection router would. A synchronous primary acknowledges no
        commit in the lag; an asynchronous one acknowledges commits the standby never gets."""
        start = time.time()
        old, new = self.cluster, self.standby
        self.replication.blackhole()
        time.sleep(REPLICATION_LAG)
        old.stop("immediate")
        stopped = time.time()
        new.promote()
        self.proxies.retarget(new.port)
        self.cluster, self.standby = new, None
        return (
            f"replication silenced {stopped - start:.1f}s, then {old.name} stopped -m immediate;"
            f" {new.name} promoted and the proxies repointed {time.time() - stopped:.1f}s later"
        )

    def _database_loop(self):
        while True:
            fault = self._database_faults.get()
            if fault is None:
                return
            self._database_busy.set()
            start = time.time()
            try:
                if fault.kind == FAILOVER:
                    text = self._failover()
                elif fault.kind == PG_OUTAGE:
                    self.cluster.stop(fault.mode)
                    time.sleep(max(0.0, fault.duration - (time.time() - start)))
                    self.cluster.start()
                    text = f"stopped -m {fault.mode}, down {time.time() - start:.1f}s"
                else:
                    mode = {PG_RESTART_FAST: "fast", PG_RESTART_IMMEDIATE: "immediate"}[fault.kind]
                    self.cluster.restart(mode)
                    text = f"restart -m {mode} took {time.time() - start:.1f}s"
                self._record(fault, None, start, time.time(), text=text)
            finally:
                self._last_database_fault = time.time()
                if self._database_faults.empty():
                    self._database_busy.clear()
