import functools

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connections, models, transaction
from django.db.models import Exists, Max, OuterRef, Q, Subquery, Value
from django.db.models.functions import Now

from .exceptions import UnknownInbox
from .signals import lease_taken_over
from .validation import UNSTORABLE


class Role(models.IntegerChoices):
    """What a person may do in one inbox. Each role includes the ones below it."""

    VIEWER = 1, "viewer"  # sees the conversation and the approvals
    APPROVER = 2, "approver"  # also answers approvals and writes to the agent
    MANAGER = 3, "manager"  # also edits the inbox's settings, channel and members


def is_person(user) -> bool:
    return bool(getattr(user, "is_authenticated", False) and user.is_active)


# What a worker reads of a person, where the user model has it: who they are, their names (a
# notice greets them), whether they are active staff (an alert goes to operators).
PERSON_FIELDS = ("first_name", "last_name", "is_active", "is_staff", "is_superuser")


def person_fields() -> tuple[str, ...]:
    """The user fields the worker reads of the people it notifies, and all its database role
    may read of them (alwayson/ops/workerrole.py): never the password hash. Its queries of
    users load these only."""
    users = get_user_model()
    present = {f.name for f in users._meta.concrete_fields}
    wanted = (users._meta.pk.name, users.USERNAME_FIELD, *PERSON_FIELDS)
    return tuple(dict.fromkeys(name for name in wanted if name in present))


def granted_role(user, inbox="pk"):
    """The highest role a membership gives `user` in the inbox whose id the outer query's
    field `inbox` holds (its own "pk" in a query of inboxes), as an expression to read along
    with the rows that need it; NULL for none, and for the owner, who needs no membership."""
    if not is_person(user):
        return Value(None, output_field=models.PositiveSmallIntegerField())
    return Subquery(
        Membership.objects.filter(inbox=OuterRef(inbox))
        .granting(user, Role.VIEWER)
        .order_by()
        .values("inbox")
        .annotate(best=Max("role"))
        .values("best")
    )


class InboxQuerySet(models.QuerySet):
    def with_role(self, user, role=Role.VIEWER):
        """Inboxes where `user` holds at least `role`: as the owner (always a manager), as a
        member, or through one of their groups. None for an anonymous or inactive user."""
        if not is_person(user):
            return self.none()
        granted = Membership.objects.granting(user, role).filter(inbox=OuterRef("pk"))
        return self.filter(Q(owner=user) | Exists(granted))


# Stand-ins for one user's id and one slug in the statement _role_read builds once.
_ANY_USER_ID = -918_273_645
_ANY_SLUG = "\x00any slug"


@functools.cache
def _role_read(vendor) -> tuple[str, tuple]:
    """get_with_role's statement, built by the ORM (granting() stays the one rule) once per
    process and database (inbox/prebuilt.py says why). Its parameters hold the stand-ins."""
    anyone = get_user_model()(pk=_ANY_USER_ID)
    query = Inbox.objects.annotate(role_granted=granted_role(anyone)).filter(slug=_ANY_SLUG)
    query = query.order_by()
    alias = next(alias for alias in connections if connections[alias].vendor == vendor)
    sql, params = query.query.get_compiler(alias).as_sql()
    return sql, tuple(params)


