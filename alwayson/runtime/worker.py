"""The worker: take an inbox with work, claim, run the agent, finish, release.

`Worker.step()` is one unit of work and says whether there was any; tests call it directly.
`WorkerPool` is the loop around it that `runworker` starts: N slots (threads), a heartbeat
that renews the leases of running runs, a LISTEN connection on PostgreSQL that wakes idle
slots, and the signal handling.
"""

import logging
import threading
import time
import traceback
from dataclasses import dataclass, replace

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
)

from alwayson.ops import metrics
from alwayson.ops.database import DatabaseUnusable
from alwayson.ops.health import ProcessBeat
from alwayson.ops.logs import bind_run, run_context
from alwayson.ops.models import Process
from alwayson.runtime.agents import Agents
from alwayson.runtime.loop import OUTAGE, OutageBackoff, default_worker_id
from alwayson.runtime.run import LeaseLost, Run, lease_clock
from inbox.models import RunRecord
from inbox.services import (
    DONE,
    WORK_CHANNEL,
    Claim,
    Defer,
    Failed,
    event_traces,
    finish,
    finish_and_take,
    lease_ttl,
    record_refused,
    release,
    renew,
    take_next,
)
from inbox.tracing import enabled, span, traceparent

log = logging.getLogger("alwayson.worker")

REFUSED = RunRecord.Outcome.REFUSED


def agent_name(agent) -> str:
    """The name an agent goes by in traces: its `name` attribute, else its dotted path."""
    name = getattr(agent, "name", None)
    if isinstance(name, str) and name:
        return name
    target = agent if hasattr(agent, "__qualname__") else type(agent)
    return f"{target.__module__}.{target.__qualname__}"


def _raising(exc: Exception):
    def agent(run):
        raise exc

    return agent


class _Renewal:
    """A run's own renew(), waiting for the heartbeat's thread to send it."""

    def __init__(self, run: Run):
        self.run = run
        self.done = threading.Event()
        self.renewed: bool | None = None
        self.error: BaseException | None = None


class Heartbeat:
    """Renews the lease of every run in progress on a thread and a connection of its own
    (a run's own `renew()` too). Four beats per TTL, so one slow or missed beat never costs a
    healthy run its lease. A second thread, which never touches the database, loses each run
    at its deadline, so a beat stuck on a silent database cannot hold that up.
    """

    def __init__(self):
        self.interval = lease_ttl().total_seconds() / 4
        self._runs: set[Run] = set()
        self._lock = threading.Lock()
        # The heartbeat's thread waits on it for renewals asked; the deadlines' for new runs.
        self._asked_for = threading.Condition(self._lock)
        self._tracked = threading.Condition(self._lock)
        self._asked: list[_Renewal] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._watch = threading.Thread(
            target=self._watch_deadlines, name="lease-deadlines", daemon=True
        )

    def start(self):
        self._thread.start()
        self._watch.start()

    def stop(self):
        """After the last run has finished: a stopping pool still beats for runs in flight."""
        self._stop.set()
        with self._lock:
            self._asked_for.notify_all()
            self._tracked.notify_all()
        self._thread.join(timeout=5)
        self._watch.join(timeout=5)

    def track(self, run: Run):
        with self._lock:
            self._runs.add(run)
            self._tracked.notify()

    def untrack(self, run: Run):
        with self._lock:
            self._runs.discard(run)

    def _tracks(self, run) -> bool:
        # A run that finished (and gave its lease back) since this beat listed it was not lost.
        with self._lock:
            return run in self._runs

    def renew_now(self, run: Run, timeout: float) -> bool | None:
        """Renew `run`'s lease now, on the heartbeat's thread (the caller's before it
        starts): True, False when the lease is no longer the run's, None for no answer
        within `timeout` seconds."""
        if not self._thread.is_alive():
            return renew(run.inbox.pk, run.holder, run.generation)
        asked = _Renewal(run)
        with self._lock:
            self._asked.append(asked)
            self._asked_for.notify()
        if not asked.done.wait(max(timeout, 0)):
            return None
        if asked.error is not None:
            raise asked.error
        return asked.renewed

    def beat(self):
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            if run.lost:
                continue
            sent = run.clock()
            try:
                renewed = renew(run.inbox.pk, run.holder, run.generation)
            except DatabaseError:
                log.warning("heartbeat could not reach the database", exc_info=True)
                continue
            if renewed:
                run.renewed(sent)
            elif self._tracks(run):
                run.mark_lost()

    def _answer(self, asked: _Renewal):
        try:
            asked.renewed = renew(asked.run.inbox.pk, asked.run.holder, asked.run.generation)
        except Exception as exc:
            asked.error = exc
        finally:
            asked.done.set()

    def _loop(self):
        try:
            due = time.monotonic() + self.interval
            while not self._stop.is_set():
                with self._lock:
                    self._asked_for.wait_for(
                        lambda: self._asked or self._stop.is_set(),
                        max(due - time.monotonic(), 0),
                    )
                    asked, self._asked = self._asked, []
                if self._stop.is_set():
                    return
                close_old_connections()
                for renewal in asked:
                    self._answer(renewal)
                if time.monotonic() >= due:
                    self.beat()
                    due = time.monotonic() + self.interval
        finally:
            connection.close()

    def _watch_deadlines(self):
        """Lose each run whose deadline passed (Run.lost does, as it is read), waking at the
        soonest deadline; never a database call, so nothing can hold it up."""
        while not self._stop.is_set():
            with self._lock:
                runs = list(self._runs)
            soonest = self.interval
            for run in runs:
                if not run.lost:
                    soonest = min(soonest, run.deadline - run.clock())
            with self._lock:
                if not self._stop.is_set():
                    self._tracked.wait(max(soonest, 0.001))


