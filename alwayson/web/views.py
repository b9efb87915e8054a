"""The people's pages: their inboxes, and one inbox's conversation and chat form; and the
throttles' answers on login and password reset.

Who sees what is the inbox's roles: any role sees the conversation, approvers and managers
also write to the agent. Anyone else gets the same 404 as for an inbox that does not exist.
"""

import math
import uuid

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseRedirect
from django.middleware.csrf import get_token
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.http import require_http_methods

from alwayson.web import conversation, runs
from alwayson.web import live as live_updates
from alwayson.web.chat import post_chat
from alwayson.web.models import PasswordResetRequest
from approvals.models import may_answer
from inbox import clock
from inbox.exceptions import InboxBusy
from inbox.models import Inbox, Role

# The one 404 of a page of an inbox, for one that does not exist and one the user has no role in.
NO_INBOX = "No inbox matches the given query."
BUSY = "Your agent's inbox is busy right now and nothing was stored. Please send it again."
READ_ONLY = (
    "You can read this conversation but not write to the agent: you are a viewer of this"
    " inbox. Writing takes the approver role, which a manager of the inbox can give you."
)


class ChatForm(forms.Form):
    # Generated when the page is rendered and used as the event's source_id, so a double
    # submit or a browser resend of the same form is one event.
    message_id = forms.UUIDField(widget=forms.HiddenInput)
    text = forms.CharField(
        label="Message to your agent", max_length=2000, widget=forms.Textarea(attrs={"rows": 3})
    )


def favicon(request):
    """/favicon.ico, which a browser asks for of a response that names no icon (/healthz's
    JSON; the pages name theirs): the pages' icon, rather than a 404 logged for each. Not
    permanent: the icon's collected name changes with its content."""
    return HttpResponseRedirect(static("alwayson/favicon.svg"))


@login_required
def home(request):
    inboxes = list(Inbox.objects.with_role(request.user))
    for inbox in inboxes:
        inbox.role = inbox.role_of(request.user)
    return render(request, "alwayson/home.html", {"inboxes": inboxes})


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def inbox_page(request, slug):
    # One query for the inbox and the user's role in it; the role answers every check below.
    try:
        inbox = Inbox.objects.get_with_role(request.user, slug)
    except Inbox.DoesNotExist:
        raise Http404(NO_INBOX) from None
    writer = inbox.has_role(request.user, Role.APPROVER)
    status = 200
    if request.method == "POST":
        form = ChatForm(request.POST)
        status = 400
        if not writer:
            form.add_error(None, READ_ONLY)
            status = 403
        elif form.is_valid():
            try:
                stored = post_chat(
                    inbox, form.cleaned_data["message_id"], form.cleaned_data["text"], request.user
                )
            except InboxBusy:
                # The form keeps its message_id: sending again is the same message, once.
                form.add_error(None, BUSY)
                status = 503
            else:
                messages.success(request, "Sent." if stored else "Already received.")
                return redirect("inbox", slug=inbox.slug)
    else:
        form = ChatForm(initial={"message_id": uuid.uuid4()})
    # The cursor first: what is shown is then at least as new as the cursor it carries.
    live = conversation_context(request, inbox, live_updates.inbox_cursor(inbox.pk))
    live["writer"] = writer
    return render(request, "alwayson/inbox.html", {**live, "form": form}, status=status)


def conversation_context(request, inbox, cursor):
    """What the conversation shows, with the live cursor it was read at (alwayson/web/live.py):
    its page carries it, to be told of what comes after."""
    now = clock.database_now()
    answerer = may_answer(request.user, inbox)
    token = get_token(request)
    items = [
        conversation.render_entry(
            entry, inbox=inbox, now=now, user=request.user, answerer=answerer, csrf_token=token
        )
        for entry in conversation.entries(inbox, now)
    ]
    return {
        "inbox": inbox,
        "now": now,
        "items": items,
        "working": conversation.is_working(inbox, now),
        "answerer": answerer,
        "cursor": cursor,
    }


# --- what did my agent do? ------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "HEAD"])
def run_list(request):
    form = runs.RunFilter(request.user, request.GET)
    if not form.is_valid():
        context = {"form": form, "page": runs.RunPage([], None), "filtered": True}
        return render(request, "alwayson/runs.html", context, status=400)
    context = {"form": form, "page": runs.run_page(request.user, form), "filtered": form.filtered()}
    if context["page"].next_cursor:
        older = request.GET.copy()
        older["before"] = context["page"].next_cursor
        context["older"] = older.urlencode()
    return render(request, "alwayson/runs.html", context)


@login_required
@require_http_methods(["GET", "HEAD"])
def run_page(request, slug, generation):
    try:
        inbox = runs.inbox_of_run(request.user, slug)
    except Inbox.DoesNotExist:
        raise Http404(NO_INBOX) from None
    found = runs.timeline(inbox, generation)
    if found is None:
        raise Http404("No run of this inbox matches the given query.")
    context = {"run": found, "inbox": inbox, "now": clock.database_now()}
    return render(request, "alwayson/run.html", context)


# --- throttles -------------------------------------------------------------------------------


def cool_off_minutes() -> int:
    return math.ceil(settings.ALWAYSON_LOGIN_COOLOFF.total_seconds() / 60)


def login_locked_out(request, response=None, credentials=None):
    """django-axes' answer (AXES_LOCKOUT_CALLABLE) to a login for a locked-out username, the
    right password included, on the site's and the admin's login alike."""
    return render(request, "alwayson/locked_out.html", {"minutes": cool_off_minutes()}, status=429)


class ThrottledPasswordResetView(auth_views.PasswordResetView):
    """Django's password reset, at most ALWAYSON_PASSWORD_RESET_LIMIT emails per address per
    cool-off: otherwise anybody could mail an address as often as they post the form."""

    def form_valid(self, form):
        allowed = PasswordResetRequest.objects.allow(
            form.cleaned_data["email"],
            clock.database_now(),
            settings.ALWAYSON_PASSWORD_RESET_LIMIT,
            settings.ALWAYSON_LOGIN_COOLOFF,
        )
        if allowed:
            return super().form_valid(form)
        minutes = cool_off_minutes()
        form.add_error(
            "email",
            "Too many password reset requests for this address: "
            f"try again in {minutes} minute{'s' if minutes != 1 else ''}.",
        )
        return self.render_to_response(self.get_context_data(form=form), status=429)