class InboxManager(models.Manager.from_queryset(InboxQuerySet)):
    def lookup(self, ref) -> tuple[str, object]:
        """The field and value naming the inbox `ref` (an Inbox, a primary key or a slug),
        without a query; UnknownInbox for anything else. The one reading of a reference:
        resolve, pk_of and the PostgreSQL statements that find the inbox themselves."""
        if isinstance(ref, Inbox):
            return "id", ref.pk
        if isinstance(ref, int) and not isinstance(ref, bool):
            return "id", ref
        # A slug PostgreSQL cannot even compare (a NUL) names no inbox, on both databases.
        if isinstance(ref, str) and ref and not UNSTORABLE.search(ref):
            return "slug", ref
        raise UnknownInbox(ref)

    def get_with_role(self, user, slug) -> "Inbox":
        """The inbox `slug` where `user` holds a role, that role read in the same query
        (role_of and has_role then ask nothing more): every page of one inbox starts here.
        Inbox.DoesNotExist when there is no such inbox and when `user` holds no role in it
        alike."""
        inbox = None
        if is_person(user) and isinstance(slug, str) and not UNSTORABLE.search(slug):
            sql, params = _role_read(connections[self.db].vendor)
            values = {_ANY_USER_ID: user.pk, _ANY_SLUG: slug}
            found = list(self.raw(sql, [values.get(param, param) for param in params]))
            inbox = found[0] if found else None
        if inbox is not None:
            inbox.remember_role(user, inbox.role_granted)
        if inbox is None or inbox.role_of(user) is None:
            raise Inbox.DoesNotExist(f"no inbox {slug!r} where {user} holds a role")
        return inbox

    def pk_of(self, ref) -> int:
        """The primary key, without a query when `ref` is an Inbox or already an id (the
        worker's hot path); a slug is looked up."""
        field, value = self.lookup(ref)
        return value if field == "id" else self.resolve(ref).pk

    def resolve(self, ref) -> "Inbox":
        """An Inbox from an instance, a slug or a primary key; UnknownInbox otherwise."""
        if isinstance(ref, Inbox):
            return ref
        field, value = self.lookup(ref)
        try:
            return self.get(**{field: value})
        except Inbox.DoesNotExist:
            raise UnknownInbox(ref) from None


