"""The operator's console for inboxes, events, leases and sessions.

Rows the machinery writes (events, leases, sessions) are view-only here: a save from a form
would write every column it loaded, over whatever a worker committed since, without the
inbox's lease lock. Operators change events through actions that call the same services as
`manage.py deadletters`, which lock the lease row and keep its work flag right.

Every list is meant to be usable at 100,000 rows: the related inbox is joined in the same
query, the unfiltered total is not counted twice, and the newest rows come first by primary
key, so page one needs no sort of the whole table.
"""

import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_permission_codename, get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, Case, Value, When
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from . import clock, services
from .extensions import inbox_admin_fields
from .models import Event, EventTrace, Inbox, Lease, Membership, Role, RunRecord, Session
from .validation import require_key

# Ids handed to a service per call: keeps `pk IN (...)` under SQLite's variable limit when
# an action runs on "all N rows matching the filter".
ACTION_CHUNK = 500
# Characters of an event's error in its list: the exception's name and the start of its
# message, in a column narrow enough to leave the list's dates in sight at 1280 px.
ERROR_EXCERPT = 60
# People are searched by their user model's login name, whatever AUTH_USER_MODEL names it.
USERNAME = get_user_model().USERNAME_FIELD


def pretty_json(value):
    """A JSON value indented in a <pre>, escaped."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return format_html('<pre style="white-space: pre-wrap">{}</pre>', text)


def excerpt(text, length=80):
    return Truncator(text).chars(length) if text else ""


def preformatted(text):
    """Text as written, indentation and line breaks kept, in a monospace block, escaped."""
    return format_html('<pre style="white-space: pre-wrap">{}</pre>', text) if text else "-"


def run_url(slug, generation) -> str | None:
    """The people's timeline of a run (alwayson/web/runs.py), by its URL's name: the inbox
    app does not import the pages above it, and a project that leaves them out gets no link."""
    try:
        return reverse("run", args=[slug, generation])
    except NoReverseMatch:
        return None


def record_history(request, model, ids, message):
    """One admin history row (LogEntry) per changed row, saying what the action did."""
    for chunk in chunks(ids):
        LogEntry.objects.log_actions(
            request.user.pk, model.objects.filter(pk__in=chunk), CHANGE, message
        )


def chunks(ids, size=ACTION_CHUNK):
    ids = list(ids)
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def deleting_inbox(request) -> bool:
    """True while the admin deletes inboxes, or the users who own them: rows of an inbox's
    machinery may only go with their inbox, and Django asks their admins before a cascade.
    """
    match = getattr(request, "resolver_match", None)
    if match is None:
        return False
    owners = (Inbox._meta, get_user_model()._meta)
    return match.view_name in {
        f"{admin.site.name}:{opts.app_label}_{opts.model_name}_{view}"
        for opts in owners
        for view in ("delete", "changelist")
    }


def has_model_perm(request, opts, action):
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


class MachineryAdmin(admin.ModelAdmin):
    """View-only rows written by the machinery; deleted only together with their inbox."""

    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return deleting_inbox(request) and super().has_delete_permission(request, obj)


class ViewOnlyAdmin(admin.ModelAdmin):
    """Rows only the code writes: listed and shown, never added or edited by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class LedgerAdmin(ViewOnlyAdmin):
    """A record that is proof of something that happened: not deleted by hand either."""

    def has_delete_permission(self, request, obj=None):
        return False


