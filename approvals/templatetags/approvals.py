import json

from django import template

from approvals.models import and_join, display_name

register = template.Library()


@register.filter
def outcome(approval, now):
    return approval.outcome_words(now)


@register.filter
def time_left(approval, now):
    """ "3 h 12 min" left to answer; "less than a minute" at the end."""
    return approval.time_left(now)


@register.filter
def json_value(value):
    """A tool argument as the person should read it: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@register.filter
def first_approver(approval):
    """Who gave the first of two approvals, in their name."""
    return display_name(approval.first_approved_by) or "Someone (account deleted)"


@register.filter
def settled_by(approval):
    """The line under a settled request: "Answered by Dana and Lee", or for an expiry
    "Expired at 14:05 UTC, unanswered" (the deadline, not when the timer noticed it)."""
    if approval.answer == approval.Answer.EXPIRED:
        return f"Expired at {approval.expires_at:%H:%M} UTC, unanswered"
    return f"Answered by {answered_by(approval)}"


@register.filter
def answered_by(approval):
    """Who answered: "Dana and Lee" for two approvals (an expiry has nobody: settled_by)."""
    people = [approval.answered_by]
    if approval.answer == approval.Answer.YES and approval.needs_two:
        people.insert(0, approval.first_approved_by)
    names = [display_name(person) for person in people if person is not None]
    return and_join(names) or "No one named (answered through the API)"
