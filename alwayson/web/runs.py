"""What did my agent do? The run list and one run's timeline, from its RunRecord and the rows
the run wrote under its (inbox, generation): the Claude agent's model and tool calls, the
messages it said, the approvals it asked, the timers it set (docs/explanation/design.md,
run records).

Who sees a run is who sees its inbox: any role, and operators (staff who may view run
records and events in the admin, where every run is listed already). Anyone else gets the
inbox page's 404.
"""

import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from django import forms
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db.models import F, IntegerField, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce

from alwayson.claude.models import TOTAL_TOKENS, MemoryVersion, ModelCall, ToolResult
from alwayson.egress.models import EgressCall
from approvals.models import Approval
from inbox.models import Event, Inbox, RunRecord, is_person
from outbox.models import Channel, OutboxMessage
from timers.models import Timer

PAGE = 50  # runs per page of the list, newest first
CALLS_OUT = 200  # calls out shown on one timeline, the first ones
SHORT = 160  # characters of a body or payload shown before its <details>


def is_operator(user) -> bool:
    """Staff who may view every run record and event in the admin: the dead event's page
    links them to its run, whether or not they hold a role in its inbox."""
    return (
        is_person(user)
        and user.is_staff
        and user.has_perms(("inbox.view_runrecord", "inbox.view_event"))
    )


def visible_inboxes(user):
    return Inbox.objects.with_role(user)


def inbox_of_run(user, slug) -> Inbox:
    """The inbox `slug` if `user` may see its runs; Inbox.DoesNotExist otherwise, alike for
    an inbox that does not exist and one they hold no role in."""
    try:
        return Inbox.objects.get_with_role(user, slug)
    except Inbox.DoesNotExist:
        if not is_operator(user) or not isinstance(slug, str):
            raise
        return Inbox.objects.get(slug=slug)


# --- the list ----------------------------------------------------------------------------------


def tokens_of_run():
    """The total tokens the run's model calls paid for, as an expression on a RunRecord
    query: one correlated sum per row, by ModelCall's (inbox, generation) index. Records that
    share a generation (claim_batch's second claim under one lease) each show its sum."""
    calls = (
        ModelCall.objects.filter(inbox_id=OuterRef("inbox_id"), generation=OuterRef("generation"))
        .order_by()
        .values("inbox_id")
        .annotate(total=Sum(TOTAL_TOKENS))
        .values("total")
    )
    return Coalesce(Subquery(calls, output_field=IntegerField()), 0)


class Cursor:
    """Where a page of the list ends: the last row's (started, id), the list's order."""

    SEPARATOR = "~"

    @classmethod
    def of(cls, record) -> str:
        return f"{record.started.isoformat()}{cls.SEPARATOR}{record.pk}"

    @classmethod
    def parse(cls, text) -> tuple[datetime, int]:
        started, _, pk = text.rpartition(cls.SEPARATOR)
        try:
            at, pk = datetime.fromisoformat(started), int(pk)
        except ValueError:
            raise forms.ValidationError("Not a page of this list.") from None
        if at.tzinfo is None or pk < 1:
            raise forms.ValidationError("Not a page of this list.")
        return at, pk


def day_field(label):
    # Bounded so that the day after is still a date: "until 9999-12-31" is a 400, not a 500.
    return forms.DateField(
        required=False,
        label=label,
        widget=forms.DateInput(attrs={"type": "date"}),
        validators=[MinValueValidator(date(1970, 1, 1)), MaxValueValidator(date(9998, 12, 31))],
    )


