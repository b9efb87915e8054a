"""The chaos run's plan, drawn from one seed: inboxes, deliveries and the fault schedule.

Everything here is a pure function of the seed and the options, so `--seed` replays the same
schedule. What the system does in between (which run a SIGSTOP catches) is not replayable;
the schedule that provoked it is.
"""

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field

# Fault kinds. Every kind is in every plan, however short the run.
KILL = "kill"  # SIGKILL a process, restart it
STOP = "stop"  # SIGSTOP a process past the lease TTL, then SIGCONT
TERMINATE = "terminate"  # pg_terminate_backend on a process's connection, mid-transaction
PG_RESTART_FAST = "pg-restart-fast"
PG_RESTART_IMMEDIATE = "pg-restart-immediate"
PG_OUTAGE = "pg-outage"  # the cluster stopped for `outage` seconds
RUNALL_CHILD_KILL = "runall-child-kill"  # SIGKILL one child of runall; runall must stop
# A process's own proxy to PostgreSQL (tests/support/tcp_proxy.py):
PROXY_LATENCY = "proxy-latency"  # every chunk delayed, either way, for a while
PROXY_BLACKHOLE = "proxy-blackhole"  # nothing forwarded, sockets left open, past the TTL
PROXY_RESET = "proxy-reset"  # every open connection aborted with an RST
PROXY_FAULTS = (PROXY_LATENCY, PROXY_BLACKHOLE, PROXY_RESET)
# The primary stopped -m immediate, its synchronous standby promoted, the proxies repointed.
FAILOVER = "failover"
FAULT_KINDS = (
    KILL,
    STOP,
    TERMINATE,
    PG_RESTART_FAST,
    PG_RESTART_IMMEDIATE,
    PG_OUTAGE,
    RUNALL_CHILD_KILL,
    *PROXY_FAULTS,
)
# The failover scenario (`--failover`): the failover in place of the restarts and the outage.
FAILOVER_FAULT_KINDS = (KILL, STOP, TERMINATE, RUNALL_CHILD_KILL, *PROXY_FAULTS, FAILOVER)
DATABASE_FAULTS = (PG_RESTART_FAST, PG_RESTART_IMMEDIATE, PG_OUTAGE, FAILOVER)

# Roles of processes, by the first letter of their name (w1, s2, d1, i3, a1, r1).
WORKER, SCHEDULER, DISPATCHER, INGESTER, ANSWERER, RUNALL = (
    "worker",
    "scheduler",
    "dispatcher",
    "ingester",
    "answerer",
    "runall",
)
ROLE_BY_PREFIX = {
    "w": WORKER,
    "s": SCHEDULER,
    "d": DISPATCHER,
    "i": INGESTER,
    "a": ANSWERER,
    "r": RUNALL,
}

WARMUP = 5.0  # seconds of load before the first fault
CLEAN = 14.0  # seconds after the warm-up with the database up: the stalls' wake-ups
RESTART_SLOT = 6.0  # seconds a database restart and its recovery take
OUTAGE_RECOVERY = 6.0  # seconds after the outage before the run may end
FAILOVER_SLOT = 15.0  # seconds a failover (its replication lag too) and the reconnections take
MIN_SECONDS = 45
# Approval decisions of the answerer, by weight: answered at once, tapped twice (yes then
# no), answered after the deadline, or left to expire.
DECISIONS = (("yes", 4), ("no", 2), ("double", 1), ("late", 1), ("ignore", 2))


def role_of(name: str) -> str:
    return ROLE_BY_PREFIX[name[0]]


@dataclass
class InboxPlan:
    slug: str
    kind: str  # the outbox channel: "webhook" or "email"
    mode: str  # "at_least_once" or "at_most_once"
    gap: int  # seconds between two sends
    tick_every: int  # the recurring timer "tick", every N seconds
    tick_policy: str  # "coalesce" or "catch_up"
    cron: bool  # also a cron timer, every minute


