"""{% live_attributes %}: the data-live-* attributes by which static/alwayson/live.js keeps a
region of a page live (alwayson/web/live.py)."""

from django import template
from django.urls import reverse
from django.utils.html import format_html

from alwayson.web import live

register = template.Library()


@register.simple_tag(takes_context=True)
def live_attributes(context, name, *args):
    """For the region served by the URLs `<name>-live` (the poll) and `<name>-stream` (the
    push, offered only where this server can push). The cursor is the context's, else every
    inbox's (read here, before the region's own rows)."""
    cursor = context.get("cursor") or live.global_cursor()
    attributes = format_html(
        'data-live-poll="{}" data-live-cursor="{}"', reverse(f"{name}-live", args=args), cursor
    )
    request = context.get("request")
    # Rendered without a request: for a push (alwayson/web/feed.py), to a page that streams.
    if request is None or live.push_available(request):
        attributes += format_html(' data-live-stream="{}"', reverse(f"{name}-stream", args=args))
    return attributes
