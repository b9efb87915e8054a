"""The scenarios command reproduces the article's raw output, and cleans up after itself."""

from io import StringIO

import pytest
from django.core.management import call_command

from inbox.models import Event, Inbox
from outbox.models import OutboxMessage
from tests.support.paths import DATA
from timers.models import Timer

ARTICLE_OUTPUT = DATA / "article_output.txt"


def normalised(text):
    """Lines with runs of whitespace collapsed: the article's copy lost its indentation."""
    return [" ".join(line.split()) for line in text.splitlines()]


@pytest.mark.django_db
def test_scenarios_print_the_articles_raw_output(inbox):
    buf = StringIO()
    call_command("scenarios", stdout=buf)

    assert normalised(buf.getvalue()) == normalised(ARTICLE_OUTPUT.read_text(encoding="utf-8"))


@pytest.mark.django_db
def test_scenarios_delete_their_scratch_inbox(inbox):
    call_command("scenarios", stdout=StringIO())

    assert list(Inbox.objects.values_list("slug", flat=True)) == ["desk"]
    assert not Event.objects.exists()
    assert not Timer.objects.exists()
    assert not OutboxMessage.objects.exists()
