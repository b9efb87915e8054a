from django import template

register = template.Library()


@register.filter
def outcome(approval, now):
    return approval.outcome_words(now)


@register.filter
def time_left(approval, now):
    """ "3 h 12 min" left to answer; "less than a minute" at the end."""
    return approval.time_left(now)