@dataclass
class PlannedDelivery:
    """One planned key, delivered once or more: by an ingester process (`i2`, source chat)
    or over HTTP as a signed Standard Webhook (`h1`, source standard)."""

    inbox: str
    source: str
    source_id: str
    flags: dict
    sends: list  # [[seconds after the start, sender name], ...]


@dataclass
class Fault:
    at: float  # seconds after the start
    kind: str
    role: str | None  # the role to hit (kill, stop, terminate), or None
    duration: float = 0.0  # stop, blackhole, latency: for how long; outage: seconds down
    mode: str = ""  # outage: how the cluster is stopped ("fast" or "immediate")
    pick: int = 0  # a seeded number for the choices made when the fault fires
    latency: float = 0.0  # proxy-latency: seconds added to every chunk


@dataclass
class Plan:
    seed: int
    seconds: float
    outage: float
    ttl: int
    max_attempts: int
    workers: int
    concurrency: int
    ingesters: int
    failover: bool = False  # the failover scenario: a synchronous standby, promoted mid-run
    inboxes: list = field(default_factory=list)
    deliveries: list = field(default_factory=list)
    faults: list = field(default_factory=list)

    @property
    def process_names(self) -> list[str]:
        return [
            *(f"w{n}" for n in range(1, self.workers + 1)),
            "s1",
            "s2",
            "d1",
            "d2",
            *(f"i{n}" for n in range(1, self.ingesters + 1)),
            "a1",
            "r1",
        ]

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        """Every kind this plan injects, each at least once."""
        return FAILOVER_FAULT_KINDS if self.failover else FAULT_KINDS

    def sends_of(self, sender: str) -> list[tuple[float, PlannedDelivery]]:
        """(time, delivery) for one sender, in time order."""
        sends = [
            (at, delivery)
            for delivery in self.deliveries
            for at, name in delivery.sends
            if name == sender
        ]
        return sorted(sends, key=lambda pair: (pair[0], pair[1].source_id))

    def decision(self, inbox: str, request_id: str) -> str:
        """What the answerer does with an approval: stable for the seed, whoever asks."""
        digest = hashlib.sha256(f"{self.seed}:{inbox}:{request_id}".encode()).digest()
        point = int.from_bytes(digest[:4], "big") % sum(w for _, w in DECISIONS)
        for name, weight in DECISIONS:
            if point < weight:
                return name
            point -= weight
        raise AssertionError("unreachable")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        data = json.loads(text)
        data["inboxes"] = [InboxPlan(**item) for item in data["inboxes"]]
        data["deliveries"] = [PlannedDelivery(**item) for item in data["deliveries"]]
        data["faults"] = [Fault(**item) for item in data["faults"]]
        return cls(**data)


def make_plan(
    seed: int,
    seconds: float = 60,
    outage: float = 20,
    inboxes: int = 24,
    rate: float = 8,
    workers: int = 3,
    concurrency: int = 3,
    ingesters: int = 3,
    ttl: int = 4,
    max_attempts: int = 5,
    failover: bool = False,
) -> Plan:
    if seconds < MIN_SECONDS:
        raise ValueError(f"seconds must be at least {MIN_SECONDS}, not {seconds}")
    longest = seconds - WARMUP - 2 - CLEAN - OUTAGE_RECOVERY - 2 * RESTART_SLOT
    if not failover and not 0 < outage <= longest:
        raise ValueError(f"outage must be positive and at most {longest:g} s here, not {outage}")
    rng = random.Random(seed)
    plan = Plan(
        seed=seed,
        seconds=seconds,
        outage=outage,
        ttl=ttl,
        max_attempts=max_attempts,
        workers=workers,
        concurrency=concurrency,
        ingesters=ingesters,
        failover=failover,
    )
    plan.inboxes = [_inbox(rng, n, inboxes) for n in range(inboxes)]
    plan.deliveries = _deliveries(rng, plan, rate)
    plan.faults = schedule_faults(rng, plan)
    return plan


