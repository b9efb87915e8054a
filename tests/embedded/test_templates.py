"""alwayson's templates come with its apps: the project's TEMPLATES has only its own directory
(settings.py), and every page alwayson renders under it finds what it needs in the apps'
templates/ folders, under names of alwayson's (docs/how-to/embed-in-a-project.md)."""

from pathlib import Path

from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.template.loader import get_template
from django.test import Client

from alwayson.web import streams
from alwayson.web.admin_site import AlwaysonAdminSite
from approvals.models import AuditEntry
from inbox.models import Event

ALWAYSON_PACKAGES = ("alwayson", "inbox", "timers", "approvals", "outbox")


def shipped_templates():
    """(name, file) of every template in an alwayson app's templates/ folder."""
    found = []
    for config in apps.get_app_configs():
        if config.name.split(".")[0] not in ALWAYSON_PACKAGES:
            continue
        root = Path(config.path) / "templates"
        found += [(p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*.html"))]
    return found


def alwayson_labels():
    return {c.label for c in apps.get_app_configs() if c.name.split(".")[0] in ALWAYSON_PACKAGES}


def test_every_template_alwayson_ships_resolves_from_its_app_under_a_name_of_alwayson_s():
    templates = dict(shipped_templates())
    assert {
        "alwayson/base.html",
        "alwayson/inbox.html",
        "alwayson/locked_out.html",
        "alwayson/admin/dashboard.html",
        "approvals/detail.html",
        "admin/inbox/event/change_form.html",
        "admin/approvals/auditentry/change_list.html",
    } <= templates.keys()
    labels = alwayson_labels()
    for name, path in templates.items():
        top, *rest = name.split("/")
        # alwayson/ and approvals/ are its own; under admin/ only its apps' labels, where
        # Django's admin looks for one model's page.
        assert top in {"alwayson", "approvals"} or (top == "admin" and rest[0] in labels), name
        assert get_template(name).origin.name == str(path), name


def test_the_names_alwayson_s_code_renders_are_the_apps_own():
    shipped = {str(path) for _, path in shipped_templates()}
    rendered = [
        streams.CONVERSATION,
        streams.APPROVALS,
        streams.DASHBOARD,
        AlwaysonAdminSite.index_template,
        admin.site._registry[AuditEntry].change_list_template,
    ]
    for name in rendered:
        assert get_template(name).origin.name in shipped, name


def test_alwayson_s_pages_render_with_the_project_s_templates_alone(harness):
    desk = harness.inbox("desk")
    desk.chat("hello")
    harness.run_until_idle()
    Event.objects.filter(inbox__slug="desk").update(status=Event.Status.DEAD)
    [dead] = Event.objects.filter(inbox__slug="desk")
    boss = get_user_model().objects.create_superuser("boss@acme.example.com", "pw-boss-1")
    browser = Client()
    browser.force_login(boss)

    index = browser.get("/admin/")
    assert index.status_code == 200 and b'href="/agents/admin/dashboard/"' in index.content
    home = browser.get("/agents/")
    assert home.status_code == 200 and b"Your inboxes" in home.content
    dashboard = browser.get("/agents/admin/dashboard/")
    assert dashboard.status_code == 200
    # Under Django's own admin/base_site.html: the page links its styles itself.
    assert b'id="dead-24h">1<' in dashboard.content
    assert b"alwayson/dashboard.css" in dashboard.content
    assert b"alwayson/admin.css" not in dashboard.content
    event = browser.get(f"/admin/inbox/event/{dead.pk}/change/")
    assert event.status_code == 200 and b'id="requeue-form"' in event.content
    audit = browser.get("/admin/approvals/auditentry/")
    assert audit.status_code == 200 and b"Export CSV" in audit.content


def test_a_login_locked_out_on_the_project_s_email_login_gets_alwayson_s_page(harness, settings):
    harness.person("dana", password="pw-dana-1")
    browser = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        browser.post("/accounts/login/", {"username": "dana@example.com", "password": "wrong"})

    locked = browser.post(
        "/accounts/login/", {"username": "dana@example.com", "password": "pw-dana-1"}
    )

    assert locked.status_code == 429
    assert b"Login locked" in locked.content
    assert {"alwayson/locked_out.html", "alwayson/base.html"} <= {t.name for t in locked.templates}