@dataclass(frozen=True)
class StepResult:
    """One worker step: how its run ended (`recorded`, RunRecord.Outcome, the one word of
    the records, pages, log, span and metrics; None when the claim found nothing) and what
    more there is to say (`detail`). `fenced`: the run lost its lease mid-run and sent no
    finish; its record says refused, the metrics count it as lost."""

    inbox: str
    generation: int
    events: int
    recorded: RunRecord.Outcome | None
    detail: str
    seconds: float
    fenced: bool = False

    def __post_init__(self):
        if self.fenced and self.recorded != RunRecord.Outcome.REFUSED:
            raise ValueError(f"a fenced run is recorded as refused, not {self.recorded}")
        if (self.recorded is None) != (self.events == 0):
            raise ValueError("a step whose claim found no events is no run, and only that")

    @property
    def ran(self) -> bool:
        """Whether the agent ran: a lease taken whose claim found nothing is not a run."""
        return self.events > 0

    @property
    def outcome(self) -> str:
        """The run in short, as tests read it: "said 1", "asked 1, said 1", "quiet" (said
        nothing), "deferred: <reason>", "error: <last line>", "refused" (the fence refused
        the finish), "fenced" (lost mid-run), "nothing claimable". Shown, never parsed."""
        words = RunRecord.Outcome
        if self.fenced:
            return "fenced"
        if self.recorded is None:
            return "nothing claimable"
        if self.recorded == words.DONE:
            return "quiet" if self.detail == SAID_NOTHING else self.detail
        if self.recorded == words.REFUSED:
            return "refused"
        return f"{self.recorded}: {self.detail}"


SAID_NOTHING = "said nothing"