def _inbox(rng, n, total) -> InboxPlan:
    # A fixed share of each channel, so even a small run has every kind and mode.
    kinds = [
        ("webhook", "at_least_once"),
        ("email", "at_least_once"),
        ("webhook", "at_most_once"),
        ("email", "at_most_once"),
        ("webhook", "at_least_once"),
    ]
    kind, mode = kinds[n % len(kinds)]
    return InboxPlan(
        slug=f"chaos-{n:02d}",
        kind=kind,
        mode=mode,
        gap=rng.choice([1, 2, 3]),
        tick_every=rng.choice([2, 3, 5]),
        tick_policy="catch_up" if n % 3 == 0 else "coalesce",
        cron=n < max(1, total // 8),
    )


def _deliveries(rng, plan, rate) -> list[PlannedDelivery]:
    ingesters = [f"i{n}" for n in range(1, plan.ingesters + 1)]
    last = plan.seconds - 3
    deliveries = []
    for n in range(int(rate * plan.seconds)):
        inbox = rng.choice(plan.inboxes).slug
        http = rng.random() < 0.15
        first = rng.uniform(0, last)
        senders = ["h1", "h2"] if http else ingesters
        sends = [[round(first, 3), rng.choice(senders)]]
        roll = rng.random()
        if roll < 0.15:  # a concurrent duplicate from another sender
            other = rng.choice([s for s in senders if s != sends[0][1]])
            sends.append([round(first + rng.uniform(0, 0.05), 3), other])
        elif roll < 0.30:  # a redelivery, later
            sends.append([round(min(first + rng.uniform(0.5, 10), last), 3), rng.choice(senders)])
        flags = {}
        if rng.random() < 0.12:
            flags["sleep"] = round(rng.uniform(0.3, 1.5), 2)
        if rng.random() < 0.10:
            flags["ask"] = rng.randint(2, 8)  # seconds to answer
        if rng.random() < 0.10:
            flags["follow"] = rng.randint(1, 5)  # a one-off timer this many seconds later
        if rng.random() < 0.25:
            flags["urgent"] = True
        if rng.random() < 0.01:
            flags["poison"] = True
        source = "standard" if http else "chat"
        deliveries.append(PlannedDelivery(inbox, source, f"m{n}", flags, sends))
    return deliveries


def schedule_faults(rng, plan) -> list[Fault]:
    """Every kind at least once, process faults about every two seconds throughout and
    network faults (a process's proxy to PostgreSQL) about every six.

    The run opens with a stretch where the database stays up (`CLEAN` seconds), in which two
    workers are stalled: each stalled worker wakes up to a live database, where its finish
    meets the fence. The database faults follow, each in a slot of its own so that their
    recoveries do not overlap; in the failover scenario one failover takes their place. A
    terminate and a network fault need connections to hit, so none falls while the database
    is down.
    """
    start, end = WARMUP, plan.seconds - 2
    clean = start + CLEAN
    faults = [
        Fault(start + rng.uniform(0, 1), STOP, WORKER, plan.ttl + rng.uniform(1, 3)),
        Fault(start + rng.uniform(2, 3), STOP, WORKER, plan.ttl + rng.uniform(1, 3)),
    ]
    if plan.failover:
        # One slot: the failover, with room after it for the fleet to find the new primary.
        room = end - clean - FAILOVER_SLOT
        if room < 0:
            raise ValueError("the run is too short for its fault schedule: give it more --seconds")
        faults.append(Fault(clean + rng.uniform(0, room), FAILOVER, None))
    else:
        faults += _database_restarts(rng, plan, clean, end)
    database_down = [
        (f.at - 1, f.at + (FAILOVER_SLOT if f.kind == FAILOVER else f.duration) + 8)
        for f in faults
        if f.kind in DATABASE_FAULTS
    ]
    # runall migrates as it starts: while the database is down it cannot stay up to be hit.
    for _ in range(1 + int(plan.seconds // 90)):
        at = _free_moment(rng, start, end, database_down)
        faults.append(Fault(at, RUNALL_CHILD_KILL, None))
    kinds = [KILL, TERMINATE] + [
        rng.choices([KILL, STOP, TERMINATE], weights=[4, 3, 3])[0]
        for _ in range(int((end - start) / 2))
    ]
    # The network between a process and PostgreSQL, about every six seconds.
    kinds += [*PROXY_FAULTS] + [rng.choice(PROXY_FAULTS) for _ in range(int((end - start) / 6))]
    for kind in kinds:
        if kind == TERMINATE or kind in PROXY_FAULTS:  # they need connections to hit
            at = _free_moment(rng, start, end, database_down)
        else:
            at = rng.uniform(start, end)
        fault = Fault(at, kind, _target_role(rng, kind))
        if kind in (STOP, PROXY_BLACKHOLE):
            fault.duration = plan.ttl + rng.uniform(1, 3)  # past the lease: another takes over
        elif kind == PROXY_LATENCY:
            fault.duration = rng.uniform(3, 10)
            fault.latency = round(rng.uniform(0.02, 0.3), 3)
        faults.append(fault)
    for fault in faults:
        fault.at = round(fault.at, 3)
        fault.duration = round(fault.duration, 3)
        fault.pick = rng.randrange(1 << 30)
    return sorted(faults, key=lambda f: f.at)


def _database_restarts(rng, plan, clean, end) -> list[Fault]:
    faults = []
    restarts = [PG_RESTART_FAST, PG_RESTART_IMMEDIATE] * (1 + int(plan.seconds // 150))
    rng.shuffle(restarts)
    room = end - clean - plan.outage - OUTAGE_RECOVERY - RESTART_SLOT * len(restarts)
    if room < 0:
        raise ValueError("the run is too short for its fault schedule: give it more --seconds")
    # Half the restarts, the outage, the other half, with the slack spread between them: the
    # loops' backoff after the outage overlaps the rest of the window, not the drain.
    slots = [*restarts[: len(restarts) // 2], PG_OUTAGE, *restarts[len(restarts) // 2 :]]
    offsets = sorted(rng.uniform(0, room) for _ in slots)
    at = clean
    for offset, kind in zip(offsets, slots, strict=True):
        if kind == PG_OUTAGE:
            mode = rng.choice(["fast", "immediate"])
            faults.append(Fault(at + offset, kind, None, plan.outage, mode=mode))
            at += plan.outage + OUTAGE_RECOVERY
        else:
            faults.append(Fault(at + offset, kind, None))
            at += RESTART_SLOT
    return faults


def _free_moment(rng, start, end, busy):
    """A moment in [start, end] outside every busy interval."""
    for _ in range(1000):
        at = rng.uniform(start, end)
        if all(not (lo <= at <= hi) for lo, hi in busy):
            return at
    raise ValueError("the run is too short for its fault schedule: give it more --seconds")


def _target_role(rng, kind) -> str:
    if kind == KILL:
        roles = [WORKER, SCHEDULER, DISPATCHER, INGESTER, ANSWERER, RUNALL]
        return rng.choices(roles, weights=[5, 2, 2, 2, 1, 1])[0]
    if kind == STOP:
        return rng.choices([WORKER, SCHEDULER, DISPATCHER, RUNALL], weights=[6, 1, 2, 1])[0]
    if kind in PROXY_FAULTS:
        roles = [WORKER, SCHEDULER, DISPATCHER, INGESTER, ANSWERER, RUNALL]
        return rng.choices(roles, weights=[6, 1, 2, 2, 1, 1])[0]
    return rng.choices([WORKER, SCHEDULER, DISPATCHER], weights=[6, 1, 2])[0]