class RunFilter(forms.Form):
    """The run list's filters, from the query string. An invalid value is the page's 400,
    with the field's reason."""

    inbox = forms.ModelChoiceField(
        queryset=Inbox.objects.none(), to_field_name="slug", required=False, empty_label="all"
    )
    outcome = forms.ChoiceField(choices=[("", "any"), *RunRecord.Outcome.choices], required=False)
    day = day_field("Started on")
    since = day_field("Started from")
    until = day_field("Started until")
    longer_than = forms.DecimalField(
        required=False,
        min_value=0,
        max_value=10**7,
        decimal_places=3,
        label="Ran longer than (seconds)",
    )
    tokens_over = forms.IntegerField(
        required=False, min_value=0, max_value=10**12, label="Cost more than (tokens)"
    )
    agent = forms.CharField(required=False, max_length=200, label="Agent (dotted path)", strip=True)
    code = forms.CharField(
        required=False, max_length=100, label="Agent code (fingerprint)", strip=True
    )
    config_revision = forms.IntegerField(
        required=False, min_value=1, max_value=2**31 - 1, label="Configuration revision"
    )
    before = forms.CharField(required=False, widget=forms.HiddenInput, max_length=80)

    def __init__(self, user, *args, **kwargs):
        super().__init__(*args, label_suffix="", **kwargs)
        self.fields["inbox"].queryset = visible_inboxes(user)

    def clean_before(self):
        text = self.cleaned_data["before"]
        return Cursor.parse(text) if text else None

    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            raise forms.ValidationError("“Started from” is after “Started until”.")
        return cleaned

    def apply(self, records):
        """The records these (valid) filters keep."""
        data = self.cleaned_data
        if data.get("inbox"):
            records = records.filter(inbox=data["inbox"])
        if data.get("outcome"):
            records = records.filter(outcome=data["outcome"])
        # A day is the UTC day, as every page shows times in UTC.
        if data.get("day"):
            records = records.filter(started__gte=midnight(data["day"]))
            records = records.filter(started__lt=midnight(data["day"] + timedelta(days=1)))
        if data.get("since"):
            records = records.filter(started__gte=midnight(data["since"]))
        if data.get("until"):
            records = records.filter(started__lt=midnight(data["until"] + timedelta(days=1)))
        if data.get("longer_than") is not None:
            longer = timedelta(seconds=float(data["longer_than"]))
            records = records.filter(ended__gt=F("started") + longer)
        if data.get("tokens_over") is not None:
            records = records.filter(tokens__gt=data["tokens_over"])
        # The version the run's record keeps (alwayson/runtime/versions.py).
        if data.get("agent"):
            records = records.filter(produced__version__agent=data["agent"])
        if data.get("code"):
            records = records.filter(produced__version__code=data["code"])
        if data.get("config_revision") is not None:
            records = records.filter(produced__version__config=data["config_revision"])
        if data.get("before"):
            at, pk = data["before"]
            records = records.filter(Q(started__lt=at) | Q(started=at, pk__lt=pk))
        return records

    def filtered(self) -> bool:
        return any(
            self.cleaned_data.get(name) not in (None, "")
            for name in self.fields
            if name != "before"
        )


def midnight(day) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


@dataclass
class RunPage:
    records: list
    next_cursor: str | None


def run_page(user, form: RunFilter) -> RunPage:
    """One page of the runs `user` may see that the valid `form` keeps, newest first, in one
    query whatever the page's size: the inbox joined, the tokens summed per row."""
    records = (
        RunRecord.objects.filter(inbox__in=visible_inboxes(user))
        .select_related("inbox")
        .annotate(tokens=tokens_of_run())
        .order_by("-started", "-id")
    )
    rows = list(form.apply(records)[: PAGE + 1])
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    return RunPage(rows, Cursor.of(rows[-1]) if more else None)


# --- one run's timeline --------------------------------------------------------------------------


@dataclass
class Text:
    """A body shown whole when short, else its start with the whole in a <details>."""

    full: str

    @property
    def short(self) -> str:
        return self.full if not self.long else self.full[:SHORT].rstrip() + "…"

    @property
    def long(self) -> bool:
        return len(self.full) > SHORT or self.full.count("\n") > 3


def as_json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@dataclass
class Step:
    """One line of the timeline: what happened at `at`, of one `kind`, from `row`."""

    at: datetime
    kind: str  # event, start, model, tool, approval, message, timer, end
    row: object
    # Sorts steps of one instant (a pinned clock, or one finish's rows): see Timeline.steps.
    order: tuple = ()
    took: timedelta | None = None
    text: Text | None = None
    extra: dict = field(default_factory=dict)


# At one instant: the events, then the run's start, its calls, what its finish committed
# (approvals asked, messages said, timers set), then its end.
RANK = {
    "event": 0,
    "start": 1,
    "model": 2,
    "tool": 2,
    "egress": 2,
    "approval": 3,
    "message": 4,
    "timer": 5,
    "memory": 5,
    "end": 6,
}


@dataclass
class Timeline:
    inbox: Inbox
    generation: int
    records: list  # oldest first: one, or more when claim_batch claimed twice in one lease
    steps: list
    channel: str
    calls_out_cut: bool  # more calls out in its time than are shown
    missing_events: int  # listed by a record, no longer stored (prune)

    @property
    def record(self):
        return self.records[-1]

    @property
    def error(self) -> Text:
        return Text(self.record.error)

    @property
    def tokens(self) -> int:
        return sum(s.row.total_tokens for s in self.steps if s.kind == "model")


