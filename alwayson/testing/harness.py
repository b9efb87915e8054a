"""The harness: inboxes for a test, deliveries, the product's own loops, time travel, answers,
and what happened, read in the domain's words.

    with Harness() as harness:                     # or the `harness` pytest fixture
        desk = harness.inbox("desk", agent="myapp.agent.agent")
        desk.chat("refund order 881")
        harness.run_until_idle()                    # the worker, scheduler and dispatcher
        [approval] = desk.waiting_for_approval()
        harness.answer(approval, "yes")
        harness.run_until_idle()
        assert desk.said()[-1] == "Refunded order 881"
        harness.advance(hours=4)                    # timers fire, approvals expire

Nothing here reimplements the product: deliveries go through the chat form's function and
the webhook endpoints, runs through `Worker.step()` and the `runscheduler` and
`rundispatcher` commands' `step()`, answers through `answer_approval`, and every one of
them reads the harness's clock.
"""

import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Min
from django.test import Client
from django.urls import reverse

from alwayson.claude.models import MemoryFile, MemoryVersion, ModelCall, ModelSettings, ToolResult
from alwayson.claude.session import STATE_KEY, ClaudeSession
from alwayson.runtime.loading import load_agent
from alwayson.runtime.management.commands import rundispatcher, runscheduler
from alwayson.runtime.models import AgentConfig
from alwayson.runtime.tools import BUILTINS
from alwayson.runtime.worker import StepResult, Worker
from alwayson.web.chat import post_chat
from approvals.models import Approval
from approvals.services import answer_approval
from inbox import webhooks
from inbox.models import Event, Inbox, Lease, Membership, Role, RunRecord, Session
from inbox.services import ingest
from outbox.models import Channel, Notice, OutboxMessage
from timers.models import RESERVED_KEY_PREFIX, Timer

from . import senders
from .clock import Clock, duration

#: Runs, scheduler passes and dispatcher passes one `run_until_idle` may take: past it, the
#: agent is taken to be in a loop (a timer every second, a run that always has more work).
MAX_STEPS = 1000
#: Instants one `advance` may stop at, each with its own `run_until_idle`.
MAX_STOPS = 1000
# The keywords of inbox() that are the Claude agent's ModelSettings, not its AgentConfig.
MODEL_SETTINGS = ("max_tokens", "temperature", "thinking_budget", "tool_choice")

ALLOWED, ASKED, DENIED, REFUSED, UNANSWERED = "allowed", "asked", "denied", "refused", "unanswered"


@dataclass(frozen=True)
class MemoryFileSeen:
    """A memory file of the Claude agent: its content, whether it is marked untrusted, and
    its versions as (action, run generation or None, person's username or None)."""

    path: str
    content: str
    untrusted: bool
    versions: tuple


class AgentError(AssertionError):
    """A run ended with an error (the agent raised): its traceback, as stored on the events.
    `run_until_idle(raise_errors=False)` leaves it to the retries instead, as production does."""


class NotIdle(AssertionError):
    """The loops still had work after MAX_STEPS steps, or `advance` after MAX_STOPS stops."""


@dataclass(frozen=True)
class Message:
    """Something the agent said: held for the outbox's gap, sent, or failed."""

    text: str
    urgent: bool
    status: str
    sent_at: datetime | None


@dataclass(frozen=True)
class Delivery:
    """One send of the dispatcher: the messages it merged, on the inbox's channel."""

    channel: str  # "email", "webhook", "slack", "telegram"
    to: str  # the address, URL or chat the channel names
    text: str
    at: datetime


@dataclass(frozen=True)
class SetTimer:
    key: str
    due: datetime
    payload: dict
    every: int | None
    cron: str


@dataclass(frozen=True)
class ToolCallSeen:
    """A tool call the model made, and what became of it: "allowed" (it ran), "asked" (it
    waited for a person), "denied" (by the policy), "refused" (no such tool, or input its
    schema refuses) or "unanswered" (the run has not given the model its result yet)."""

    tool: str
    input: dict
    verdict: str
    id: str


