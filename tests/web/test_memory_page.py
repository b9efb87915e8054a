"""The inbox's memory page (alwayson/web/memory.py): any role reads the files and their
history, each version linked to the run that wrote it or naming the person; only a manager
writes, corrects or deletes, each change a version naming them; anyone else gets the inbox's
404. The admin lists the files and versions, view-only."""

from html import unescape

import pytest
from django.test import Client

from alwayson.claude.memory import Change, MemoryWrites
from alwayson.claude.models import MemoryFile, MemoryVersion
from inbox import clock
from inbox.models import Membership, Role

pytestmark = pytest.mark.django_db


def client_of(user):
    client = Client()
    client.force_login(user)
    return client


def member(django_user_model, inbox, name, role):
    user = django_user_model.objects.create_user(username=name, password=f"pw-{name}-123")
    Membership.objects.create(inbox=inbox, user=user, role=role)
    return user


@pytest.fixture
def remembered(desk):
    """A file two runs wrote: created by run 3, then marked untrusted by run 5."""
    MemoryWrites(desk.pk, 3, (Change("/memories/owner.md", "create", "limit 450"),))(
        clock.database_now()
    )
    MemoryWrites(
        desk.pk, 5, (Change("/memories/owner.md", "str_replace", "limit 900", untrusted=True),)
    )(clock.database_now())
    return desk


def test_a_viewer_reads_the_files_and_each_versions_run(remembered, django_user_model):
    viewer = client_of(member(django_user_model, remembered, "vera", Role.VIEWER))

    listing = viewer.get("/inbox/desk/memory/")
    page = viewer.get("/inbox/desk/memory/owner.md")

    assert listing.status_code == 200
    assert 'href="/inbox/desk/memory/owner.md">/memories/owner.md</a>' in listing.content.decode()
    assert "Write a file" not in listing.content.decode()
    html = unescape(page.content.decode())
    assert page.status_code == 200
    assert '<pre class="memory-content">limit 900</pre>' in html
    assert 'href="/runs/desk/5/">run #5</a>' in html
    assert 'href="/runs/desk/3/">run #3</a>' in html
    assert "outside the owner" in html
    assert "<textarea" not in html


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER])
def test_only_a_manager_changes_memory(remembered, django_user_model, role):
    person = client_of(member(django_user_model, remembered, "pat", role))

    edit = person.post("/inbox/desk/memory/owner.md", {"content": "limit 1"})
    delete = person.post("/inbox/desk/memory/owner.md", {"delete": "1"})
    new = person.post("/inbox/desk/memory/", {"path": "/memories/x.md", "content": "x"})

    assert [edit.status_code, delete.status_code, new.status_code] == [403, 403, 403]
    assert "takes the manager role" in edit.content.decode()
    assert dict(MemoryFile.objects.values_list("path", "content")) == {
        "/memories/owner.md": "limit 900"
    }
    assert MemoryVersion.objects.count() == 2


def test_a_stranger_gets_the_inboxs_404(remembered, stranger):
    stranger_client = client_of(stranger)
    assert stranger_client.get("/inbox/desk/memory/").status_code == 404
    assert stranger_client.get("/inbox/desk/memory/owner.md").status_code == 404
    assert stranger_client.post("/inbox/desk/memory/owner.md", {"delete": "1"}).status_code == 404
    assert MemoryFile.objects.count() == 1


def test_a_manager_corrects_writes_and_deletes_each_a_version_naming_them(
    remembered, django_user_model
):
    manager = member(django_user_model, remembered, "mona", Role.MANAGER)
    browser = client_of(manager)

    corrected = browser.post("/inbox/desk/memory/owner.md", {"content": "limit 450"})
    written = browser.post("/inbox/desk/memory/", {"path": "/memories/notes/a.md", "content": "a"})
    deleted = browser.post("/inbox/desk/memory/notes/a.md", {"delete": "1"})

    assert corrected.status_code == written.status_code == deleted.status_code == 302
    assert written["Location"] == "/inbox/desk/memory/notes/a.md"
    owner_md = MemoryFile.objects.get(path="/memories/owner.md")
    assert (owner_md.content, owner_md.untrusted) == ("limit 450", False)
    assert list(
        MemoryVersion.objects.filter(person=manager).values_list("path", "action", "deleted")
    ) == [
        ("/memories/owner.md", "edit", False),
        ("/memories/notes/a.md", "edit", False),
        ("/memories/notes/a.md", "delete", True),
    ]
    history = unescape(browser.get("/inbox/desk/memory/notes/a.md").content.decode())
    assert "This file was deleted" in history and "by mona" in history


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"path": "/etc/passwd", "content": "x"}, "is outside /memories"),
        ({"path": "/memories/../x", "content": "x"}, "holds '.' or '..'"),
        ({"path": "/memories/big.md", "content": "x" * 11}, "more than a file may (10)"),
    ],
)
def test_a_managers_write_is_refused_with_its_reason(desk, owner_client, settings, fields, reason):
    settings.ALWAYSON_CLAUDE_MEMORY_FILE_CHARS = 10

    response = owner_client.post("/inbox/desk/memory/", fields)

    assert response.status_code == 400
    assert reason in unescape(response.content.decode())
    assert not MemoryFile.objects.exists() and not MemoryVersion.objects.exists()


def test_an_unknown_file_is_a_404(desk, owner_client):
    assert owner_client.get("/inbox/desk/memory/none.md").status_code == 404


def test_the_admin_lists_files_and_versions_view_only(remembered, admin_client):
    files = admin_client.get("/admin/alwayson_claude/memoryfile/")
    versions = admin_client.get("/admin/alwayson_claude/memoryversion/")
    one = MemoryFile.objects.get()
    change = admin_client.get(f"/admin/alwayson_claude/memoryfile/{one.pk}/change/")

    assert files.status_code == versions.status_code == change.status_code == 200
    assert "/memories/owner.md" in files.content.decode()
    assert versions.content.decode().count("/memories/owner.md") >= 2
    assert 'href="/inbox/desk/memory/owner.md"' in change.content.decode()
    assert admin_client.get("/admin/alwayson_claude/memoryfile/add/").status_code == 403


def test_a_runs_page_lists_its_memory_writes_linked_to_the_files(remembered, owner_client):
    from inbox.models import RunRecord

    now = clock.database_now()
    RunRecord.objects.create(
        inbox=remembered, generation=5, worker="w", started=now, ended=now, outcome="done"
    )

    html = unescape(owner_client.get("/runs/desk/5/").content.decode())

    assert (
        'Memory: <strong>replaced text</strong> <a href="/inbox/desk/memory/owner.md">'
        "/memories/owner.md</a> <span" in html
    )
    assert html.count("Memory: <strong>") == 1  # run 3's write is on run 3's page
