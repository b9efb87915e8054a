"""A request that waits does not hold the production web's worker (alwayson/web/serving.py's
Turns): its requests run one at a time, and one that has run past its turn lets the next
start beside it. Here a delivery waits for its inbox's lock, held by another session as a
frozen lease holder would hold it, and the worker's only process answers deliveries to other
inboxes meanwhile; the waiting one is stored once the lock is let go."""

import pytest

from inbox.models import Event
from tests.support import postgres
from tests.support.processes import wait_for
from tests.support.web import ProductionWeb, connect, exchange, github_delivery, read_answer

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

WAIT = 60  # seconds: a bound on a wait, never a measure (CI runs two suites at once on 2 cores)


@pytest.fixture
def web(tmp_path, transactional_db):
    """One worker, with its threads as shipped; a lock wait longer than the test."""
    server = ProductionWeb(tmp_path, WEB_CONCURRENCY="1", ALWAYSON_INGEST_LOCK_WAIT=str(WAIT))
    yield server
    server.stop()


def waiting_for_a_lock(other, application_name) -> int:
    return other.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = %s AND wait_event_type = 'Lock'",
        [application_name],
    ).fetchone()[0]


def test_a_delivery_waiting_for_its_inbox_s_lock_does_not_hold_the_worker(web, make_inbox):
    held, free = make_inbox("held"), make_inbox("free")
    with postgres.other_session() as other, postgres.other_session(autocommit=True) as looking:
        other.execute("SELECT 1 FROM inbox_lease WHERE inbox_id = %s FOR UPDATE", [held.pk])
        waiting = connect(web)
        waiting.sendall(github_delivery("held", "behind-the-lock"))
        wait_for(
            lambda: waiting_for_a_lock(looking, web.application_name) == 1,
            WAIT,
            "the delivery to wait for the inbox's lock",
        )

        answers = [exchange(web, github_delivery("free", f"meanwhile-{n}")) for n in range(5)]

        assert [answer.status for answer in answers] == [202] * 5, web.log()[-2000:]
        assert waiting_for_a_lock(looking, web.application_name) == 1
        other.rollback()

    with waiting:
        assert read_answer(waiting).status == 202, web.log()[-2000:]
    assert Event.objects.filter(inbox=free).count() == 5
    assert Event.objects.filter(inbox=held, source_id__endswith="behind-the-lock").count() == 1