class Harness:
    """Start it (`with Harness() as harness:`, or the `harness` fixture) inside a test's
    database transaction; it pins the clock until it stops.

    `agent` runs every inbox without an agent of its own (default: ALWAYSON_AGENT), a
    callable or its dotted path. `start` is the clock's first instant (default: the
    database's clock). `model`: the ScriptedModel whose requests `tool_calls()` reads.
    """

    def __init__(self, agent=None, *, start: datetime | None = None, model=None):
        self.clock = Clock(start)
        self.model = model
        self.runs: list[StepResult] = []
        self._agent = agent
        self._added_secrets: list[tuple[dict, str, str]] = []
        self._users = 0

    # --- start and stop ---------------------------------------------------------------------

    def start(self) -> "Harness":
        agent = load_agent(self._agent, field="agent") if isinstance(self._agent, str) else None
        self.worker = Worker("alwayson-testing", agent or self._agent)
        self.scheduler = runscheduler.Command()
        self.dispatcher = rundispatcher.Command()
        self.clock.start()
        return self

    def stop(self):
        for table, slug, scheme in self._added_secrets:
            schemes = table.get(slug, {})
            schemes.pop(scheme, None)
            if not schemes:
                table.pop(slug, None)
        self._added_secrets.clear()
        self.clock.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def now(self) -> datetime:
        return self.clock.now

    # --- people and inboxes -----------------------------------------------------------------

    def person(self, username: str | None = None, **fields):
        """A user (with an email address, so the outbox and notices reach them).

        `username` names them whatever the user model logs in by: on a model whose
        USERNAME_FIELD is its email field, "dana" logs in as dana@example.com.
        """
        self._users += 1
        username = username or f"person-{self._users}"
        model = get_user_model()
        email_field = model.get_email_field_name()
        fields.setdefault(email_field, f"{username}@example.com")
        if email_field != model.USERNAME_FIELD:
            fields[model.USERNAME_FIELD] = username
        return model.objects.create_user(**fields)

    def inbox(
        self, slug: str = "desk", *, agent=None, owner=None, channel: dict | None = None, **config
    ) -> "AgentInbox":
        """A new inbox, owned by `owner` (a new person by default).

        `agent`: its own agent (a dotted path, or a module-level callable), stored as its
        AgentConfig with `config` (tools, policy, model, system_prompt, daily_token_budget,
        approval_window; and the Claude agent's ModelSettings: max_tokens, temperature,
        thinking_budget, tool_choice), checked as the admin checks it. `channel`: fields of
        its outbox channel (default: email to the owner).
        """
        owner = owner or self.person(f"{slug}-owner")
        inbox = Inbox.objects.create(owner=owner, slug=slug)
        sent = {name: config.pop(name) for name in MODEL_SETTINGS if name in config}
        if agent is not None or config or sent:
            row = AgentConfig(inbox=inbox, agent=_dotted_path(agent) if agent else "", **config)
            row.full_clean()
            with transaction.atomic():
                row.save()
                if sent:
                    settings_row = ModelSettings(config=row, **sent)
                    settings_row.full_clean()
                    settings_row.save()
                    row.revise(now=self.now)
        if channel:
            Channel.objects.update_or_create(inbox=inbox, defaults=channel)
        return AgentInbox(self, inbox)

    # --- the loops --------------------------------------------------------------------------

    def run_until_idle(self, *, raise_errors: bool = True) -> list[StepResult]:
        """Step the worker, the scheduler and the dispatcher, the commands' own steps, until
        none of them has anything due at the clock's instant. The runs it made; with
        `raise_errors`, AgentError for the first run that ended with an error."""
        runs, steps = [], 0
        while True:
            busy = False
            while (result := self.worker.step()) is not None:
                steps = self._count(steps)
                busy = True
                if not result.ran:
                    continue  # a lease taken whose claim found nothing (its events parked)
                self.runs.append(result)
                runs.append(result)
                if raise_errors and result.recorded == RunRecord.Outcome.ERROR:
                    raise AgentError(_failure(result))
            for loop in (self.scheduler, self.dispatcher):
                if loop.step():
                    steps = self._count(steps)
                    busy = True
            if not busy:
                return runs

    def advance(self, delta=None, /, *, raise_errors: bool = True, **units) -> list[StepResult]:
        """Let time pass: move the clock forward by `delta` (or hours=4, minutes=30, ...),
        stopping at each instant something falls due on the way (a timer, an approval's
        expiry, an event's backoff, the end of the outbox's gap, a lease that lapses) and
        running until idle there, then at the end. No sleeping. The runs it made."""
        target = self.clock.now + duration(delta, **units)
        runs = self.run_until_idle(raise_errors=raise_errors)
        for _ in range(MAX_STOPS):
            due = next_due(after=self.clock.now)
            if due is None or due > target:
                self.clock.travel_to(target)
                return runs + self.run_until_idle(raise_errors=raise_errors)
            self.clock.travel_to(due)
            runs += self.run_until_idle(raise_errors=raise_errors)
        raise NotIdle(
            f"something fell due {MAX_STOPS} times before {target}: a timer every few seconds? "
            "Move the clock with harness.clock.jump(...) to skip the way."
        )

    def _count(self, steps):
        if steps + 1 > MAX_STEPS:
            raise NotIdle(f"still busy after {MAX_STEPS} steps at {self.clock.now}: a loop?")
        return steps + 1

    # --- answers ----------------------------------------------------------------------------

    def answer(self, approval: Approval, answer: str, *, by=None) -> str:
        """Answer through `answer_approval`, as the approval page does: by `by` (default: the
        inbox's owner). The outcome that stands: "yes", "no", "expired", "waiting" (a
        two-person request with one yes) or "unknown"."""
        if not isinstance(approval, Approval):
            raise ValueError(
                f"approval must be an Approval (see waiting_for_approval()), not {approval!r}"
            )
        if by is None:
            by = Inbox.objects.select_related("owner").get(pk=approval.inbox_id).owner
        answered = answer_approval(approval.inbox_id, approval.request_id, answer, by=by)
        return answered.stands

    # --- for AgentInbox ---------------------------------------------------------------------

    def _secret(self, slug, scheme) -> str:
        """The secret that signs `scheme` deliveries to `slug`: the configured one, else a
        test secret configured for this inbox until the harness stops."""
        configured = webhooks.secrets_for(
            slug,
            scheme,
            getattr(settings, f"ALWAYSON_{scheme.upper()}_SECRETS"),
            settings.ALWAYSON_WEBHOOK_INBOX_SECRETS,
        )
        if configured:
            return configured[0]
        table = settings.ALWAYSON_WEBHOOK_INBOX_SECRETS
        table.setdefault(slug, {})[scheme] = [senders.TEST_SECRETS[scheme]]
        self._added_secrets.append((table, slug, scheme))
        return senders.TEST_SECRETS[scheme]


