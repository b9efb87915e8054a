"""The outbox in the operator's console.

The dispatcher owns a message's status, sent time, attempts, error and send key, and a
channel's failure count, backoff and last error: those are read-only. A held message's body
and urgency may be edited until its send is first attempted (a retry must carry the body the
receiver may already have under that key); after that it is history. Parked sends go back to
held, whole and under their keys, through the same service as `deadletters --resend`.
"""

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db import models

from inbox.admin import (
    InboxRoleMixin,
    MachineryAdmin,
    chunks,
    excerpt,
    has_model_perm,
    preformatted,
    record_history,
)

from . import services
from .models import Channel, Notice, OutboxMessage


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "inbox",
        "body_excerpt",
        "urgent",
        "status",
        "created",
        "sent_at",
        "attempts",
        "error_excerpt",
        "send_key",
    )
    list_filter = ("status", "urgent", "inbox")
    list_select_related = ("inbox",)
    # A receiver reports the key it got: "=send_key" finds that send's messages.
    search_fields = ("=inbox__slug", "=send_key", "body")
    search_help_text = "the exact inbox slug or send key, or the body (contains)"
    date_hierarchy = "created"
    ordering = ("-id",)
    show_full_result_count = False
    fields = (
        "inbox",
        "body",
        "urgent",
        "status",
        "created",
        "sent_at",
        "attempts",
        "error_block",
        "send_key",
    )
    readonly_fields = (
        "inbox",
        "status",
        "created",
        "sent_at",
        "attempts",
        "error_block",
        "send_key",
    )
    actions = ("resend",)

    @admin.display(description="body")
    def body_excerpt(self, obj):
        return excerpt(obj.body)

    @admin.display(description="error")
    def error_excerpt(self, obj):
        return excerpt(obj.error)

    @admin.display(description="error")
    def error_block(self, obj):
        return preformatted(obj.error)

    def has_add_permission(self, request):
        # Messages are what the agent says, written by a run's finish.
        return False

    def has_change_permission(self, request, obj=None):
        editable = obj is None or (obj.status == OutboxMessage.Status.HELD and not obj.send_key)
        return editable and super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        # Only the edited columns, and only while held and not yet in a send: a full save
        # would write the status and attempts loaded with the form over the dispatcher's.
        changed = {name: getattr(obj, name) for name in form.changed_data}
        if not changed:
            return
        updated = OutboxMessage.objects.held().filter(pk=obj.pk, send_key="").update(**changed)
        if not updated:
            self.message_user(
                request,
                "The message went into a send while you edited it; nothing was changed.",
                messages.WARNING,
            )

    @admin.action(description="Resend selected failed messages", permissions=["change"])
    def resend(self, request, queryset):
        selected = queryset.count()  # before: a status filter stops matching the resent
        ids = list(queryset.failed().values_list("pk", flat=True))
        put_back = [pk for chunk in chunks(ids) for pk in services.resend(chunk)]
        record_history(
            request, OutboxMessage, put_back, "Resent: back to held, attempts reset, same send key."
        )
        resent = len(put_back)
        text = f"{resent} message(s) put back in the outbox (held, attempts reset)."
        if resent > len(ids):
            text += (
                f" {resent - len(ids)} of them were not selected: they were parked in the same"
                " send(s) as selected ones, and go again with them under the same key."
            )
        left = selected - len(ids)
        if left:
            text += f" {left} selected message(s) had not failed and were left alone."
        self.message_user(request, text, messages.SUCCESS if resent else messages.WARNING)


@admin.register(Channel)
class ChannelAdmin(InboxRoleMixin, admin.ModelAdmin):
    """Operators edit every channel; an inbox's managers edit theirs."""

    managers_may_add = True
    list_display = (
        "inbox",
        "kind",
        "destination",
        "mode",
        "gap",
        "failures",
        "retry_at",
        "last_error_excerpt",
    )
    list_filter = ("kind", "mode")
    list_select_related = ("inbox__owner",)
    search_fields = ("=inbox__slug", "email", "url", "=target")
    search_help_text = "the exact inbox slug or chat id, the email address or the URL (contains)"
    autocomplete_fields = ("inbox",)
    ordering = ("inbox_id",)
    show_full_result_count = False
    readonly_fields = ("failures", "retry_at", "last_error")
    # Django 6's default; say it now, so 5.2 doesn't warn.
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def get_readonly_fields(self, request, obj=None):
        # A channel belongs to one inbox for good.
        return ("inbox", *self.readonly_fields) if obj else self.readonly_fields

    @admin.display(description="to")
    def destination(self, obj):
        if obj.kind == Channel.Kind.WEBHOOK:
            return obj.url
        if obj.kind in (Channel.Kind.SLACK, Channel.Kind.TELEGRAM):
            return obj.target
        return obj.email or f"{obj.inbox.owner.email or '-'} (owner)"

    @admin.display(description="last error")
    def last_error_excerpt(self, obj):
        return excerpt(obj.last_error)

    def save_model(self, request, obj, form, change):
        if change:
            # The dispatcher writes failures, retry_at and last_error under this row's lock;
            # save only what the operator edited.
            if form.changed_data:
                obj.save(update_fields=form.changed_data)
        else:
            obj.save()


@admin.register(Notice)
class NoticeAdmin(MachineryAdmin):
    """Emails to approvers, one per approval and person. Written by the approval's request
    and the dispatcher; parked ones go back through the same service as a resend."""

    list_display = (
        "id",
        "inbox",
        "recipient",
        "topic",
        "status",
        "attempts",
        "due_at",
        "sent_at",
        "sent_to",
        "error_excerpt",
    )
    list_filter = ("status", ("inbox", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("inbox", "recipient")
    search_fields = (
        "=inbox__slug",
        "=key",
        "topic",
        f"recipient__{get_user_model().USERNAME_FIELD}",
    )
    search_help_text = "the exact inbox slug or key (the Message-ID), the topic or the user"
    date_hierarchy = "created"
    ordering = ("-id",)
    fields = (
        "inbox",
        "recipient",
        "topic",
        "key",
        "subject",
        "body",
        "status",
        "created",
        "due_at",
        "sent_at",
        "sent_to",
        "attempts",
        "error_block",
    )
    readonly_fields = fields
    actions = ("resend",)

    @admin.display(description="error")
    def error_excerpt(self, obj):
        return excerpt(obj.error)

    @admin.display(description="error")
    def error_block(self, obj):
        return preformatted(obj.error)

    def has_operate_permission(self, request):
        return has_model_perm(request, self.opts, "change")

    @admin.action(description="Resend selected failed notices", permissions=["operate"])
    def resend(self, request, queryset):
        selected = queryset.count()
        ids = list(queryset.failed().values_list("pk", flat=True))
        put_back = [pk for chunk in chunks(ids) for pk in services.resend_notices(chunk)]
        record_history(
            request, Notice, put_back, "Resent: back to held, attempts reset, same Message-ID."
        )
        resent = len(put_back)
        text = f"{resent} notice(s) put back (held, attempts reset), each under its Message-ID."
        if selected - resent:
            text += f" {selected - resent} selected notice(s) had not failed and were left alone."
        self.message_user(request, text, messages.SUCCESS if resent else messages.WARNING)