class Inbox(models.Model):
    """One agent's inbox for one owner. Every rule (one worker, dedupe, gap) holds per inbox."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="inboxes"
    )
    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    objects = InboxManager()

    class Meta:
        verbose_name_plural = "inboxes"
        ordering = ["slug"]

    def __str__(self):
        return self.slug

    def save(self, *args, **kwargs):
        # The lease row exists from the start, so acquire() always has a row to lock and
        # two first-time acquirers cannot both insert one.
        with transaction.atomic(using=kwargs.get("using")):
            adding = self._state.adding
            super().save(*args, **kwargs)
            if adding:
                Lease.objects.create(inbox=self)
                Session.objects.create(inbox=self)

    def role_of(self, user) -> Role | None:
        """The highest role `user` holds here (the owner is a manager), or None. No query
        when it was read with the inbox for this same user (remember_role)."""
        if not is_person(user):
            return None
        if self.owner_id == user.pk:
            return Role.MANAGER
        remembered = getattr(self, "_granted_role", None)
        if remembered is not None and remembered[0] == user.pk:
            best = remembered[1]
        else:
            best = (
                Membership.objects.filter(inbox=self)
                .granting(user, Role.VIEWER)
                .aggregate(best=Max("role"))["best"]
            )
        return Role(best) if best else None

    def remember_role(self, user, granted) -> None:
        """Keep `granted`, the role a membership gives `user` here as read along with this
        row (granted_role), for role_of: for the rest of this request, not a cache."""
        if is_person(user):
            self._granted_role = (user.pk, granted)

    def has_role(self, user, role) -> bool:
        held = self.role_of(user)
        return held is not None and held >= role

    def roles_of(self, user_ids) -> dict[int, Role]:
        """The highest role each of `user_ids` holds here (absent: none), in two indexed
        lookups whatever the number of people."""
        user_ids = set(user_ids)
        link = get_user_model().groups.through
        groups_of = {}
        for user_id, group_id in link.objects.filter(user_id__in=user_ids).values_list(
            "user_id", "group_id"
        ):
            groups_of.setdefault(group_id, set()).add(user_id)
        granted = Membership.objects.filter(inbox=self).filter(
            Q(user_id__in=user_ids) | Q(group_id__in=list(groups_of))
        )
        roles = {}
        for user_id, group_id, role in granted.values_list("user_id", "group_id", "role"):
            for holder in {user_id} if user_id is not None else groups_of.get(group_id, ()):
                roles[holder] = max(role, roles.get(holder, 0))
        if self.owner_id in user_ids:
            roles[self.owner_id] = Role.MANAGER
        return {user_id: Role(role) for user_id, role in roles.items()}

    def people_with_role(self, role):
        """Active users holding at least `role` here, directly or through a group, the
        owner included. Three indexed lookups, no scan of the users table."""
        granted = Membership.objects.filter(inbox=self, role__gte=role)
        user_ids = {self.owner_id}
        user_ids.update(granted.filter(user__isnull=False).values_list("user_id", flat=True))
        group_ids = granted.filter(group__isnull=False).values_list("group_id", flat=True)
        in_groups = get_user_model().groups.through.objects.filter(group_id__in=group_ids)
        user_ids.update(in_groups.values_list("user_id", flat=True))
        people = get_user_model().objects.filter(pk__in=user_ids, is_active=True)
        return people.only(*person_fields())


class MembershipQuerySet(models.QuerySet):
    def granting(self, user, role):
        """Memberships that give `user` at least `role`, directly or through a group. The
        groups are read from the user's rows of the group table's link (by its user index),
        not through a join with the groups themselves, which the planner may turn into a
        scan of every group."""
        groups = get_user_model().groups.through.objects.filter(user_id=user.pk)
        # By the user's id, not the user: a statement built once holds a Given there
        # (inbox/prebuilt.py; approvals' get_visible).
        return self.filter(
            Q(user_id=user.pk) | Q(group__in=groups.values("group_id")), role__gte=role
        )


class Membership(models.Model):
    """A user's or a group's role in one inbox (Django's own users and groups). The owner
    needs no row: they are always a manager."""

    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="inbox_memberships",
    )
    group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="inbox_memberships",
    )
    role = models.PositiveSmallIntegerField(choices=Role.choices, default=Role.VIEWER)

    objects = MembershipQuerySet.as_manager()

    class Meta:
        ordering = ["inbox", "-role", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, group__isnull=True)
                | Q(user__isnull=True, group__isnull=False),
                name="membership_user_or_group",
            ),
            # Also the index of every page's role check: one inbox, one user or group.
            models.UniqueConstraint(
                fields=["inbox", "user"],
                condition=Q(user__isnull=False),
                name="membership_unique_user",
            ),
            models.UniqueConstraint(
                fields=["inbox", "group"],
                condition=Q(group__isnull=False),
                name="membership_unique_group",
            ),
        ]

    def __str__(self):
        who = f"group {self.group}" if self.group_id else str(self.user)
        return f"{who}: {self.get_role_display()} of {self.inbox}"

    def clean(self):
        if bool(self.user_id) == bool(self.group_id):
            raise ValidationError("Choose a user or a group, not both and not neither.")


class LeaseQuerySet(models.QuerySet):
    def free(self, now):
        return self.filter(Q(until__isnull=True) | Q(until__lt=now))

    def with_work(self, now):
        """Inboxes a worker may take now: claimable work and nobody holding the lease."""
        return self.free(now).filter(work_at__lte=now)

    def held(self, inbox_id, holder, generation, now=None):
        """The lease row while (holder, generation) still holds it."""
        now = Now() if now is None else now
        return self.filter(
            inbox_id=inbox_id, holder=holder, generation=generation, until__gt=now
        ).exclude(holder="")


class Lease(models.Model):
    """Who may run an inbox's agent, and until when. One row per inbox.

    `generation` goes up on every takeover; every claimed event is stamped with the generation
    that claimed it, and every write that ends a run checks (holder, generation) under this
    row's lock, so a worker that was only slow cannot finish a run somebody else took over.
    """

    inbox = models.OneToOneField(
        Inbox, on_delete=models.CASCADE, primary_key=True, related_name="lease"
    )
    holder = models.CharField(max_length=200, blank=True)
    generation = models.PositiveBigIntegerField(default=0)
    until = models.DateTimeField(null=True, blank=True)
    # When the inbox next has claimable work (None: nothing pending). Kept here, under this
    # row's lock, so finding work reads one row per inbox and never scans the events table.
    work_at = models.DateTimeField(null=True, blank=True)

    objects = LeaseQuerySet.as_manager()

    class Meta:
        indexes = [
            # acquire_next: inboxes with work, soonest first (workers, under SKIP LOCKED).
            models.Index(
                fields=["work_at"], condition=Q(work_at__isnull=False), name="lease_work_idx"
            ),
        ]

    def __str__(self):
        return f"{self.inbox_id}: {self.holder or '-'} gen {self.generation}"

    def take(self, holder, now, ttl) -> int | None:
        """Take or renew this (locked) lease: the generation, or None while another holds it.

        Renewing keeps the generation; any takeover, even by the same holder after its lease
        lapsed, starts a new one, so claims made under the lapsed lease can be told apart.
        The portable form, SQLite's; PostgreSQL states the rule in inbox/sql/take_lease.sql.
        """
        if self.is_free(now):
            if self.until is not None:  # lapsed, not released: a takeover
                lease_taken_over.send(sender=Lease, lease=self, now=now)
            self.generation += 1
        elif self.holder != holder:
            return None
        self.holder = holder
        self.until = now + ttl
        self.save(update_fields=["holder", "generation", "until"])
        return self.generation

    def note_work(self, at):
        """Record that work becomes claimable at `at` (earlier work wins)."""
        if self.work_at is None or at < self.work_at:
            self.work_at = at
            self.save(update_fields=["work_at"])

    def recount_work(self):
        """Recompute work_at from the inbox's pending events after a claim or finish."""
        self.work_at = (
            Event.objects.filter(inbox_id=self.inbox_id)
            .pending()
            .aggregate(first=models.Min("available_at"))["first"]
        )
        self.save(update_fields=["work_at"])

    def is_free(self, now) -> bool:
        return self.until is None or self.until < now

    def is_held_by(self, holder, generation, now) -> bool:
        return self.holder == holder and self.generation == generation and not self.is_free(now)


class EventQuerySet(models.QuerySet):
    def pending(self):
        return self.filter(status=Event.Status.PENDING)

    def running(self):
        return self.filter(status=Event.Status.RUNNING)

    def dead(self):
        return self.filter(status=Event.Status.DEAD)

    def orphaned_by(self, generation):
        """Running rows of an older generation: their worker lost the lease mid-run."""
        return self.running().filter(claim_gen__lt=generation)

    def out_of_attempts(self, max_attempts):
        return self.pending().filter(attempts__gte=max_attempts)

    def retries(self):
        return self.pending().filter(attempts__gt=0)

    def due(self, now):
        return self.filter(available_at__lte=now)

    def claimable(self, now):
        """What a claim may take now: pending and due (the batch's choice among them, and a
        join's, are the claim's: backends/base.py)."""
        return self.pending().due(now)

    def fresh(self):
        """Never attempted: what a run's join may take (a retry is claimed alone)."""
        return self.filter(attempts=0)


class Event(models.Model):
    """One wake-up of the agent: a webhook, a chat message, a timer tick, an approval answer."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        DEAD = "dead"

    # No index of its own: event_unique_source_key starts with inbox_id and serves every
    # lookup by inbox. A second would cost every insert, and the planner may pick it for
    # ingest's duplicate check in a cached plan that reads every event of the inbox.
    inbox = models.ForeignKey(
        Inbox, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    source = models.CharField(max_length=100)
    source_id = models.CharField(max_length=255)
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    claim_gen = models.PositiveBigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Not claimed before this: the arrival time, then pushed back by each retry's backoff.
    available_at = models.DateTimeField()
    created = models.DateTimeField()
    updated = models.DateTimeField()

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            # The first rule: a retried delivery of the same source key is refused.
            models.UniqueConstraint(
                fields=["inbox", "source", "source_id"], name="event_unique_source_key"
            ),
        ]
        indexes = [
            # claim_batch and Lease.recount_work: the pending rows of one inbox that are due.
            models.Index(
                fields=["inbox", "available_at", "id"],
                condition=Q(status="pending"),
                name="event_pending_idx",
            ),
            # claim_batch: running rows of one inbox left behind by an older generation.
            models.Index(
                fields=["inbox", "claim_gen"],
                condition=Q(status="running"),
                name="event_running_idx",
            ),
            # deadletters and the admin's dead filter.
            models.Index(
                fields=["inbox", "updated"], condition=Q(status="dead"), name="event_dead_idx"
            ),
            # prune (alwayson/ops/retention.py): done rows, oldest first.
            models.Index(
                fields=["updated", "id"], condition=Q(status="done"), name="event_done_idx"
            ),
        ]

    def __str__(self):
        return f"{self.source}:{self.source_id} ({self.status})"

    @property
    def error_line(self) -> str:
        return error_line(self.error)


def error_line(error: str) -> str:
    """The line of a stored error that says what failed: a traceback's last
    (`ValueError: ...`), the whole of a one-line error."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


class EventTraceQuerySet(models.QuerySet):
    def of_events(self, event_ids) -> dict[int, str]:
        """The stored traceparents of these events, by event id (events without one absent)."""
        return dict(self.filter(event_id__in=list(event_ids)).values_list("event", "traceparent"))


class EventTrace(models.Model):
    """The trace context of the request that stored an event, so the run that handles it
    continues that trace. A table of its own, not a column of Event, so tracing off costs
    nothing: docs/explanation/design.md, "Trace contexts"."""

    event = models.OneToOneField(
        Event, on_delete=models.CASCADE, primary_key=True, related_name="trace"
    )
    traceparent = models.CharField(max_length=55)

    objects = EventTraceQuerySet.as_manager()

    def __str__(self):
        return f"{self.event_id}: {self.traceparent}"


class Session(models.Model):
    """The agent's durable state for one inbox: what a run that ended on a deferred tool call
    leaves for the run that resumes it. Replaced only by a fenced finish."""

    inbox = models.OneToOneField(
        Inbox, on_delete=models.CASCADE, primary_key=True, related_name="session"
    )
    state = models.JSONField(default=dict, blank=True)
    updated = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"session of {self.inbox_id}"


class RunRecordQuerySet(models.QuerySet):
    def of_inbox(self, inbox_id):
        return self.filter(inbox_id=inbox_id)

    def in_window(self, since, until):
        """Runs started in [since, until): bounded by runrecord_started_idx, so a chart's one
        query reads only its window however long the history is."""
        if since >= until:
            raise ValueError(f"in_window needs since < until, got {since} >= {until}")
        return self.filter(started__gte=since, started__lt=until)


class RunRecord(models.Model):
    """What one run did, under the lease generation it ran in. Who writes it, and when:
    docs/explanation/design.md, "Run records"."""

    class Outcome(models.TextChoices):
        DONE = "done"
        ERROR = "error"
        DEFERRED = "deferred"
        REFUSED = "refused"  # its finish came after the lease was lost: nothing committed
        LOST = "lost"  # its worker vanished; a later take found its events running

    # No index of its own: runrecord_run_idx starts with inbox_id and serves every lookup by
    # inbox (and the cascade); a second one would cost every run's record an index entry.
    inbox = models.ForeignKey(Inbox, on_delete=models.CASCADE, related_name="runs", db_index=False)
    generation = models.PositiveBigIntegerField()
    worker = models.CharField(max_length=200)
    # When its events were claimed, and when it ended (the finish's clock; for a lost run,
    # when the take that found it ran).
    started = models.DateTimeField()
    ended = models.DateTimeField()
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    error = models.TextField(blank=True)
    # The ids of the events it claimed, oldest first.
    events = models.JSONField(default=list)
    # The oldest claimed event's arrival: how long work waited before a worker took it.
    waiting_since = models.DateTimeField(null=True, blank=True)
    # What the run produced, as the runtime counts it: {"said", "asked", "scheduled",
    # "state_bytes", ...}; the rows themselves carry the run's generation.
    produced = models.JSONField(default=dict, blank=True)
    # The W3C traceparent of the run's span when tracing is on (inbox/tracing.py).
    trace = models.CharField(max_length=55, blank=True)

    objects = RunRecordQuerySet.as_manager()

    class Meta:
        ordering = ["-started", "-id"]
        indexes = [
            # A run's record by its lease generation (the timeline, a lost or refused run's
            # record). Not unique: a worker's run is one take and one generation, but a
            # caller of claim_batch may claim and finish twice under one held lease.
            models.Index(fields=["inbox", "generation"], name="runrecord_run_idx"),
            # The run list: every inbox's runs, newest first, and the dashboard's windows.
            models.Index(fields=["started", "id"], name="runrecord_started_idx"),
            # prune (alwayson/ops/retention.py): oldest ended first.
            models.Index(fields=["ended", "id"], name="runrecord_ended_idx"),
        ]

    def __str__(self):
        return f"run {self.inbox_id}/{self.generation} ({self.outcome})"

    @property
    def duration(self):
        return self.ended - self.started