class InboxRoleMixin:
    """The admin of rows that belong to one inbox (the inbox, its members, its channel, its
    approvals and their audit), for the people of that inbox as well as for operators.

    Django's model permissions decide for operators, as everywhere: with them, every row. A
    staff user without them sees the rows of the inboxes where they have a role and nothing
    else (another inbox's row is "not found"); a manager of the inbox (its owner, or a
    member with that role) also changes them, where the model allows it.
    """

    inbox_field = "inbox"  # the foreign key from a row to its Inbox; "" on Inbox itself
    managers_may_change = True
    managers_may_add = False
    managers_may_delete = False

    def inboxes_where(self, request, role):
        return Inbox.objects.with_role(request.user, role)

    def holds_role(self, request, role, obj=None) -> bool:
        if obj is None:
            return holds_role(request.user, role)
        return holds_role(
            request.user,
            role,
            getattr(obj, f"{self.inbox_field}_id") if self.inbox_field else obj.pk,
        )

    def is_operator(self, request) -> bool:
        return has_model_perm(request, self.opts, "view") or has_model_perm(
            request, self.opts, "change"
        )

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if self.is_operator(request):
            return queryset
        lookup = f"{self.inbox_field}__in" if self.inbox_field else "pk__in"
        return queryset.filter(**{lookup: self.inboxes_where(request, Role.VIEWER)})

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == self.inbox_field and not has_model_perm(request, self.opts, "add"):
            # A manager adds rows to the inboxes they manage, and only to those.
            kwargs["queryset"] = self.inboxes_where(request, Role.MANAGER)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def has_module_permission(self, request):
        return super().has_module_permission(request) or self.holds_role(request, Role.VIEWER)

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or self.holds_role(
            request, Role.VIEWER, obj
        )

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) or (
            self.managers_may_change and self.holds_role(request, Role.MANAGER, obj)
        )

    def has_add_permission(self, request):
        return super().has_add_permission(request) or (
            self.managers_may_add and self.holds_role(request, Role.MANAGER)
        )

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) or (
            self.managers_may_delete and self.holds_role(request, Role.MANAGER, obj)
        )


def holds_role(user, role, inbox_id=None) -> bool:
    """`user` holds at least `role` in that inbox (None: in some inbox)."""
    inboxes = Inbox.objects.with_role(user, role)
    if inbox_id is not None:
        inboxes = inboxes.filter(pk=inbox_id)
    return inboxes.exists()


class MembershipInline(admin.TabularInline):
    """An inbox's members on its page: its managers add, change and remove them. (Without
    `obj` Django asks about the inline in general; the inbox's own page checked that inbox.)"""

    model = Membership
    extra = 0
    fields = ("user", "group", "role")

    def manages(self, request, obj, action) -> bool:
        return has_model_perm(request, self.opts, action) or holds_role(
            request.user, Role.MANAGER, obj.pk if obj is not None else None
        )

    def has_view_permission(self, request, obj=None):
        return self.manages(request, obj, "view") or holds_role(
            request.user, Role.VIEWER, obj.pk if obj is not None else None
        )

    def has_add_permission(self, request, obj=None):
        return self.manages(request, obj, "add")

    def has_change_permission(self, request, obj=None):
        return self.manages(request, obj, "change")

    def has_delete_permission(self, request, obj=None):
        return self.manages(request, obj, "delete")


