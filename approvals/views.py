from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods

from inbox import clock
from inbox.exceptions import InboxBusy

from .models import Approval
from .services import answer_approval

RECENT = 20


@login_required
def approval_list(request):
    now = clock.database_now()
    visible = Approval.objects.visible_to(request.user).select_related("inbox")
    return render(
        request,
        "approvals/list.html",
        {
            "now": now,
            "waiting": visible.waiting(now).order_by("expires_at", "id"),
            "settled": visible.settled(now).order_by("-requested_at", "-id")[:RECENT],
        },
    )


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def approval_detail(request, slug, request_id):
    # The same 404 for somebody else's request, an unknown one and a forged id: whether a
    # request exists is not for other people to learn.
    approval = get_object_or_404(
        Approval.objects.visible_to(request.user).select_related("inbox"),
        inbox__slug=slug,
        request_id=request_id,
    )
    status = 200
    if request.method == "POST":
        answer = request.POST.get("answer")
        if answer not in (Approval.Answer.YES, Approval.Answer.NO):
            return HttpResponseBadRequest('answer must be "yes" or "no"', content_type="text/plain")
        already = approval.standing_answer(clock.database_now())
        try:
            answer_approval(approval.inbox, approval.request_id, answer)
        except InboxBusy:
            messages.error(request, "The inbox is busy and your answer was not recorded yet.")
            status = 503
        else:
            if already:
                messages.info(
                    request, "This request was already settled; the first outcome stands."
                )
            else:
                messages.success(request, "Your answer was recorded.")
            # Answered inline on the conversation page: back there, to see what comes next.
            back = request.POST.get("next", "")
            if url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
                return redirect(back)
            return redirect(approval)
    now = clock.database_now()
    return render(
        request,
        "approvals/detail.html",
        {
            "approval": approval,
            "now": now,
            "outcome": approval.outcome_words(now),
            "can_answer": not approval.standing_answer(now),
        },
        status=status,
    )
