"""The interface an agent is written against: one Run per claimed batch of one inbox.

An agent is a callable `agent(run)`, named by the ALWAYSON_AGENT setting. It reads
`run.events` and `run.state`, and acts through the verbs below. Nothing a verb records is
written until the run's fenced finish commits it; a run that raises, or loses its lease,
leaves no trace but the attempt it was counted at claim.

The three ways a run ends (the article's): a message goes out (`say`), nothing goes out,
or a deferred tool call asks the user (`ask`). A fourth gives the batch back untouched
(`defer`): the run could not do its work yet, through no fault of its events. Under the
inbox's `join` choice, a run takes the chat messages sent since its claim with `more`: they
end with it, as its batch does.

A run keeps its lease's deadline itself, on a clock no database call can block, and is lost
the moment it passes with no renewal (docs/explanation/design.md, "A run keeps its lease's
deadline itself").
"""

import copy
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime

from alwayson.egress.client import http_for
from approvals.services import Ask
from inbox.models import Event, Inbox
from inbox.services import Defer, SaveState, claim_more, lease_ttl, renew
from outbox.services import Say
from timers.services import Schedule

from .models import AgentConfig, MidRun

log = logging.getLogger("alwayson.worker")

# The source a join takes: the owner's chat messages (alwayson/web/chat.py stores them so).
# Webhooks, timers and approval answers never join a run in progress.
JOINED_SOURCES = ("chat",)


@dataclass(frozen=True)
class KeepState:
    """The state a run saves, kept (SavedState) in its finish beside the Session row, so a
    replay of the next run starts from it."""

    inbox_id: int
    generation: int
    state: dict

    def __call__(self, now):
        # At call time: a module an agent imports (alwayson.runtime.api) imports this one
        # before the apps, and their models, are ready.
        from .models import SavedState

        SavedState.objects.create(
            inbox_id=self.inbox_id, generation=self.generation, state=self.state, created=now
        )


class LeaseLost(Exception):
    """The run was fenced off: its lease lapsed and another worker may own the inbox now.
    Stop before doing more; the finish of this run would be refused anyway."""


