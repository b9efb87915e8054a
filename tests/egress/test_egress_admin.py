"""The egress gateway's part of the admin: each inbox's outbound services on its page."""

from django.contrib import admin
from django.urls import reverse

from alwayson.egress.gateway import Egress
from inbox.admin import InboxAdmin
from inbox.models import Inbox


def test_the_inbox_admin_is_the_inbox_apps_own_with_what_egress_adds(
    admin_client, egress_settings, inbox
):
    # egress once replaced the inbox's admin class at import; now it adds a field.
    assert type(admin.site._registry[Inbox]) is InboxAdmin
    Egress(inbox).get("payments", "/v1/refunds")

    page = admin_client.get(reverse("admin:inbox_inbox_change", args=[inbox.pk]))

    assert page.status_code == 200
    html = page.content.decode()
    assert "Outbound services (last day)" in html
    assert "1 sent, 0 refused, 0 failed" in html
