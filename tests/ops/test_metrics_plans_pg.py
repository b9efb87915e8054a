"""The /metrics scrape reads state through the indexes the workers already use: the plans
on PostgreSQL, on the data of tests/contracts/test_query_plans_pg.py (its module-scoped
`world`, in a module of its own so that its open transaction ends with this module)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alwayson.ops import metrics
from inbox.services import acquire, claim_batch
from tests.support.plans import analyze, explain


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_the_scrape_reads_state_through_the_workers_indexes(world, t0):
    gen = acquire(world, "A", now=t0)
    claim_batch(world, "A", gen, now=t0)
    analyze()
    with CaptureQueriesContext(connection) as captured:
        list(metrics.DatabaseCollector(t0).state(t0))
    statements = [q["sql"] for q in captured.captured_queries]

    expected = [  # (table, what the statement filters on, the index its plan must use)
        ('"inbox_event"', "'pending'", "event_pending_idx"),
        ('"inbox_event"', "'running'", "event_running_idx"),
        ('"inbox_event"', "'dead'", "event_dead_idx"),
        ('"inbox_lease"', "", "lease_work_idx"),
        ('"inbox_inbox"', "", "inbox_inbox_pkey"),
        ('"outbox_outboxmessage"', "'held'", "outbox_held_idx"),
        ('"outbox_outboxmessage"', "'failed'", "outbox_failed_idx"),
        ('"outbox_notice"', "'held'", "notice_due_idx"),
        ('"outbox_notice"', "'failed'", "notice_failed_idx"),
        ('"timers_timer"', "", "timer_due_idx"),
        ('"approvals_approval"', "", "approval_waiting_idx"),
        ('"alwayson_process"', "", "process_beat_idx"),
    ]
    for statement in statements:
        plan = explain(statement)
        assert "Seq Scan" not in plan, f"{statement}\n{plan}"
        table = statement.split(" FROM ", 1)[1].split()[0]
        indexes = [i for t, marker, i in expected if t == table and marker in statement]
        assert len(indexes) == 1, statement
        assert indexes[0] in plan, f"{statement}\n{plan}"
    assert len(statements) == 14, statements
