import json

from django import template

from approvals.forms import AnswerForms, DenyForm
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


@register.filter
def arguments_shown(approval):
    """(name, value) of the arguments as asked, in the schema's order."""
    arguments = approval.arguments or {}
    return [(name, arguments[name]) for name in approval.argument_names if name in arguments]


@register.filter
def approvable_by(approval, user):
    """Whether `user` may still say yes: not the one who gave a two-person request's first
    approval (they may change the arguments only by denying and asking again)."""
    return approval.first_approved_at is None or approval.first_approved_by_id != user.pk


_ABSENT = object()


@register.filter
def changes(approval):
    """What a person's edit changed: (argument, as asked, as edited), in words."""
    before, after = approval.arguments, approval.current_arguments
    if before is None or after is None or before == after:
        return []

    def shown(arguments, name):
        return "(not given)" if name not in arguments else json_value(arguments[name])

    names = approval.argument_names
    return [
        (name, shown(before, name), shown(after, name))
        for name in names
        if before.get(name, _ABSENT) != after.get(name, _ABSENT)
    ]


@register.filter
def editor(approval):
    """Who changed the arguments."""
    return display_name(approval.edited_by) or "someone through the API"


@register.filter
def standing(approval, now):
    """The answer that stands ("" while a person may still answer)."""
    return approval.standing_answer(now)


@register.simple_tag
def answer_forms(approval):
    """The forms a card offers for `approval` (approvals/forms.py), unbound."""
    return AnswerForms(approval)


@register.simple_tag
def group_deny_form(lead):
    """The reason field of a card's "all at once" answer; its ids name the card's group."""
    return DenyForm(prefix="all", auto_id=f"id_all{lead.pk}_%s")


@register.filter
def as_json(value):
    """A value as JSON text, for a hidden field (the template escapes it)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
