import json

from django import template

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