def timeline(inbox: Inbox, generation: int) -> Timeline | None:
    """Everything one run of `inbox` under lease `generation` did, in time order; None if no
    record of it is kept. A constant number of queries: one per kind of row."""
    # A generation is not unique (docs/explanation/design.md): a caller of claim_batch may
    # claim and finish twice under one held lease. The rows the run wrote carry only the
    # generation, so they cannot be told apart by record; the page shows every record's
    # start and end among them, in time order, and says how many there were.
    records = list(
        RunRecord.objects.filter(inbox=inbox, generation=generation).order_by("started", "id")
    )
    if not records:
        return None
    steps = []
    event_ids = list(dict.fromkeys(pk for record in records for pk in record.events))
    started = {}
    for record in records:
        for pk in record.events:
            started.setdefault(pk, record.started)
        steps.append(Step(record.started, "start", record))
        steps.append(Step(record.ended, "end", record, took=record.ended - record.started))
    events = list(Event.objects.filter(inbox=inbox, pk__in=event_ids).order_by("id"))
    for event in events:
        waited = started[event.pk] - event.created
        steps.append(
            Step(
                event.created,
                "event",
                event,
                order=(event.pk,),
                took=max(waited, timedelta(0)),
                text=Text(payload_summary(event)),
            )
        )
    steps += model_and_tool_steps(inbox, generation)
    for approval in Approval.objects.filter(inbox=inbox, generation=generation).select_related(
        "answered_by", "first_approved_by", "edited_by"
    ):
        approval.inbox = inbox
        steps.append(Step(approval.requested_at, "approval", approval, order=(approval.pk,)))
    for message in OutboxMessage.objects.of_run(inbox.pk, generation):
        steps.append(
            Step(message.created, "message", message, order=(message.pk,), text=Text(message.body))
        )
    # A timer keeps no time it was set at: its run's finish set it.
    for timer in Timer.objects.filter(inbox=inbox, generation=generation).order_by("id"):
        steps.append(Step(records[-1].ended, "timer", timer, order=(timer.pk,)))
    # Its memory writes committed with its finish, at the finish's time.
    for version in MemoryVersion.objects.filter(inbox=inbox, generation=generation).order_by("id"):
        steps.append(Step(version.created, "memory", version, order=(version.pk,)))
    calls_out = calls_out_during(inbox, records)
    steps += [
        Step(call.at, "egress", call, order=(0, 0, call.pk)) for call in calls_out[:CALLS_OUT]
    ]
    steps.sort(key=lambda step: (step.at, RANK[step.kind], step.order))
    channel = Channel.objects.filter(inbox=inbox).values_list("kind", flat=True).first()
    return Timeline(
        inbox,
        generation,
        records,
        steps,
        Channel.Kind(channel).label if channel else Channel.Kind.EMAIL.label,
        len(calls_out) > CALLS_OUT,
        len(event_ids) - len(events),
    )


def calls_out_during(inbox, records) -> list:
    """The egress gateway's calls for the inbox while one of these records ran. A call keeps
    no generation, so it is matched by time: one run holds an inbox's lease at a time, and
    the gateway refuses a run that lost it (recorded as refused). One more than CALLS_OUT,
    to tell the page there were more."""
    during = Q()
    for record in records:
        during |= Q(at__gte=record.started, at__lte=record.ended)
    calls = EgressCall.objects.filter(during, inbox=inbox).order_by("at", "id")
    return list(calls[: CALLS_OUT + 1])


def model_and_tool_steps(inbox, generation) -> list[Step]:
    """The Claude agent's journal of the run. A tool call follows the model call whose answer
    asked for it (its result names that tool_use), whatever their clocks say; a call resumed
    from an earlier run's answer comes before this run's model calls of its instant."""
    steps = []
    asked_by = {}
    for call in ModelCall.objects.of_run(inbox.pk, generation):
        blocks = call.response.get("content", []) if isinstance(call.response, dict) else []
        said = "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        uses = [b for b in blocks if b.get("type") == "tool_use"]
        for block in uses:
            asked_by[block.get("id")] = call
        took = timedelta(milliseconds=call.duration_ms) if call.duration_ms is not None else None
        steps.append(
            Step(
                call.created,
                "model",
                call,
                order=(call.pk, 0),
                took=took,
                text=Text(said.strip()) if said.strip() else None,
                extra={"uses": [b.get("name", "") for b in uses]},
            )
        )
    tools = ToolResult.objects.of_run(inbox.pk, generation).select_related(
        "approval__answered_by", "approval__first_approved_by"
    )
    for call in tools:
        use_id = call.result.get("tool_use_id") if isinstance(call.result, dict) else None
        parent = asked_by.get(use_id)
        at, order = (
            (parent.created, (parent.pk, 1, call.pk)) if parent else (call.created, (0, 1, call.pk))
        )
        result = call.result.get("content") if isinstance(call.result, dict) else None
        took = call.finished - call.created if call.finished else None
        steps.append(
            Step(
                at,
                "tool",
                call,
                order=order,
                took=took,
                text=Text(result if isinstance(result, str) else as_json(result))
                if result is not None
                else None,
                extra={
                    "arguments": Text(as_json(call.arguments)),
                    "failed": bool(isinstance(call.result, dict) and call.result.get("is_error")),
                    "started": call.created,
                },
            )
        )
    return steps


def payload_summary(event) -> str:
    """A chat message's text; any other payload as its JSON."""
    payload = event.payload
    if event.source == "chat" and isinstance(payload, dict) and "text" in payload:
        return str(payload["text"])
    return as_json(payload)


def trace_id(traceparent: str) -> str:
    """The trace id of a W3C traceparent (version-traceid-spanid-flags), what a tracing
    backend searches by."""
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 else traceparent
