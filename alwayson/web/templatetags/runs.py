"""The run pages' filters (alwayson/web/runs.py): durations as people read them, a filter's
label by its name."""

from datetime import timedelta

from django import template

from alwayson.runtime import versions
from alwayson.web import runs

register = template.Library()


@register.filter
def took(value):
    """A duration as "850 ms", "12.4 s", "3 min 05 s" or "2 h 04 min"; "" for none."""
    if not isinstance(value, timedelta):
        return ""
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    return f"{hours // 24} days {hours % 24} h"


@register.filter
def field_label(form, name):
    field = form.fields.get(name)
    return field.label or name.replace("_", " ").capitalize() if field else name


@register.filter
def trace_id(traceparent):
    return runs.trace_id(traceparent)


@register.filter
def version_label(produced):
    """The version a run's record keeps (alwayson/runtime/versions.py), in words."""
    return versions.label((produced or {}).get("version"))
