"""The chaos run, start to end: cluster, set-up, load and faults, drain, check, clean-up."""

import contextlib
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from django.db import DatabaseError, connection

from tests.chaos import state
from tests.chaos.check import Observed, Report, check
from tests.chaos.clients import Log, read_log
from tests.chaos.cluster import Cluster, free_port
from tests.chaos.faults import Injector
from tests.chaos.fleet import Fleet
from tests.chaos.network import (
    STANDARD_SECRET,
    Receipts,
    SmtpReceiver,
    WebhookReceiver,
    WebhookSender,
)
from tests.chaos.plan import ANSWERER, DISPATCHER, INGESTER, RUNALL, SCHEDULER, WORKER, Plan
from tests.chaos.proxies import RUN, Proxies
from tests.support.tcp_proxy import TcpProxy

READY_TIMEOUT = 120  # seconds for every process to connect (CI machines are slow to start)
QUIET = 1.5  # seconds settled, and without a new delivery, before the run counts as drained
RUNALL_ANSWER = 25  # seconds runall has to stop after one of its children was killed
HTTP_SENDERS = ("h1", "h2")


class Interrupted(Exception):
    pass


def _interrupt(signum, frame):
    raise Interrupted(f"signal {signum}")


class ChaosRun:
    def __init__(
        self,
        plan: Plan,
        workdir: Path,
        say=print,
        drain_timeout: float = 180,
        synchronous: bool = True,
    ):
        self.plan = plan
        self.workdir = workdir
        self.started = time.time()
        self.say = lambda text: say(f"{time.time() - self.started:6.1f}s {text}")
        self.drain_timeout = drain_timeout
        self.cluster = None
        self.standby = None
        self.synchronous = synchronous  # the failover's standby; asynchronous must lose events
        self.replication = None  # the standby's link to the primary, silenced to make it lag
        self.proxies = None
        self.fleet = None
        self.receivers = []
        self.senders = []
        self.stop_senders = None

    def execute(self) -> Report:
        """The whole run; the cluster is dropped and every process killed on the way out,
        whatever happens (SIGTERM and Ctrl-C included)."""
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            self.cluster = Cluster.create()
            if self.plan.failover:
                self.replication = TcpProxy("127.0.0.1", self.cluster.port).start()
                self.standby = self.cluster.add_standby(self.replication.port, self.synchronous)
            self.proxies = Proxies(self.cluster.port, self.plan.process_names)
            self.proxies.start()
            return self._run()
        finally:
            self._clean_up()
            signal.signal(signal.SIGTERM, previous)

    def _run(self) -> Report:
        plan, cluster, proxies = self.plan, self.cluster, self.proxies
        standby = ""
        if self.standby:
            kind = "synchronous" if self.synchronous else "ASYNCHRONOUS"
            standby = f", {kind} standby {self.standby.name}"
        self.say(
            f"chaos: seed {plan.seed}, {plan.seconds:g} s of faults, {self._database_faults()};"
            f" cluster {cluster.name} (PostgreSQL {cluster.version}) on port {cluster.port}"
            f"{standby}, every process through a proxy of its own; work dir {self.workdir}"
        )
        cluster.create_database("chaos")
        state.use_database(proxies.url(RUN, cluster.url("chaos")))
        plan_path = self.workdir / "plan.json"
        plan_path.write_text(plan.to_json())

        receipts = Receipts(self.workdir / "receipts.jsonl")
        webhook, smtp = WebhookReceiver(receipts), SmtpReceiver(receipts)
        self.receivers = [webhook, smtp]
        for receiver in self.receivers:
            receiver.start()
        first_due = state.setup(plan, webhook.url)
        connection.close()

        runall_addr = f"127.0.0.1:{free_port()}"
        t0_holder = []
        self.fleet = fleet = Fleet(
            plan,
            self._env(smtp.port, runall_addr),
            self.workdir,
            runall_addr,
            plan_path,
            t0_of=lambda: t0_holder[0],
            url_of=lambda name: proxies.url(name, cluster.url("chaos")),
        )
        fleet.start({WORKER, SCHEDULER, DISPATCHER, RUNALL})
        self._wait_ready(fleet, runall_addr)
        t0 = time.time() + 0.5
        t0_holder.append(t0)
        fleet.start({INGESTER, ANSWERER})
        self._start_senders(runall_addr, t0)
        self.say(f"chaos: load and faults for {plan.seconds:g} s")

        injector = Injector(
            plan, fleet, cluster, t0, self.say, proxies, self.standby, self.replication
        )
        injector.start()
        self._supervise(fleet, injector, lambda: time.time() < t0 + plan.seconds)
        injector.end_window()
        self._supervise(fleet, injector, injector.pending)  # stalls run their course
        drain = self._drain(fleet, injector, receipts)
        self.say(f"chaos: drained in {drain['seconds']:.1f} s; stopping the processes")
        codes = fleet.shut_down()
        self.stop_senders.set()
        acks = [a for name in (*self._client_names(INGESTER), *HTTP_SENDERS)
                for a in read_log(self.workdir / f"{name}.jsonl")]  # fmt: skip
        answers = read_log(self.workdir / "a1.jsonl")
        db = state.with_retry(lambda: state.collect(first_due), 60, "collect")
        faults = self._answered(injector.records, fleet)
        observed = Observed(
            plan=plan,
            db=db,
            acks=acks,
            answers=answers,
            receipts=receipts.snapshot(),
            faults=faults,
            exits=[vars(x) for x in fleet.exits],
            orphans=[f"{name}: pid {pid} {cmd}" for name, pid, cmd in fleet.orphans],
            logs=self._read_logs(),
            drain=drain,
            shutdown=codes,
        )
        observed.save(self.workdir / "observed.json")
        report = check(observed)
        report.title = (
            f"Chaos run: seed {plan.seed}, {plan.seconds:g} s of faults"
            f" ({self._database_faults()}, network faults through per-process proxies),"
            f" {len(plan.inboxes)} inboxes,"
            f" {plan.workers} runworker x {plan.concurrency} + runall, drained in"
            f" {drain['seconds']:.1f} s"
        )
        (self.workdir / "report.txt").write_text(report.render() + "\n")
        return report

    # --- pieces ------------------------------------------------------------------------------

    def _database_faults(self) -> str:
        if self.plan.failover:
            kind = "a synchronous" if self.synchronous else "an ASYNCHRONOUS"
            return f"a failover to {kind} standby"
        return f"restarts and a {self.plan.outage:g} s outage"

    def _env(self, smtp_port, runall_addr) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ALWAYSON_")}
        env.update(
            # Each process's own proxy goes in at its start (Proc.env_for).
            DJANGO_SETTINGS_MODULE="alwayson.settings",
            DEBUG="true",
            PYTHONUNBUFFERED="1",
            ALWAYSON_AGENT="tests.chaos.agent.agent",
            ALWAYSON_LEASE_TTL=str(self.plan.ttl),
            ALWAYSON_MAX_ATTEMPTS=str(self.plan.max_attempts),
            ALWAYSON_RETRY_BASE="1",
            ALWAYSON_RETRY_CAP="4",
            ALWAYSON_OUTBOX_GAP="2",
            ALWAYSON_OUTBOX_MAX_ATTEMPTS="5",
            ALWAYSON_OUTBOX_WEBHOOK_TIMEOUT="3",
            # Shorter than a stall, so a process frozen mid-transaction loses its session.
            ALWAYSON_IDLE_IN_TRANSACTION_TIMEOUT="5",
            ALWAYSON_INGEST_LOCK_WAIT="2",
            # Liveness (issue 38): a connection to a blackholed proxy fails to open in 3 s,
            # and a silent one is given up in seconds; the lease's own deadline (the TTL)
            # covers a worker whose statements wait on a proxy that holds them.
            ALWAYSON_DB_CONNECT_TIMEOUT="3",
            ALWAYSON_DB_KEEPALIVES_IDLE="2",
            ALWAYSON_DB_KEEPALIVES_INTERVAL="1",
            ALWAYSON_DB_KEEPALIVES_COUNT="3",
            ALWAYSON_DB_TCP_USER_TIMEOUT="5",
            ALWAYSON_STANDARD_SECRETS=STANDARD_SECRET,
            ALWAYSON_SITE_URL=f"http://{runall_addr}",
            EMAIL_URL=f"smtp://127.0.0.1:{smtp_port}",
            EMAIL_TIMEOUT="3",
        )
        return env

    def _supervise(self, fleet, injector, until):
        """The main loop, while `until()`: restart what died, carry out what is due."""
        while until():
            fleet.watch(injector.database_disturbed())
            injector.tick()
            time.sleep(0.02)

    def _client_names(self, role):
        return [proc.name for proc in self.fleet.of_role(role)]

    def _wait_ready(self, fleet, runall_addr):
        """Every loop process connected (seen in pg_stat_activity), runall's web answering."""
        names = [
            p.application_name
            for p in fleet.procs.values()
            if p.role in (WORKER, SCHEDULER, DISPATCHER)
        ]
        deadline = time.time() + READY_TIMEOUT
        while True:
            fleet.watch(False)
            try:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(DISTINCT application_name) FROM pg_stat_activity"
                        " WHERE application_name = ANY(%s)",
                        [names],
                    )
                    connected = cursor.fetchone()[0]
            except DatabaseError:
                connection.close()
                connected = 0
            if connected == len(names) and _answers(f"http://{runall_addr}/"):
                return
            if time.time() > deadline:
                raise RuntimeError(
                    f"the processes did not all start within {READY_TIMEOUT}s"
                    f" ({connected}/{len(names)} connected); logs in {fleet.logdir}"
                )
            time.sleep(0.2)

    def _start_senders(self, runall_addr, t0):
        self.stop_senders = threading.Event()
        for name in HTTP_SENDERS:
            sender = WebhookSender(
                name,
                self.plan,
                f"http://{runall_addr}",
                Log(self.workdir / f"{name}.jsonl"),
                t0,
                self.stop_senders,
            )
            sender.start()
            self.senders.append(sender)

    def _drain(self, fleet, injector, receipts) -> dict:
        """Faults over: everything restarts and catches up. Drained when every planned
        delivery is acknowledged, nothing is pending, running, held, due or open, no lease
        is held, and the receivers have had nothing new for a moment."""
        started = time.time()
        deadline = started + self.drain_timeout
        fleet.restart_now()
        self.say("chaos: faults over; draining")
        ingesters = fleet.of_role(INGESTER)
        while time.time() < deadline and not (
            all(p.finished for p in ingesters) and all(s.done() for s in self.senders)
        ):
            fleet.watch(injector.database_disturbed())
            time.sleep(0.1)
        state.with_retry(state.stop_recurring_timers, max(1, deadline - time.time()), "timers")
        status, settled_since = None, None
        while time.time() < deadline:
            fleet.watch(injector.database_disturbed())
            try:
                status = state.drain_status()
            except DatabaseError:
                connection.close()
                status = {"database": "unreachable"}
            if any(status.values()):
                settled_since = None
            elif settled_since is None:
                settled_since = time.time()
            # Settled for QUIET seconds, with no delivery in flight to a receiver meanwhile.
            if settled_since and time.time() - max(settled_since, receipts.last_at()) > QUIET:
                return {"drained": True, "seconds": time.time() - started, "left": {}}
            time.sleep(0.2)
        left = {k: v for k, v in (status or {}).items() if v}
        left["ingesters not done"] = [p.name for p in ingesters if not p.finished]
        left["senders not done"] = [s.name for s in self.senders if not s.done()]
        return {"drained": False, "seconds": time.time() - started, "left": left}

    def _answered(self, records, fleet) -> list[dict]:
        """Did runall stop, and fail, after each kill of one of its children?"""
        for record in records:
            if record["kind"] != "runall-child-kill":
                continue
            ended = [
                x for x in fleet.exits if x.name == "r1" and x.incarnation == record["incarnation"]
            ]
            record["answered"] = bool(
                ended and ended[0].code != 0 and ended[0].at - record["start"] < RUNALL_ANSWER
            )
            if ended:
                record["detail"] += f"; runall exited {ended[0].code} after"
                record["detail"] += f" {ended[0].at - record['start']:.1f}s"
        return records

    def _read_logs(self) -> dict:
        """Counts from the workers' logs (runall's output includes its worker's)."""
        counts = Counter()
        slot_deaths = []
        for path in sorted((self.workdir / "logs").glob("*.log")):
            if path.name[0] not in "wr":
                continue
            text = path.read_text(errors="replace")
            counts["refused"] += text.count("outcome=refused (the fence refused the finish)")
            counts["fenced"] += text.count("outcome=refused (fenced off mid-run)")
            counts["failed"] += text.count("outcome=error")
            # No renewal by the deadline (a stall, a blackhole): the worker knew on its own.
            counts["deadline"] += text.count("no renewal succeeded by the lease's deadline")
            for line in text.splitlines():
                if re.search(r"Exception in thread (slot|heartbeat|listen)", line):
                    slot_deaths.append(f"{path.name}: {line.strip()}")
        refusals = Counter()
        for sender in self.senders:
            refusals.update(sender.refusals)
        return {**counts, "slot_deaths": slot_deaths, "webhook_retries": dict(refusals)}

    def _clean_up(self):
        if self.stop_senders is not None:
            self.stop_senders.set()
        if self.fleet is not None:
            self.fleet.force_kill()
        for receiver in self.receivers:
            with contextlib.suppress(Exception):  # best effort on the way out
                receiver.stop()
        connection.close()
        if self.proxies is not None:
            self.proxies.stop()
        if self.replication is not None:
            self.replication.stop()
        for cluster in (self.cluster, self.standby):
            if cluster is not None:
                cluster.drop()
                self.say(f"chaos: cluster {cluster.name} dropped")


def _answers(url) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
