"""The live pages' two ways of hearing of a change (alwayson/web/live.py): `*_poll`, one
query and 204 while the page's cursor stands; `*_stream`, Server-Sent Events on PostgreSQL
under ASGI or the production web's worker. Each answers with the page's fragment, rendered as
the page renders it, and checks who may see it as the page does: on every change, so a person
who loses the role stops receiving.
"""

from functools import partial

from asgiref.sync import sync_to_async
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required, permission_required
from django.http import Http404, HttpResponse
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from approvals.views import list_context
from inbox import clock
from inbox.models import Inbox

from . import feed, live
from .dashboard import dashboard_context, dashboard_cursor
from .views import conversation_context

CONVERSATION = "alwayson/_conversation.html"
APPROVALS = "approvals/_list.html"
DASHBOARD = "alwayson/admin/_dashboard.html"
DASHBOARD_GAP = 2  # seconds between two pushes of the dashboard: it reads every inbox


def _changed(request, cursor, render):
    """The poll's answer: 204 while the page shows `cursor`, else the fragment."""
    if request.GET.get("since") == cursor:
        response = HttpResponse(status=204)
    else:
        response = HttpResponse(render())
    response["X-Live-Cursor"] = cursor
    response["Cache-Control"] = "no-store"
    return response


def _unavailable():
    return HttpResponse(
        "Push needs PostgreSQL and a server that streams; this page polls instead.",
        status=404,
        content_type="text/plain",
    )


def _person(user_pk):
    """The user as they are now (still active, their roles), or None."""
    return get_user_model().objects.filter(pk=user_pk, is_active=True).first()


# --- one inbox's conversation ----------------------------------------------------------------


def _visible_inbox(user, **lookup):
    return live.with_cursor(Inbox.objects.with_role(user).filter(**lookup)).first()


def _conversation(request, inbox, cursor):
    return render_to_string(
        CONVERSATION, conversation_context(request, inbox, cursor), request=request
    )


@login_required
@require_GET
def inbox_poll(request, slug):
    inbox = _visible_inbox(request.user, slug=slug)
    if inbox is None:
        raise Http404("No such inbox.")
    cursor = live.cursor_of(inbox)
    return _changed(request, cursor, lambda: _conversation(request, inbox, cursor))


@login_required
@require_GET
async def inbox_stream(request, slug):
    if not live.push_available(request):
        return _unavailable()
    user = await request.auser()
    inbox = await Inbox.objects.with_role(user).filter(slug=slug).afirst()
    if inbox is None:
        raise Http404("No such inbox.")
    await live.release_request_connection(request)
    return feed.stream(inbox.pk, user.pk, live.last_seen(request))


# --- the approvals list ----------------------------------------------------------------------


def _approvals(request, user, cursor):
    context = {**list_context(user), "cursor": cursor}
    return render_to_string(APPROVALS, context, request=request)


@login_required
@require_GET
def approvals_poll(request):
    cursor = live.global_cursor()
    return _changed(request, cursor, lambda: _approvals(request, request.user, cursor))


def _refresh_approvals(request, user_pk, since):
    user = _person(user_pk)
    if user is None:
        return live.GONE
    cursor = live.global_cursor()
    if cursor == since:
        return None
    request.user = user
    return cursor, _approvals(request, user, cursor)


@login_required
@require_GET
async def approvals_stream(request):
    if not live.push_available(request):
        return _unavailable()
    user = await request.auser()
    await live.release_request_connection(request)
    return live.stream(
        live.ANY,
        live.last_seen(request),
        partial(_refresh_approvals, request, user.pk),
        audience=("approvals", user.pk),
    )


# --- the operators' dashboard ----------------------------------------------------------------


def _dashboard(request, cursor):
    context = {
        **dashboard_context(clock.database_now()),
        "cursor": cursor,
    }
    return render_to_string(DASHBOARD, context, request=request)


def _may_see_dashboard(user) -> bool:
    return user is not None and user.is_staff and user.has_perm("inbox.view_event")


@staff_member_required
@permission_required("inbox.view_event", raise_exception=True)
@require_GET
def dashboard_poll(request):
    cursor = dashboard_cursor()
    return _changed(request, cursor, lambda: _dashboard(request, cursor))


def _refresh_dashboard(request, user_pk, since):
    user = _person(user_pk)
    if not _may_see_dashboard(user):
        return live.GONE
    cursor = dashboard_cursor()
    if cursor == since:
        return None
    request.user = user
    return cursor, _dashboard(request, cursor)


@require_GET
async def dashboard_stream(request):
    if not live.push_available(request):
        return _unavailable()
    user = await request.auser()
    if not await sync_to_async(_may_see_dashboard)(user):
        raise Http404("No dashboard here.")
    await live.release_request_connection(request)
    return live.stream(
        live.ANY,
        live.last_seen(request),
        partial(_refresh_dashboard, request, user.pk),
        audience=("dashboard", user.pk),
        gap=DASHBOARD_GAP,
        recheck=lambda cursor: not cursor.endswith(".0"),  # some lease is held
    )
