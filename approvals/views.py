from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods

from inbox import clock
from inbox.exceptions import InboxBusy

from .models import Approval, AuditEntry, may_answer
from .services import decide_answer

RECENT = 20
PEOPLE = ("inbox", "first_approved_by", "answered_by")

REFUSED = (
    "You can see this request but not answer it: you are a viewer of {inbox}. Answering"
    " takes the approver role, which a manager of the inbox can give you."
)


@login_required
def approval_list(request):
    return render(request, "approvals/list.html", list_context(request.user))


def list_context(user):
    """What the approvals list shows `user`; its live updates render the same
    (alwayson/web/streams.py)."""
    now = clock.database_now()
    visible = Approval.objects.visible_to(user).select_related(*PEOPLE)
    return {
        "now": now,
        "waiting": visible.waiting(now).order_by("expires_at", "id"),
        "settled": visible.settled(now).order_by("-requested_at", "-id")[:RECENT],
    }


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def approval_detail(request, slug, request_id):
    # The same 404 for somebody else's request, an unknown one and a forged id: whether a
    # request exists is not for other people to learn.
    try:
        approval = Approval.objects.select_related(*PEOPLE[1:]).get_visible(
            request.user, slug, request_id
        )
    except Approval.DoesNotExist:
        raise Http404("No approval matches the given query.") from None
    answerer = may_answer(request.user, approval.inbox)
    status = 200
    refused = ""
    if request.method == "POST":
        # One answer: of a form carrying two, QueryDict.get would take the last silently.
        answers = request.POST.getlist("answer")
        answer = answers[0] if len(answers) == 1 else None
        if answer not in (Approval.Answer.YES, Approval.Answer.NO):
            return HttpResponseBadRequest('answer must be "yes" or "no"', content_type="text/plain")
        if not answerer:
            # A viewer: told why, and nothing is stored.
            refused = REFUSED.format(inbox=approval.inbox.name or approval.inbox.slug)
            status = 403
        elif answered := _answer(request, approval, answer):
            return answered
        else:
            status = 503
    now = clock.database_now()
    return render(
        request,
        "approvals/detail.html",
        {
            "approval": approval,
            "now": now,
            "outcome": approval.outcome_words(now),
            "can_answer": answerer and not approval.standing_answer(now),
            "answerer": answerer,
            "approved_by_you": approval.first_approved_by_id == request.user.pk,
            "refused": refused,
        },
        status=status,
    )


def _answer(request, approval, answer):
    """Answer as the logged-in user; the redirect to show next, or None if the inbox was busy."""
    via = AuditEntry.Via.PAGE
    if request.POST.get("via") == AuditEntry.Via.CONVERSATION:
        via = AuditEntry.Via.CONVERSATION
    try:
        # What the answer did is decided under the inbox's lock: no reading ahead of it.
        result, _ = decide_answer(
            approval.inbox, approval.request_id, answer, by=request.user, via=via
        )
    except InboxBusy:
        messages.error(request, "The inbox is busy and your answer was not recorded yet.")
        return None
    if result in (None, AuditEntry.Result.ALREADY_SETTLED, AuditEntry.Result.TOO_LATE):
        messages.info(request, "This request was already settled; the first outcome stands.")
    elif result == AuditEntry.Result.NOT_COUNTED:
        messages.info(
            request,
            "You already approved this request. It needs a second, different approver.",
        )
    elif result == AuditEntry.Result.FIRST_APPROVAL:
        messages.success(
            request,
            "Your approval is recorded. A second, different approver must also approve"
            f" before {approval.expires_at:%H:%M} UTC.",
        )
    else:
        messages.success(request, "Your answer was recorded.")
    # Answered inline on the conversation page: back there, to see what comes next.
    back = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        return redirect(back)
    return redirect(approval)