class Worker:
    def __init__(
        self, worker_id: str | None = None, agent=None, heartbeat: Heartbeat | None = None
    ):
        self.worker_id = worker_id or default_worker_id()
        # `agent` runs every inbox without an agent of its own (default: ALWAYSON_AGENT).
        self.agents = Agents(agent)
        self.heartbeat = heartbeat
        # Whether a run that ended well takes the next inbox in its finish's transaction
        # (finish_and_take): one commit per run instead of two. Off for a bare Worker, whose
        # step() is one run and nothing more; WorkerPool turns it on while it is not stopping.
        self.may_chain = lambda: False
        # The claim a slot's last finish took, run by its next step (one per slot thread).
        self._carried = threading.local()
        # The clock its runs keep their leases' deadlines on (Run.clock); a test moves its own.
        self.clock = lease_clock

    def carrying(self) -> bool:
        """Whether this thread's last finish took a claim that no step has run yet."""
        return getattr(self._carried, "claim", None) is not None

    def step(self) -> StepResult | None:
        """One run of one inbox, or None when no inbox has claimable work and a free lease."""
        # Every line logged from the claim to the release carries the run's id, the dead
        # events the claim parks included (alwayson/ops/logs.py).
        with run_context():
            started = time.monotonic()
            carried, self._carried.claim = getattr(self._carried, "claim", None), None
            if carried is None:
                # Before the statement is sent: the lease the database stamps runs from later.
                taken_at = self.clock()
                claim = take_next(self.worker_id)
            else:
                claim, taken_at = carried
            if claim is None:
                return None
            bind_run(claim.inbox.pk, claim.generation)
            if not claim.events:
                # take_next gave the lease back already.
                return self._result(claim, None, "nothing claimable", started)
            released = False
            try:
                result, released = self._run(claim, started, taken_at)
                return result
            finally:
                if not released:
                    # Free the inbox at once rather than at TTL: more work may be waiting in it.
                    release(claim.inbox.pk, self.worker_id, claim.generation)

    def _run(self, claim: Claim, started, taken_at) -> tuple[StepResult, bool]:
        """The run and its finish, under one invoke_agent span (OpenTelemetry's GenAI
        conventions); the result, and whether the finish gave the lease back."""
        try:
            agent, version = self.agents.with_version(claim.inbox, claim.extras)
            name = agent_name(agent)
        except Exception as exc:
            # An agent that cannot be loaded fails the run like one that raises: the error
            # is recorded on the events by the finish below, not lost in the step.
            agent, name, version = _raising(exc), "unloaded", None
        parent, links = _causes(claim)
        with span(
            f"invoke_agent {name}",
            parent=parent,
            links=links,
            gen_ai__operation__name="invoke_agent",
            gen_ai__agent__name=name,
            alwayson__inbox=claim.inbox.slug,
            alwayson__generation=claim.generation,
            alwayson__events=len(claim.events),
        ) as current:
            result, finished = self._run_agent(agent, claim, started, taken_at, version)
            if current is not None:
                current.set_attribute("alwayson.outcome", str(result.recorded))
                current.set_attribute("alwayson.outcome.detail", result.detail)
            return result, finished

    def _run_agent(
        self, agent, claim: Claim, started, taken_at, version=None
    ) -> tuple[StepResult, bool]:
        held = claim.held_by(self.worker_id)
        renewer = self.heartbeat.renew_now if self.heartbeat else None
        run = Run(
            claim.inbox,
            held.holder,
            held.generation,
            claim.events,
            claim.state,
            taken_at=taken_at,
            renewer=renewer,
            clock=self.clock,
        )
        run.version = version
        where = f"inbox={claim.inbox.slug} gen={held.generation}"
        ending = None
        if self.heartbeat:
            self.heartbeat.track(run)
        try:
            agent(run)
        except LeaseLost as exc:
            run.lose(f"the agent raised LeaseLost: {exc}")  # no-op when the run raised it
        except Exception as exc:
            ending = Failed(_describe(exc))
            log.warning("agent failed: %s\n%s", where, ending.error)
        finally:
            if self.heartbeat:
                self.heartbeat.untrack(run)
        if run.joined:
            # What the run joined (run.more()) ends with it, by the same finish.
            held = replace(held, event_ids=(*held.event_ids, *(e.pk for e in run.joined)))
        ran = len(held.event_ids)
        if run.lost:
            # Lost before the agent ended (LeaseLost, or a deadline it did not notice): no
            # finish, which another worker's run may have made wrong, and no round trip for
            # one the fence would refuse. The events go back to pending at the next claim.
            record_refused(held, f"fenced off mid-run: {run.lost_because}")
            return self._result(
                claim, REFUSED, "fenced off mid-run", started, fenced=True, events=ran
            ), False
        ending = ending or run.deferred or DONE
        try:
            if ending is DONE and self.may_chain():
                # Before the statement is sent, as for a take of its own (step).
                taken_at = self.clock()
                finished, carried = finish_and_take(
                    held, run.effects(), produced=run.produced(), trace=traceparent()
                )
                self._carried.claim = None if carried is None else (carried, taken_at)
            else:
                finished = finish(
                    held,
                    run.effects(),
                    ending,
                    release=True,
                    produced=run.produced(),
                    trace=traceparent(),
                )
        except (OperationalError, InterfaceError):
            # The database, not the run, failed (or the outcome is unknown: Unreplicated):
            # the events stay claimed until the lease lapses and the next claim retries them.
            raise
        except Exception as exc:
            # What the run produced could not be committed (a bad effect): record why on the
            # events instead, so the failure counts toward their attempts and shows in admin.
            ending = Failed(f"finish failed: {_describe(exc)}")
            log.warning("finish failed: %s\n%s", where, ending.error)
            finished = finish(held, (), ending, release=True)
        if not finished:
            error = ending.error if isinstance(ending, Failed) else ""
            record_refused(held, error, run.produced())
            result = self._result(
                claim, REFUSED, "the fence refused the finish", started, events=ran
            )
        elif isinstance(ending, Failed):
            result = self._result(
                claim, ending.outcome, ending.error.splitlines()[-1], started, events=ran
            )
        elif isinstance(ending, Defer):
            result = self._result(
                claim, ending.outcome, ending.reason.splitlines()[0], started, events=ran
            )
        else:
            result = self._result(
                claim, ending.outcome, run.summary or SAID_NOTHING, started, events=ran
            )
        return result, finished

    def _result(self, claim, recorded, detail, started, fenced=False, events=None):
        result = StepResult(
            claim.inbox.slug,
            claim.generation,
            len(claim.events) if events is None else events,
            recorded,
            detail,
            time.monotonic() - started,
            fenced,
        )
        metrics.record_run(result)
        # The outcome in the pages' words (a run page's "Done" is outcome=done), then what
        # the run did.
        log.info(
            "run inbox=%s gen=%s events=%s outcome=%s (%s) duration=%.3fs",
            result.inbox,
            result.generation,
            result.events,
            result.recorded or "none",
            result.detail,
            result.seconds,
        )
        return result


