import json
import re
from collections import Counter
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.utils.encoding import escape_uri_path
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from inbox import clock
from inbox.exceptions import InboxBusy
from inbox.models import is_person
from inbox.validation import UNSTORABLE

from .forms import AnswerForms, DenyForm, Invalid
from .models import Approval, AuditEntry, may_answer
from .services import ANSWERS, answer_approval, answer_at_once, answer_group

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


@dataclass
class Call:
    """One approval as its page shows it."""

    approval: Approval
    forms: AnswerForms
    open: bool  # the person may answer it now
    outcome: str


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def approval_detail(request, slug, request_id):
    if request.method == "POST":
        answered = _answered_at_once(request, slug, request_id)
        if answered is not None:
            return answered
    approval = _visible(request, slug, request_id)
    answerer = may_answer(request.user, approval.inbox)
    if request.method != "POST":
        return _page(request, approval, answerer)
    # One answer: of a form carrying two, QueryDict.get would take the last silently.
    answers = request.POST.getlist("answer")
    answer = answers[0] if len(answers) == 1 else None
    if answer not in ANSWERS:
        return HttpResponseBadRequest(
            'answer must be "yes" or "no" (or "replied" for a question)', content_type="text/plain"
        )
    if not answerer:
        # A viewer: told why, and nothing is stored.
        refused = REFUSED.format(inbox=approval.inbox.name or approval.inbox.slug)
        return _page(request, approval, answerer, status=403, refused=refused)
    posted = AnswerForms(approval, request.POST)
    try:
        given = posted.answer(answer)
        answered = _answer(request, approval, answer, given)
    except Invalid:
        problem = " ".join(posted.problems())
        return _page(request, approval, answerer, status=400, problem=problem, posted=posted)
    except ValueError as exc:
        return _page(request, approval, answerer, status=400, problem=str(exc), posted=posted)
    return answered or _page(request, approval, answerer, status=503, posted=posted)


@login_required
@require_POST
def approval_answer_all(request, slug, request_id):
    """Every open call of a request's group (a model turn's), answered the same way."""
    approval = _visible(request, slug, request_id)
    answerer = may_answer(request.user, approval.inbox)
    answers = request.POST.getlist("answer")
    answer = answers[0] if len(answers) == 1 else None
    if answer not in (Approval.Answer.YES, Approval.Answer.NO):
        return HttpResponseBadRequest('answer must be "yes" or "no"', content_type="text/plain")
    if not answerer:
        refused = REFUSED.format(inbox=approval.inbox.name or approval.inbox.slug)
        return _page(request, approval, answerer, status=403, refused=refused)
    form = DenyForm(request.POST, prefix="all")
    if not form.is_valid():
        problem = " ".join(f"Reason: {e}" for e in form.errors.get("reason", []))
        return _page(request, approval, answerer, status=400, problem=problem, all_form=form)
    reason = form.cleaned_data["reason"] if answer == Approval.Answer.NO else ""
    try:
        answered = answer_group(
            approval.inbox,
            approval.request_id,
            answer,
            by=request.user,
            via=_via(request),
            reason=reason,
            arguments=_shown(request.POST),
        )
    except InboxBusy:
        messages.error(request, "The inbox is busy and your answers were not recorded yet.")
        return _page(request, approval, answerer, status=503, all_form=form)
    except ValueError as exc:
        return _page(request, approval, answerer, status=400, problem=str(exc), all_form=form)
    messages.success(request, _group_words(answered, approval))
    return _back(request, approval)


# The fields of one approval's forms are prefixed with its id (AnswerForms): an argument of
# its edit, its denial's reason.
ARGUMENT_FIELD = re.compile(r"a\d+-arg-")
REASON_FIELD = re.compile(r"a(\d+)-reason")


