import pytest

from alwayson.runtime.api import acquire, claim_batch, finish, ingest
from inbox.services import Held


@pytest.mark.django_db
def test_one_event_runs_once(inbox, t0):
    assert ingest(inbox, "chat", "m1", {"text": "hi"}, now=t0)
    gen = acquire(inbox, "A", now=t0)
    batch = claim_batch(inbox, "A", gen, now=t0)
    assert [e.source_id for e in batch] == ["m1"]
    assert finish(Held(inbox, "A", gen, [e.pk for e in batch]), now=t0)
    batch[0].refresh_from_db()
    assert batch[0].status == "done"