def _causes(claim: Claim) -> tuple[str, list[str]]:
    """The run span's parent and links, as a batch consumer in OpenTelemetry's messaging
    conventions: the oldest event's trace continued, the others linked. Off, no query."""
    if not enabled():
        return "", []
    traces = event_traces(event.pk for event in claim.events)
    ordered = [traces[event.pk] for event in claim.events if event.pk in traces]
    if not ordered:
        return "", []
    parent = ordered[0]
    return parent, list(dict.fromkeys(tp for tp in ordered[1:] if tp != parent))


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc, limit=-3)).strip()


class WorkerPool:
    """`runworker`'s loop: slots that drain, then sleep until woken or the interval passes."""

    def __init__(
        self, worker_id=None, agent=None, concurrency=1, interval=1.0, once=False, max_runs=None
    ):
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        if max_runs is not None and max_runs < 1:
            raise ValueError(f"max_runs must be at least 1, not {max_runs}")
        self.stop = threading.Event()
        self.heartbeat = Heartbeat()
        self.worker = Worker(worker_id, agent, self.heartbeat)
        self.worker.may_chain = self._may_chain
        # This process's own heartbeat (alwayson/ops/health.py), apart from the leases' above.
        self.process = ProcessBeat(Process.Kind.WORKER, self.worker_id)
        self.concurrency = concurrency
        self.interval = interval
        self.once = once
        self.max_runs = max_runs
        self.runs = 0
        self._runs_lock = threading.Lock()
        self._wake = threading.Condition()
        self._pending = 0
        # What stopped the slots, when the database turned out to be one they cannot use.
        self.unusable: DatabaseUnusable | None = None

    @property
    def worker_id(self):
        return self.worker.worker_id

    def wake(self):
        """Work may have arrived: one idle slot looks. Counted, so a wake-up that lands while
        every slot is between its poll and its wait is not lost."""
        with self._wake:
            self._pending = min(self._pending + 1, self.concurrency)
            self._wake.notify()

    def request_stop(self):
        self.stop.set()
        with self._wake:
            self._wake.notify_all()

    def _idle(self):
        """Sleep until woken, stopped, or the interval passes (the polling fallback)."""
        with self._wake:
            self._wake.wait_for(lambda: self._pending or self.stop.is_set(), self.interval)
            if self._pending:
                self._pending -= 1

    def _may_chain(self) -> bool:
        # Not once stopping, nor past --max-runs: a claim taken then would be one more run.
        if self.stop.is_set():
            return False
        with self._runs_lock:
            return self.max_runs is None or self.runs + 1 < self.max_runs

    def _count_run(self) -> bool:
        """Count a run that ran; True when --max-runs is reached."""
        self.process.count_run()
        with self._runs_lock:
            self.runs += 1
            return self.max_runs is not None and self.runs >= self.max_runs

    def slot(self):
        backoff = OutageBackoff()
        woke = True
        try:
            # A claim the last finish took is a run in flight: it runs even after a stop.
            while not self.stop.is_set() or self.worker.carrying():
                if woke:
                    # On each wake, not between the runs of a drain: with health checks on,
                    # the check is a round trip of its own, and a failed run's connection
                    # is closed by the except below anyway.
                    close_old_connections()
                    woke = False
                try:
                    result = backoff.attempt(self.worker.step, self.stop, log)
                except DatabaseUnusable as exc:
                    # Every slot would meet it: stop them all, and run() raises it.
                    self.unusable = exc
                    self.request_stop()
                    return
                if result is OUTAGE:
                    woke = True
                    continue
                if result is not None:
                    if result.ran and self._count_run():
                        self.request_stop()
                    continue
                if self.once:
                    return
                self._idle()
                woke = True
        finally:
            connection.close()

    def listen(self):
        """Wake idle slots on NOTIFY (PostgreSQL). Polling stays the fallback: a missed
        notification costs at most one interval."""
        # PostgreSQL's alone: imported here, so that a process on SQLite never loads psycopg.
        import psycopg

        from inbox.backends.postgresql import session_params

        conninfo = session_params()
        backoff = OutageBackoff()
        while not self.stop.is_set():
            try:
                with psycopg.connect(autocommit=True, **conninfo) as conn:
                    conn.execute(f"LISTEN {WORK_CHANNEL}")
                    backoff.reset()
                    self.wake()  # anything that arrived while we were not listening
                    while not self.stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.wake()
            except psycopg.Error:
                delay = backoff.next()
                log.warning("LISTEN connection lost; retrying in %.1fs", delay, exc_info=True)
                self.stop.wait(delay)

    def run(self):
        """Run the slots until they drain (--once), --max-runs is reached, or a stop; the
        runs run. DatabaseUnusable when a slot found a database it cannot use."""
        self.process.start()
        self.heartbeat.start()
        threads = [
            threading.Thread(target=self.slot, name=f"slot-{n}") for n in range(self.concurrency)
        ]
        if connection.vendor == "postgresql" and not self.once:
            threading.Thread(target=self.listen, name="listen", daemon=True).start()
        connection.close()  # each thread opens its own
        for thread in threads:
            thread.start()
        # Join in short ticks: the main thread must stay free to take signals.
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(timeout=0.2)
        self.stop.set()
        self.heartbeat.stop()
        # A database without the tables has no Process row to mark stopped.
        self.process.stop(clean=self.unusable is None)
        if self.unusable is not None:
            raise self.unusable
        return self.runs