def _answered_at_once(request, slug, request_id):
    """The common answer, a plain yes or a no with its reason, in one statement
    (answer_at_once: on PostgreSQL, where the request is read, locked, decided, settled and
    audited at once); None for approval_detail's path, which takes every other answer: an
    edit, a reason its form refuses, a viewer's, one the statement hands back, SQLite's."""
    answers = request.POST.getlist("answer")
    answer = answers[0] if len(answers) == 1 else None
    if answer not in (Approval.Answer.YES, Approval.Answer.NO) or not is_person(request.user):
        return None
    if UNSTORABLE.search(slug) or UNSTORABLE.search(request_id):
        return None
    reasons = {}
    for key in request.POST:
        if ARGUMENT_FIELD.match(key):
            return None
        named = REASON_FIELD.fullmatch(key)
        if named and answer == Approval.Answer.NO:
            # The reason as the approval's own DenyForm cleans it (AnswerForms.answer); the
            # statement takes the one of the approval it reads.
            form = DenyForm(request.POST, prefix=f"a{named[1]}")
            if not form.is_valid():
                return None
            reasons[named[1]] = form.cleaned_data["reason"]
    try:
        answered = answer_at_once(
            request.user, slug, request_id, answer, via=_via(request), reasons=reasons
        )
    except Approval.DoesNotExist:
        raise Http404("No approval matches the given query.") from None
    except InboxBusy:
        approval = _visible(request, slug, request_id)
        messages.error(request, "The inbox is busy and your answer was not recorded yet.")
        posted = AnswerForms(approval, request.POST)
        posted.answer(answer)
        answerer = may_answer(request.user, approval.inbox)
        return _page(request, approval, answerer, status=503, posted=posted)
    if answered is None:
        return None
    _tell(request, answered, {})
    # Posted to the request's own page (approval_detail): back to it, without reverse()'s
    # walk of the URL patterns on every answer. Escaped as reverse() escapes it: an id may
    # hold letters beyond ASCII.
    return _back(request, escape_uri_path(request.path))


SHOWN = "shown-"


def _shown(posted) -> dict:
    """The arguments the page showed for each call ("shown-<request id>", JSON): a yes to
    all approves those, not what someone may have changed them to since."""
    shown = {}
    for key in posted:
        if key.startswith(SHOWN):
            try:
                shown[key.removeprefix(SHOWN)] = json.loads(posted[key])
            except json.JSONDecodeError:
                raise ValueError(f"{key}: not JSON") from None
    return shown


def _visible(request, slug, request_id) -> Approval:
    # The same 404 for somebody else's request, an unknown one and a forged id: whether a
    # request exists is not for other people to learn.
    try:
        return Approval.objects.get_visible(request.user, slug, request_id)
    except Approval.DoesNotExist:
        raise Http404("No approval matches the given query.") from None


def _page(
    request, approval, answerer, *, status=200, refused="", problem="", posted=None, all_form=None
):
    """The approval's page: the request, or every call of its group, each with its answer's
    forms (those just posted, with their errors, for the one answered)."""
    now = clock.database_now()
    members = [_with_people(approval)]
    if approval.group:
        members = list(
            Approval.objects.filter(inbox=approval.inbox, group=approval.group)
            .select_related(*PEOPLE[1:])
            .order_by("id")
        )
    calls = []
    for member in members:
        member.inbox = approval.inbox
        forms = posted if posted is not None and member.pk == approval.pk else AnswerForms(member)
        is_open = answerer and not member.standing_answer(now)
        calls.append(Call(member, forms, is_open, member.outcome_words(now)))
    context = {
        "approval": approval,
        "calls": calls,
        "now": now,
        "answerer": answerer,
        "refused": refused,
        "problem": problem,
        "all_open": sum(call.open for call in calls),
        "all_form": all_form or DenyForm(prefix="all"),
    }
    return render(request, "approvals/detail.html", context, status=status)


def _with_people(approval) -> Approval:
    """The approval with the people its page names (who approved first, who answered), in
    one query, none while nobody has: get_visible reads the request without them."""
    named = {"first_approved_by": approval.first_approved_by_id}
    named["answered_by"] = approval.answered_by_id
    if any(named.values()):
        people = get_user_model().objects.in_bulk([pk for pk in named.values() if pk])
        for field, pk in named.items():
            if pk in people:
                setattr(approval, field, people[pk])
    return approval