class AgentInbox:
    """One inbox of the test: deliver to it, answer its approvals, read what it did."""

    def __init__(self, harness: Harness, inbox: Inbox):
        self.harness = harness
        self.inbox = inbox

    def __repr__(self):
        return f"<AgentInbox {self.slug}>"

    @property
    def slug(self) -> str:
        return self.inbox.slug

    @property
    def owner(self):
        return self.inbox.owner

    def member(self, username: str | None = None, role: str = "approver", **fields):
        """A new person with `role` ("viewer", "approver" or "manager") in this inbox."""
        user = self.harness.person(username, **fields)
        Membership.objects.create(inbox=self.inbox, user=user, role=Role[role.upper()])
        return user

    # --- deliveries -------------------------------------------------------------------------

    def chat(self, text: str, *, by=None, message_id=None) -> bool:
        """A chat message from `by` (default: the owner), stored as the inbox page's form
        stores it. False when `message_id` was delivered already."""
        return post_chat(self.inbox, message_id or uuid.uuid4(), text, by or self.owner)

    def deliver(self, source: str, key: str, payload: dict | None = None) -> bool:
        """A plain event under its source's key (`ingest`); False for a duplicate."""
        return ingest(self.inbox, source, key, payload or {})

    def webhook(
        self,
        scheme: str,
        body,
        *,
        event: str = "push",
        delivery_id: str | None = None,
        secret: str | None = None,
        check: bool = True,
    ):
        """POST `body` (JSON-able, or bytes) to the inbox's `scheme` endpoint ("github",
        "stripe", "standard") signed as that sender signs, with `secret` (default: the one
        configured for the inbox, or a test secret configured for it). GitHub: `event` is
        X-GitHub-Event; `delivery_id` is GitHub's delivery id or Standard's webhook-id (a
        new one by default); Stripe keys the event by the body's "id". The response; with
        `check`, AssertionError with the endpoint's reason unless it was accepted."""
        if scheme not in webhooks.SCHEMES:
            raise ValueError(f"scheme must be one of {webhooks.SCHEMES}, not {scheme!r}")
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        # The inbox's secret is configured either way: one given here signs a delivery its
        # endpoint should refuse.
        configured = self.harness._secret(self.slug, scheme)
        secret = secret or configured
        delivery_id = delivery_id or uuid.uuid4().hex
        now = self.harness.now
        if scheme == "github":
            headers = senders.github_headers(
                raw, secret, event=event, delivery=delivery_id, hook_id="1"
            )
        elif scheme == "stripe":
            headers = senders.stripe_headers(raw, secret, at=now)
        else:
            headers = senders.standard_headers(raw, secret, msg_id=delivery_id, at=now)
        path = reverse(f"inbox:{scheme}", kwargs={"slug": self.slug})
        response = Client().post(path, data=raw, content_type="application/json", headers=headers)
        if check and response.status_code >= 400:
            reason = response.json().get("error") if response.content else ""
            raise AssertionError(
                f"the {scheme} webhook to {self.slug} was refused ({response.status_code}): "
                f"{reason}"
            )
        return response

    # --- answers ----------------------------------------------------------------------------

    def answer(self, request_id: str, answer: str, *, by=None) -> str:
        """Answer this inbox's approval `request_id` (Harness.answer)."""
        approval = Approval.objects.get(inbox=self.inbox, request_id=request_id)
        return self.harness.answer(approval, answer, by=by)

    # --- what happened ----------------------------------------------------------------------

    def said(self) -> list[str]:
        """Every message the agent said, oldest first, sent or still held for the gap."""
        return [message.text for message in self.messages()]

    def messages(self) -> list[Message]:
        rows = OutboxMessage.objects.filter(inbox=self.inbox).order_by("id")
        return [Message(m.body, m.urgent, m.status, m.sent_at) for m in rows]

    def sent(self) -> list[Delivery]:
        """What the dispatcher sent, one Delivery per send, oldest first, on the inbox's
        channel as it is now."""
        channel = Channel.objects.select_related("inbox__owner").filter(inbox=self.inbox).first()
        kind, to = _destination(channel, self.inbox)
        rows = OutboxMessage.objects.filter(inbox=self.inbox).sent().order_by("id")
        sends: dict[str, list[OutboxMessage]] = {}
        for row in rows:
            sends.setdefault(row.send_key or str(row.pk), []).append(row)
        return [
            Delivery(kind, to, "\n\n".join(m.body for m in batch), batch[0].sent_at)
            for batch in sends.values()
        ]

    def waiting_for_approval(self) -> list[Approval]:
        """The approvals a person may still answer at the clock's instant, oldest first."""
        return list(
            Approval.objects.filter(inbox=self.inbox).waiting(self.harness.now).order_by("id")
        )

    def approvals(self) -> list[Approval]:
        return list(Approval.objects.filter(inbox=self.inbox).order_by("id"))

    def timers(self, *, expiries: bool = False) -> list[SetTimer]:
        """The timers set and not yet done, soonest first; with `expiries`, the approvals'
        expiry timers too."""
        timers = Timer.objects.filter(inbox=self.inbox, done=False).order_by("due", "id")
        if not expiries:
            timers = timers.exclude(key__startswith=RESERVED_KEY_PREFIX)
        return [SetTimer(t.key, t.due, t.payload, t.every, t.cron) for t in timers]

    def events(self, source: str | None = None) -> list[Event]:
        events = Event.objects.filter(inbox=self.inbox).order_by("id")
        return list(events.filter(source=source) if source else events)

    @property
    def state(self) -> dict:
        """The session state the last finished run saved (`run.state`)."""
        return Session.objects.get(inbox=self.inbox).state or {}

    def memory(self) -> dict[str, str]:
        """The Claude agent's memory as committed: path -> content, by path."""
        files = MemoryFile.objects.filter(inbox=self.inbox).order_by("path")
        return dict(files.values_list("path", "content"))

    def memory_files(self) -> list["MemoryFileSeen"]:
        """The memory files as committed, by path, with their untrusted mark and history
        (who or which run wrote each version, oldest first)."""
        versions = {}
        for version in MemoryVersion.objects.filter(inbox=self.inbox).order_by("id"):
            who = version.person.get_username() if version.person_id else None
            versions.setdefault(version.path, []).append((version.action, version.generation, who))
        return [
            MemoryFileSeen(f.path, f.content, f.untrusted, tuple(versions.get(f.path, ())))
            for f in MemoryFile.objects.filter(inbox=self.inbox).order_by("path")
        ]

    def tool_calls(self) -> list[ToolCallSeen]:
        """Every tool call the model made for this inbox (the Claude agent), oldest first,
        and what became of it. The model's answers are read from ModelCall, what ran from
        the tools' journal (ToolResult), what asked from the approvals, and the results
        from the scripted model's requests and the session."""
        approvals = list(Approval.objects.filter(inbox=self.inbox).values("request_id", "details"))
        # Matched by tool and arguments, not by key: how a call's key is made is the runner's.
        ran = list(ToolResult.objects.filter(inbox=self.inbox).values_list("tool", "arguments"))
        results = self._tool_results()
        seen = []
        for call in ModelCall.objects.filter(inbox=self.inbox).order_by("id"):
            for block in call.response.get("content") or []:
                if block.get("type") != "tool_use":
                    continue
                name, call_id = block["name"], block["id"]
                if any(
                    a["details"].get("tool") == name and call_id in a["request_id"]
                    for a in approvals
                ):
                    verdict = ASKED
                else:
                    ran_here = (name, block.get("input") or {}) in ran
                    verdict = _verdict(name, results.get(call_id), ran_here)
                seen.append(ToolCallSeen(name, block.get("input") or {}, verdict, call_id))
        return seen

    def _tool_results(self) -> dict[str, dict]:
        """The first tool_result block given for each tool-use id: in the scripted model's
        requests (the first is whole: the transcript's bound drops old results' content
        later), then in the session (the transcript, and the results a call that asks
        holds back until it is answered)."""
        conversations = []
        if self.harness.model is not None:
            requests = self.harness.model.messages_requests
            conversations += [r.body.get("messages") or [] for r in requests if r.body]
        session = ClaudeSession.from_state(self.state.get(STATE_KEY))
        conversations.append([message for run in session.runs for message in run])
        held_back = session.turn.results if session.turn is not None else []
        conversations.append([{"role": "user", "content": held_back}])
        found = {}
        for messages in conversations:
            for message in messages:
                content = message.get("content")
                if message.get("role") != "user" or not isinstance(content, list):
                    continue
                for block in content:
                    if block.get("type") == "tool_result":
                        found.setdefault(block["tool_use_id"], block)
        return found


