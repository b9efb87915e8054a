from django import template

register = template.Library()


@register.filter
def outcome(approval, now):
    return approval.outcome_words(now)