def _via(request):
    if request.POST.get("via") == AuditEntry.Via.CONVERSATION:
        return AuditEntry.Via.CONVERSATION
    return AuditEntry.Via.PAGE


def _back(request, approval):
    """`approval`'s page (it, or its URL), or the page the answer was posted from."""
    # Answered inline on the conversation page: back there, to see what comes next.
    back = request.POST.get("next", "")
    if back and url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        return redirect(back)
    # A URL already: redirect() would first try it as a view's name, and fail, on every answer.
    url = approval if isinstance(approval, str) else approval.get_absolute_url()
    return HttpResponseRedirect(url)


# Answers that leave the request waiting for a second approver.
WAITING_FOR_A_SECOND = (AuditEntry.Result.FIRST_APPROVAL, AuditEntry.Result.NOT_COUNTED)


def _answer(request, approval, answer, given):
    """Answer as the logged-in user; the redirect to show next, or None if the inbox was busy."""
    try:
        # What the answer did is decided under the inbox's lock: no reading ahead of it.
        answered = answer_approval(
            approval.inbox,
            approval.request_id,
            answer,
            by=request.user,
            via=_via(request),
            **given,
        )
    except InboxBusy:
        messages.error(request, "The inbox is busy and your answer was not recorded yet.")
        return None
    _tell(request, answered, given)
    return _back(request, approval)


def _tell(request, answered, given):
    """The message that tells the person what their answer did, `given` what they sent with
    it."""
    result, stands, expires_at = answered.result, answered.stands, answered.expires_at
    if result == AuditEntry.Result.TOO_LATE or stands == Approval.Answer.EXPIRED:
        messages.info(request, _too_late(expires_at))
    elif result in (None, AuditEntry.Result.ALREADY_SETTLED):
        messages.info(request, "This request was already settled; the first outcome stands.")
    elif result in WAITING_FOR_A_SECOND and _via(request) == AuditEntry.Via.CONVERSATION:
        # The card says it ("You approved; waiting for a second, different approver") and
        # updates itself when the second approver answers; a message over the conversation
        # would go on saying the request waits after it was approved.
        pass
    elif result == AuditEntry.Result.NOT_COUNTED:
        messages.info(
            request,
            "You already approved this request. It needs a second, different approver.",
        )
    elif result == AuditEntry.Result.FIRST_APPROVAL:
        changed = " as you changed it" if given.get("arguments") else ""
        messages.success(
            request,
            f"Your approval{changed} is recorded. A second, different approver must also"
            f" approve before {expires_at:%H:%M} UTC.",
        )
    elif given.get("arguments"):
        messages.success(
            request, "Your answer was recorded, with the arguments as you changed them."
        )
    else:
        messages.success(request, "Your answer was recorded.")


GROUP_WORDS = {
    AuditEntry.Result.APPROVED: "approved",
    AuditEntry.Result.DENIED: "denied",
    AuditEntry.Result.FIRST_APPROVAL: "waiting for a second, different approver",
    AuditEntry.Result.NOT_COUNTED: "already approved by you, waiting for a second approver",
    AuditEntry.Result.TOO_LATE: "expired before your answer",
}


def _too_late(expires_at) -> str:
    return (
        f"Too late: this request expired at {expires_at:%H:%M} UTC, before your"
        " answer, which was not counted; nothing was done."
    )


def _group_words(answered, approval) -> str:
    if not answered and approval.standing_answer(clock.database_now()) == Approval.Answer.EXPIRED:
        return _too_late(approval.expires_at)
    if not answered:
        return "Nothing was left to answer; the first outcomes stand."
    counts = Counter(each.result for each in answered.values())
    listed = ", ".join(f"{count} {GROUP_WORDS[result]}" for result, count in counts.items())
    return f"Your answer was recorded for {len(answered)} call(s): {listed}."
