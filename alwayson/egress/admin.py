"""The egress gateway's audit, and each inbox's outbound services on its admin page."""

from collections import Counter
from datetime import timedelta

from django.contrib import admin
from django.db.models import Count
from django.utils.html import format_html_join

from inbox import clock
from inbox.admin import ViewOnlyAdmin

from .models import EgressCall
from .services import configured_services


@admin.register(EgressCall)
class EgressCallAdmin(ViewOnlyAdmin):
    """The egress gateway's audit: what agents asked to call, and what was refused. Written
    by the gateway only; it never holds a credential, a query string or a body."""

    list_display = ("at", "inbox", "service", "method", "path", "outcome", "status", "error")
    list_filter = ("outcome", "service")
    list_select_related = ("inbox",)
    search_fields = ("=service", "path")
    ordering = ("-id",)
    show_full_result_count = False
    readonly_fields = list_display


def egress_summary(inbox, now) -> list[tuple[str, int, int, int]]:
    """(service, sent, refused, failed) in the last day, for each service this inbox may
    call or did call."""
    counts = {
        name: Counter()
        for name, service in configured_services().items()
        if service.allows_inbox(inbox.slug)
    }
    rows = (
        EgressCall.objects.filter(inbox=inbox, at__gte=now - timedelta(days=1))
        .values_list("service", "outcome")
        .annotate(n=Count("id"))
        .order_by()
    )
    for service, outcome, n in rows:
        counts.setdefault(service, Counter())[outcome] += n
    return [(name, c["sent"], c["refused"], c["failed"]) for name, c in sorted(counts.items())]


@admin.display(description="outbound services (last day)")
def outbound_services(inbox):
    """The inbox admin page's field (added in EgressConfig.ready()): what the inbox may call
    and what its calls came to in the last day."""
    if inbox is None or inbox.pk is None:
        return "-"
    services = configured_services()
    rows = egress_summary(inbox, clock.database_now())
    if not rows:
        return "none: this inbox's agent can make no outbound call"
    return format_html_join(
        "\n",
        "<div><code>{}</code>: {} sent, {} refused, {} failed</div>",
        (
            (services[name].describe() if name in services else name, sent, refused, failed)
            for name, sent, refused, failed in rows
        ),
    )
