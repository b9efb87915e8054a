"""The owner's pages: their inboxes, and one inbox's chat form and the agent's messages; and
the throttles' answers on login and password reset."""

import math
import uuid

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from inbox import clock
from inbox.models import Inbox
from inbox.services import ingest
from outbox.models import OutboxMessage

from .models import PasswordResetRequest

SHOWN_MESSAGES = 50


class ChatForm(forms.Form):
    # Generated when the page is rendered and used as the event's source_id, so a double
    # submit or a browser resend of the same form is one event.
    message_id = forms.UUIDField(widget=forms.HiddenInput)
    text = forms.CharField(
        label="Message to your agent", max_length=2000, widget=forms.Textarea(attrs={"rows": 3})
    )


def owned_inboxes(user):
    return Inbox.objects.filter(owner=user)


@login_required
def home(request):
    return render(request, "alwayson/home.html", {"inboxes": owned_inboxes(request.user)})


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def inbox_page(request, slug):
    inbox = get_object_or_404(owned_inboxes(request.user), slug=slug)
    status = 200
    if request.method == "POST":
        form = ChatForm(request.POST)
        if form.is_valid():
            stored = ingest(
                inbox,
                "chat",
                str(form.cleaned_data["message_id"]),
                {"text": form.cleaned_data["text"], "from": request.user.get_username()},
            )
            messages.success(request, "Sent." if stored else "Already received.")
            return redirect("inbox", slug=inbox.slug)
        status = 400
    else:
        form = ChatForm(initial={"message_id": uuid.uuid4()})
    outbox = OutboxMessage.objects.filter(inbox=inbox).order_by("-id")[:SHOWN_MESSAGES]
    return render(
        request,
        "alwayson/inbox.html",
        {"inbox": inbox, "form": form, "outbox": outbox},
        status=status,
    )


# --- throttles -------------------------------------------------------------------------------


def cool_off_minutes() -> int:
    return math.ceil(settings.ALWAYSON_LOGIN_COOLOFF.total_seconds() / 60)


def login_locked_out(request, response=None, credentials=None):
    """django-axes' answer (AXES_LOCKOUT_CALLABLE) to a login for a locked-out username, the
    right password included, on the site's and the admin's login alike."""
    return render(
        request, "registration/locked_out.html", {"minutes": cool_off_minutes()}, status=429
    )


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