if hasattr(time, "CLOCK_BOOTTIME"):

    def lease_clock() -> float:
        """Seconds on the clock a run keeps its lease's deadline on: monotonic, so no change
        of the wall clock moves it, and CLOCK_BOOTTIME (Linux), which goes on counting while
        the host is suspended, as the database's clock does; time.monotonic stops."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)

else:  # pragma: no cover - not Linux
    lease_clock = time.monotonic


class Run:
    def __init__(
        self,
        inbox: Inbox,
        holder: str,
        generation: int,
        events: list[Event],
        state,
        *,
        taken_at: float | None = None,
        renewer=None,
        clock=lease_clock,
    ):
        """`taken_at`: when the take was sent, on `clock`; the deadline is the TTL from then.
        `renewer(run, timeout)`: how renew() renews (the worker's heartbeat): True, False when
        the lease is no longer this run's, None for no answer within `timeout`."""
        self.inbox = inbox
        self.holder = holder
        self.generation = generation
        self.events = list(events)
        # The agent may mutate or replace it; the finish saves whatever it is then, unless it
        # is still what the claim read (no write for a run that left the state alone).
        self._claimed_state = state
        self.state = copy.deepcopy(state) if state is not None else {}
        self._effects = []
        self._lost = threading.Event()
        self.lost_because = ""
        self.clock = clock
        self._ttl = lease_ttl().total_seconds()
        self._deadline = (clock() if taken_at is None else taken_at) + self._ttl
        # Taken by renewed() and lose(): a renewal is counted only while the run is not lost.
        self._deadline_lock = threading.RLock()
        self._renewer = renewer
        self._http = None
        self.said = 0
        self.asked = 0
        self.scheduled = 0
        self.deferred: Defer | None = None
        # What more() took, oldest first (also in `events`), and whether the inbox joins.
        self.joined: list[Event] = []
        self._joins: bool | None = None
        # Which agent ran it (versions.py), kept on its record; the worker sets it.
        self.version: dict | None = None

    def __repr__(self):
        return f"<Run {self.inbox.slug} gen {self.generation} events {len(self.events)}>"

    # --- verbs ----------------------------------------------------------------------------

    def say(self, text: str, urgent: bool = False):
        """An outbox message. Urgent ones go out at once, past the gap."""
        said = Say(self.inbox.pk, text, urgent=bool(urgent), generation=self.generation)
        # Its events, its place and its words: a rerun that says the same thing again after a
        # lost commit gets the same key (the receiver drops the repeat), and a later attempt
        # on the same events that says something else does not.
        words = hashlib.sha256(said.body.encode()).hexdigest()[:12]
        self._effects.append(replace(said, key=self.key(f"say-{self.said}-{words}")))
        self.said += 1

    def ask(self, request_id: str, action: str, expires_in, details=None, **options):
        """A deferred approval: its answer or expiry comes back as ("approval", request_id).

        `details` ({"tool", "arguments", "asked_by", "context"}, "schema", "question") are
        shown on the approval page; `options` are Ask's (`approvers`, `group`):
        docs/how-to/approvals.md. A request id names one request for good: asked again while
        it waits, the same request; once answered or expired, ValueError.
        """
        ask = Ask(
            self.inbox.pk,
            request_id,
            action,
            expires_in,
            details=details,
            generation=self.generation,
            **options,
        )
        ask.check_unanswered()
        self._effects.append(ask)
        self.asked += 1

    def schedule(self, key: str, due: datetime | None = None, **options):
        """A one-off or recurring timer, at `due` or `delay` after the run finishes, or on a
        `cron` schedule read in `timezone`: `options` are Schedule's (`delay`, `every`,
        `payload`, `cron`, `timezone`, ...)."""
        self._effects.append(
            Schedule(self.inbox.pk, key, due=due, generation=self.generation, **options)
        )
        self.scheduled += 1

    def effect(self, effect):
        """An effect of the agent's own: a callable taking `now`, run inside the finish's
        fenced transaction with the verbs' effects, so it commits with them or not at all
        (the Claude agent's memory writes). Dropped, like them, by a later `defer`."""
        if not callable(effect):
            raise ValueError(f"effect must be callable, not {type(effect).__name__}")
        self._effects.append(effect)

    def defer(self, reason: str, *, until: datetime | None = None, delay=None):
        """Give the batch back untouched, to be claimed again at `until` (or `delay` after the
        finish), without counting the attempt: the run cannot work yet through no fault of
        its events. What the verbs recorded before this call is dropped; verbs called after
        it and the session state commit with the deferral.
        """
        self.deferred = Defer(reason, until=until, delay=delay)
        self._effects = []
        self.said = self.asked = self.scheduled = 0

    def more(self, now=None) -> list[Event]:
        """The chat messages sent since this run's claim, taken into the run under the inbox's
        `join` choice ([] under `queue`). They join `run.events` and end with the run, as its
        batch does. Only chat messages never attempted join, so a message never answers an
        approval, and a retried event's run (claimed alone) takes none. Call it where the run
        can still act on what it reads. LeaseLost once the run is lost.
        """
        self.check_lease()
        if not self.joins or any(event.attempts > 1 for event in self.events):
            return []
        taken = claim_more(self.inbox, self.holder, self.generation, JOINED_SOURCES, now=now)
        if taken is None:
            self.mark_lost()
            self.check_lease()
        self.joined += taken
        self.events += taken
        return taken

    @property
    def joins(self) -> bool:
        """Whether the inbox's agent configuration says `join` (read once per run)."""
        if self._joins is None:
            mode = AgentConfig.objects.filter(inbox_id=self.inbox.pk).values_list(
                "mid_run", flat=True
            )
            self._joins = mode.first() == MidRun.JOIN
        return self._joins

    def key(self, name: str, event: Event | None = None) -> str:
        """An idempotency key for an external call, the same on every retry.

        Derived from the events, never from the attempt or the generation, so a retry after
        a takeover passes the same key and the receiving system can refuse the repeat. Pass
        the `event` the call is about: a retried event is claimed alone, and a key from one
        event survives that re-batching, where a key from the whole batch would not.
        """
        events = [event] if event is not None else self.events
        basis = "\n".join(
            [str(self.inbox.pk), name, *sorted(f"{e.source}\x1f{e.source_id}" for e in events)]
        )
        return f"{name}-{hashlib.sha256(basis.encode()).hexdigest()[:32]}"

    @property
    def http(self):
        """Outbound HTTP through the egress gateway: name a service and a path; the gateway
        checks the allowlist and adds the credential this run never sees. LeaseLost once the
        run is lost, on each call too.
        """
        self.check_lease()
        if self._http is None:
            self._http = http_for(self)
        return self._http

    def renew(self):
        """Renew the lease between steps; LeaseLost if this run has been fenced off, or when
        no renewal succeeds by the lease's deadline, which it never waits past."""
        self.check_lease()
        sent = self.clock()
        if self._renewer is None:
            renewed = renew(self.inbox.pk, self.holder, self.generation)
        else:
            renewed = self._renewer(self, self._deadline - sent)
        if renewed is None:
            self.lose("no renewal succeeded by the lease's deadline (the database did not answer)")
        elif not renewed:
            self.lose("the lease is no longer this run's (taken over or lapsed)")
        elif not self.renewed(sent):
            self.lose("the renewal came back after the lease's deadline")
        self.check_lease()

    def check_lease(self):
        """LeaseLost unless this run still holds its lease by its own clock. No database call,
        so a database that stopped answering cannot hold it up."""
        if self.lost:
            raise LeaseLost(
                f"lease of {self.inbox.slug} lost (generation {self.generation}):"
                f" {self.lost_because}"
            )

    # --- for the worker -------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """Whether the run has lost its lease: fenced off, or past its deadline (then lost from
        that moment on, even if a renewal answers later)."""
        if self._lost.is_set():
            return True
        if self.clock() >= self._deadline:
            self.lose("no renewal succeeded by the lease's deadline")
            return True
        return False

    @property
    def deadline(self) -> float:
        """When the lease lapses unless renewed, on `clock`."""
        return self._deadline

    def renewed(self, sent: float) -> bool:
        """A renewal sent at `sent` (read before the statement went out, so never after the
        database's stamp) succeeded: the TTL runs from then. False when the run was lost
        first: a late answer does not bring a lost run back."""
        with self._deadline_lock:
            if self.lost:
                return False
            self._deadline = max(self._deadline, sent + self._ttl)
            return True

    def lose(self, because: str):
        """Mark the run lost (once; the first reason stays), and say so in the log."""
        with self._deadline_lock:
            if self._lost.is_set():
                return
            self.lost_because = because
            self._lost.set()
        log.warning("lease lost: inbox=%s gen=%s: %s", self.inbox.slug, self.generation, because)

    def mark_lost(self):
        self.lose("the lease is no longer this run's (taken over or lapsed)")

    @property
    def summary(self) -> str:
        """What the run said and asked, in short ("asked 1, said 1"); "" when nothing."""
        if self.asked:
            return f"asked {self.asked}" + (f", said {self.said}" if self.said else "")
        return f"said {self.said}" if self.said else ""

    def produced(self) -> dict:
        """What the run produced, for its record: counts, and the size of the state it saves
        (0 when it leaves the state as it was)."""
        changed = self._claimed_state is None or self.state != self._claimed_state
        produced = {
            "said": self.said,
            "asked": self.asked,
            "scheduled": self.scheduled,
            "state_bytes": len(json.dumps(self.state)) if changed else 0,
        }
        if self.version is not None:
            produced["version"] = self.version
        return produced

    def effects(self) -> list:
        if self._claimed_state is not None and self.state == self._claimed_state:
            return list(self._effects)
        return [
            *self._effects,
            SaveState(self.inbox.pk, self.state),
            # Kept for a replay of the next run, which starts from it (alwayson/claude/replay.py).
            KeepState(self.inbox.pk, self.generation, self.state),
        ]