@admin.register(Membership)
class MembershipAdmin(InboxRoleMixin, admin.ModelAdmin):
    list_display = ("inbox", "user", "group", "role")
    list_filter = ("role", ("inbox", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("inbox", "user", "group")
    search_fields = ("=inbox__slug", f"user__{USERNAME}", "group__name")
    search_help_text = "the exact inbox slug, or the user or group name (contains)"
    ordering = ("inbox__slug", "-role", "id")
    fields = ("inbox", "user", "group", "role")
    managers_may_add = True
    managers_may_delete = True


@admin.register(Inbox)
class InboxAdmin(InboxRoleMixin, admin.ModelAdmin):
    list_display = ("slug", "name", "owner", "created", "events_link", "dead_link")
    list_select_related = ("owner",)
    search_fields = ("slug", "name", f"owner__{USERNAME}")
    autocomplete_fields = ("owner",)
    readonly_fields = ("created",)
    inlines = (MembershipInline,)
    inbox_field = ""

    def get_readonly_fields(self, request, obj=None):
        # Workers, timers and the API name an inbox by its slug: renaming it breaks them.
        fields = (*self.readonly_fields, "slug") if obj else self.readonly_fields
        if not has_model_perm(request, self.opts, "change"):
            # A manager edits the inbox; who owns it is the operators' decision.
            fields = (*fields, "owner")
        return (*fields, *inbox_admin_fields.values())

    @admin.display(description="events")
    def events_link(self, obj):
        url = reverse(f"{self.admin_site.name}:inbox_event_changelist")
        return format_html('<a href="{}?inbox__id__exact={}">events</a>', url, obj.pk)

    @admin.display(description="dead")
    def dead_link(self, obj):
        url = reverse(f"{self.admin_site.name}:inbox_event_changelist")
        return format_html(
            '<a href="{}?inbox__id__exact={}&amp;status__exact=dead">dead events</a>', url, obj.pk
        )


class EventActionForm(ActionForm):
    # No max_length here: an invalid action form makes Django say "No action selected";
    # mark_dead checks the reason and says what is wrong with it.
    reason = forms.CharField(required=False, label="Reason (mark dead):")


@admin.register(Event)
class EventAdmin(MachineryAdmin):
    list_display = (
        "id",
        "inbox",
        "source",
        "source_id",
        "status",
        "attempts",
        "error_excerpt",
        "available_at",
        "created",
    )
    list_display_links = ("id", "source_id")
    list_filter = ("status", "source", "inbox")
    list_select_related = ("inbox",)
    search_fields = ("source_id", "=inbox__slug")
    search_help_text = "source_id (contains) or the exact inbox slug"
    date_hierarchy = "created"
    ordering = ("-id",)
    fields = (
        "inbox",
        "source",
        "source_id",
        "status",
        "attempts",
        "claim_gen",
        "error_block",
        "available_at",
        "created",
        "updated",
        "payload_pretty",
    )
    readonly_fields = fields
    action_form = EventActionForm
    actions = ("requeue", "mark_dead")

    @admin.display(description="error")
    def error_excerpt(self, obj):
        # A traceback's first line says only that it is one: its last names the exception.
        # The whole of it is on the event's page.
        return excerpt(obj.error_line, ERROR_EXCERPT)

    @admin.display(description="error")
    def error_block(self, obj):
        # A traceback reads by its indentation: kept, not folded into one paragraph.
        return preformatted(obj.error)

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return pretty_json(obj.payload)

    def has_operate_permission(self, request):
        # The event pages are view-only; running the actions takes the change permission.
        return has_model_perm(request, self.opts, "change")

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "<path:object_id>/requeue/",
                self.admin_site.admin_view(self.requeue_view),
                name="{}_{}_requeue".format(*info),
            ),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # The Requeue button: on a dead event's own page, for those who may run the action.
        event = self.get_object(request, unquote(object_id))
        requeue_url = None
        dead = event is not None and event.status == Event.Status.DEAD
        if dead and self.has_operate_permission(request):
            requeue_url = reverse(
                f"{self.admin_site.name}:inbox_event_requeue", args=[quote(event.pk)]
            )
        extra_context = {
            **(extra_context or {}),
            "requeue_url": requeue_url,
            "run_url": self.last_run_url(event),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def last_run_url(self, event):
        """The timeline of the run that last claimed the event (a dead one: the run it died
        in), when a record of it is kept."""
        if event is None or event.claim_gen is None:
            return None
        ran = RunRecord.objects.filter(inbox_id=event.inbox_id, generation=event.claim_gen)
        return run_url(event.inbox.slug, event.claim_gen) if ran.exists() else None

    def requeue_view(self, request, object_id):
        """The change page's Requeue button: the list action, on this one event."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied
        event = self.get_object(request, unquote(object_id))
        if event is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        self.requeue(request, Event.objects.filter(pk=event.pk))
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:inbox_event_change", args=[quote(event.pk)])
        )

    @admin.action(description="Requeue selected dead events", permissions=["operate"])
    def requeue(self, request, queryset):
        selected = queryset.count()
        ids = list(queryset.dead().values_list("pk", flat=True))
        requeued = [pk for chunk in chunks(ids) for pk in services.requeue(chunk)]
        record_history(request, Event, requeued, "Requeued: back to pending, attempts reset.")
        self.report(request, selected, len(requeued), "requeued (back to pending, attempts reset)")

    @admin.action(description="Mark selected pending events dead", permissions=["operate"])
    def mark_dead(self, request, queryset):
        reason = request.POST.get("reason", "").strip()
        if not reason:
            reason = f"marked dead in the admin by {request.user.get_username()}"
        try:
            require_key("reason", reason)
        except ValueError as exc:
            self.message_user(request, f"Nothing marked dead: {exc}.", messages.ERROR)
            return
        selected = queryset.count()
        ids = list(queryset.pending().values_list("pk", flat=True))
        parked = [pk for chunk in chunks(ids) for pk in services.mark_dead(chunk, reason)]
        record_history(request, Event, parked, f"Marked dead: {reason}")
        self.report(request, selected, len(parked), f"marked dead ({reason})")

    def report(self, request, selected, changed, what):
        # Counted before the change: a selection made through a status filter no longer
        # matches the rows the action moved.
        left = selected - changed
        text = f"{changed} event(s) {what}."
        if left:
            text += f" {left} selected event(s) were in another state and left alone."
        self.message_user(request, text, messages.SUCCESS if changed else messages.WARNING)


class HeldFilter(admin.SimpleListFilter):
    title = "held now"
    parameter_name = "held"

    def lookups(self, request, model_admin):
        return (("yes", "held"), ("no", "free"))

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(held_now=self.value() == "yes")
        return queryset


@admin.register(Lease)
class LeaseAdmin(MachineryAdmin):
    """Who runs each inbox's agent. Read-only: only acquire/renew/release move a lease."""

    list_display = ("inbox", "held_now", "holder", "generation", "until", "work_at")
    list_filter = (HeldFilter,)
    list_select_related = ("inbox",)
    search_fields = ("=inbox__slug", "holder")
    search_help_text = "the exact inbox slug, or the holder (contains)"
    ordering = ("inbox_id",)
    fields = ("inbox", "held_now", "holder", "generation", "until", "work_at")
    readonly_fields = fields

    def get_queryset(self, request):
        # Held means until > now on the database's clock, the one acquire() compares with.
        now = clock.database_now()
        return (
            super()
            .get_queryset(request)
            .annotate(
                held_now=Case(
                    When(until__gt=Value(now), then=Value(True)),
                    default=Value(False),
                    output_field=BooleanField(),
                )
            )
        )

    @admin.display(description="held now", boolean=True, ordering="held_now")
    def held_now(self, obj):
        return obj.held_now


@admin.register(Session)
class SessionAdmin(MachineryAdmin):
    """The agent's state per inbox. Read-only: only a fenced finish replaces it."""

    list_display = ("inbox", "updated", "state_excerpt")
    list_select_related = ("inbox",)
    search_fields = ("=inbox__slug",)
    search_help_text = "the exact inbox slug"
    ordering = ("inbox_id",)
    fields = ("inbox", "updated", "state_pretty")
    readonly_fields = fields

    @admin.display(description="state")
    def state_excerpt(self, obj):
        return excerpt(json.dumps(obj.state, ensure_ascii=False, sort_keys=True))

    @admin.display(description="state")
    def state_pretty(self, obj):
        return pretty_json(obj.state)


@admin.register(EventTrace)
class EventTraceAdmin(MachineryAdmin):
    """The trace context each event was stored under (tracing on): which trace to open in
    the tracing backend for an event. Written by ingest, gone with its event."""

    list_display = ("event", "traceparent")
    list_select_related = ("event",)
    search_fields = ("=traceparent",)
    search_help_text = "the exact traceparent"
    ordering = ("-event_id",)
    fields = ("event", "traceparent")
    readonly_fields = fields


@admin.register(RunRecord)
class RunRecordAdmin(MachineryAdmin):
    """What each run did. Only a finish or a take writes it; nobody adds or edits one, and it
    goes only with its inbox (a ledger's no-delete would block deleting the inbox)."""

    list_display = ("inbox", "generation", "worker", "outcome", "started", "duration")
    list_filter = ("outcome", "inbox")
    list_select_related = ("inbox",)
    search_fields = ("=inbox__slug", "worker")
    search_help_text = "the exact inbox slug, or the worker (contains)"
    ordering = ("-id",)
    fields = (
        "inbox",
        "generation",
        "worker",
        "outcome",
        "started",
        "ended",
        "duration",
        "waiting_since",
        "events",
        "produced_pretty",
        "trace",
        "error_block",
        "timeline",
    )
    readonly_fields = fields

    @admin.display(description="timeline")
    def timeline(self, obj):
        url = run_url(obj.inbox.slug, obj.generation)
        return format_html('<a href="{}">what the run did</a>', url) if url else "-"

    @admin.display(description="duration")
    def duration(self, obj):
        return obj.ended - obj.started

    @admin.display(description="produced")
    def produced_pretty(self, obj):
        return pretty_json(obj.produced)

    @admin.display(description="error")
    def error_block(self, obj):
        return preformatted(obj.error)