def next_due(after: datetime) -> datetime | None:
    """The first instant after `after` at which some loop has something to do."""
    instants = [
        Timer.objects.filter(done=False, due__gt=after).aggregate(at=Min("due"))["at"],
        Lease.objects.filter(work_at__gt=after).aggregate(at=Min("work_at"))["at"],
        Lease.objects.filter(until__gt=after).aggregate(at=Min("until"))["at"],
        Notice.objects.held().filter(due_at__gt=after).aggregate(at=Min("due_at"))["at"],
    ]
    for inbox_id in OutboxMessage.objects.inboxes_with_held():
        channel = Channel.objects.filter(pk=inbox_id).first() or Channel(inbox_id=inbox_id)
        if channel.retry_at and channel.retry_at > after:
            instants.append(channel.retry_at)
        last = OutboxMessage.objects.filter(inbox_id=inbox_id).last_sent_at()
        if last is not None:
            gap_over = last + duration(channel.gap_seconds)
            if gap_over > after:
                instants.append(gap_over)
    return min((at for at in instants if at is not None), default=None)


def _verdict(name, result, ran) -> str:
    if result is None:
        return UNANSWERED
    if not result.get("is_error"):
        return ALLOWED
    # The runner's wording for a call the policy denied (alwayson/claude/runner.py).
    if str(result.get("content", "")).startswith("Denied by policy"):
        return DENIED
    # An error after the policy let it run: a ToolError of an application tool (journaled,
    # so `ran`), or a built-in's own (a timer it could not set).
    return ALLOWED if ran or name in BUILTINS else REFUSED


def _destination(channel, inbox) -> tuple[str, str]:
    if channel is None:
        return Channel.Kind.EMAIL.value, inbox.owner.email
    if channel.kind == Channel.Kind.EMAIL:
        return channel.kind, channel.email or inbox.owner.email
    if channel.kind == Channel.Kind.WEBHOOK:
        return channel.kind, channel.url
    return channel.kind, channel.target


def _failure(result: StepResult) -> str:
    failed = (
        Event.objects.filter(inbox__slug=result.inbox).exclude(error="").order_by("-updated", "-id")
    )
    error = failed.values_list("error", flat=True).first() or result.detail
    return f"the agent of {result.inbox} failed (run {result.generation}):\n{error}"


def _dotted_path(agent) -> str:
    """An agent's dotted path: as given, or a module-level callable's own."""
    if isinstance(agent, str):
        return agent
    path = f"{getattr(agent, '__module__', '')}.{getattr(agent, '__qualname__', '')}"
    try:
        found = load_agent(path, field="agent")
    except ValueError:
        found = None
    if found is not agent:
        raise ValueError(f"agent: {agent!r} cannot be named by a dotted path; pass its path")
    return path
