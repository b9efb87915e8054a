"""The chaos run's checker and plan, without a cluster: each invariant fails on records that
break it, and passes on records that keep it. (tests/chaos/test_chaos_pg.py runs the real thing.)"""

import copy
from collections import Counter
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from tests.chaos.agent import parse_run_record, run_record
from tests.chaos.check import Observed, check
from tests.chaos.network import split_bodies
from tests.chaos.plan import (
    DATABASE_FAULTS,
    FAILOVER,
    FAILOVER_FAULT_KINDS,
    FAULT_KINDS,
    PROXY_BLACKHOLE,
    PROXY_FAULTS,
    PROXY_LATENCY,
    PROXY_RESET,
    STOP,
    WARMUP,
    InboxPlan,
    Plan,
    PlannedDelivery,
    make_plan,
)

# Records and plans in memory: no database.
pytestmark = pytest.mark.engine_free

T = 1_800_000_000.0  # the records' clock: epoch seconds


def body(inbox, gen, claimed, *event_ids):
    events = [SimpleNamespace(pk=pk) for pk in event_ids]
    return run_record(inbox, gen, f"w1.{gen}", datetime.fromtimestamp(claimed, UTC), events)


def fault(kind, start, end=None, role=None, target=None, **extra):
    return {
        "kind": kind,
        "role": role,
        "target": target,
        "start": start,
        "end": start if end is None else end,
        "detail": "",
        **extra,
    }


@pytest.fixture
def world():
    """A small run where every invariant holds: inbox a (webhook, at least once) and inbox b
    (email, at most once), two delivered events, a timer tick and an approval answered yes."""
    plan = Plan(
        seed=1,
        seconds=60,
        outage=20,
        ttl=4,
        max_attempts=5,
        workers=1,
        concurrency=1,
        ingesters=1,
        inboxes=[
            InboxPlan("a", "webhook", "at_least_once", 1, 2, "coalesce", False),
            InboxPlan("b", "email", "at_most_once", 1, 2, "coalesce", False),
        ],
        deliveries=[
            PlannedDelivery("a", "chat", "m1", {}, [[1, "i1"]]),
            PlannedDelivery("b", "chat", "m2", {"ask": 5}, [[2, "i1"], [3, "i1"]]),
        ],
    )
    events = [
        (1, "a", "chat", "m1", 1, {}),
        (2, "b", "chat", "m2", 1, {}),
        (3, "a", "timer", "tick@T1", 2, {"scheduled_for": "T1", "skipped": 0}),
        (4, "b", "approval", "ap-m2", 2, {"answer": "yes"}),
    ]
    messages = [
        (10, "a", body("a", 1, T + 0, 1), T + 1),
        (11, "b", body("b", 1, T + 0.5, 2), T + 1.5),
        (12, "a", body("a", 2, T + 2, 3), T + 3),
        (13, "b", body("b", 2, T + 4, 4), T + 5),
    ]
    db = {
        "events": [
            {
                "id": pk,
                "inbox": inbox,
                "source": source,
                "source_id": source_id,
                "status": "done",
                "attempts": 1,
                "claim_gen": gen,
                "payload": payload,
                "error": "",
            }
            for pk, inbox, source, source_id, gen, payload in events
        ],
        "messages": [
            {
                "id": pk,
                "inbox": inbox,
                "body": text,
                "status": "sent",
                "created": created,
                "sent_at": created + 0.1,
                "urgent": False,
                "error": "",
            }
            for pk, inbox, text, created in messages
        ],
        "notices": [{"message_id": "<n1@alwayson>", "inbox": "b", "topic": "dead-events"}],
        "channels": {
            "a": {"kind": "webhook", "mode": "at_least_once"},
            "b": {"kind": "email", "mode": "at_most_once"},
        },
        "approvals": [{"inbox": "b", "request_id": "ap-m2", "answer": "yes", "expires_at": T + 10}],
        "timers": [
            {"inbox": "a", "key": "tick", "recurring": True, "done": True, "due": T, "expected": 1},
            {"inbox": "b", "key": "tick", "recurring": True, "done": True, "due": T, "expected": 0},
        ],
        "ledger": [
            {"key": "k1", "inbox": "a", "source": "chat", "source_id": "m1", "kind": "effect"},
            {"key": "k2", "inbox": "b", "source": "chat", "source_id": "m2", "kind": "effect"},
            {
                "key": "k3",
                "inbox": "b",
                "source": "approval",
                "source_id": "ap-m2",
                "kind": "approved",
            },  # fmt: skip
        ],
        "attempts": {"fresh": 3},
        "run_records": [
            {"inbox": inbox, "gen": gen, "outcome": "done", "events": [pk]}
            for pk, inbox, _, _, gen, _ in events
        ],
        "memory": [
            {
                "inbox": inbox,
                "gen": int(text.split("gen=")[1].split()[0]),
                "path": f"/memories/runs/{text.split('gen=')[1].split()[0]}",
                "content": text,
            }
            for _, inbox, text, _ in messages
        ],  # fmt: skip
    }
    db["memory_files"] = [
        {"inbox": v["inbox"], "path": v["path"], "content": v["content"]} for v in db["memory"]
    ]
    acks = [
        {"inbox": "a", "source": "chat", "source_id": "m1", "stored": True},
        {"inbox": "b", "source": "chat", "source_id": "m2", "stored": True},
        {"inbox": "b", "source": "chat", "source_id": "m2", "stored": False},
    ]
    answers = [
        {
            "inbox": "b",
            "request_id": "ap-m2",
            "step": 0,
            "decision": "yes",
            "given": "yes",
            "returned": "yes",
        },  # fmt: skip
    ]
    receipts = [
        {"t": T + at, "channel": channel, "key": key, "inbox": inbox, "bodies": [messages[n][2]]}
        for n, (at, channel, key, inbox) in enumerate(
            [
                (1.2, "webhook", "k-a1", "a"),
                (1.6, "email", "<k-b1>", "b"),
                (3.2, "webhook", "k-a2", "a"),
                (5.2, "email", "<k-b2>", "b"),
            ]
        )
    ]
    faults = [fault(kind, T + 30 + n, role="worker", target="w1.1") for n, kind in
              enumerate(FAULT_KINDS)]  # fmt: skip
    for record in faults:
        record.update(mid_transaction=True, answered=True)
    return Observed(
        plan=plan,
        db=db,
        acks=acks,
        answers=answers,
        receipts=receipts,
        faults=faults,
        drain={"drained": True, "seconds": 1.0},
        shutdown={"w1.1": 0},
    )


def failed(observed) -> list[str]:
    return [row.label for row in check(observed).failures]


def test_the_fixture_run_holds_every_invariant(world):
    report = check(world)
    assert failed(world) == [], report.render()
    assert report.value("committed runs") == 4
    assert "every invariant held" in report.render()


def test_a_memory_write_from_a_run_that_did_not_commit_fails(world):
    # A run of inbox a (generation 7) wrote memory, but no message says it committed.
    world.db["memory"].append(
        {"inbox": "a", "gen": 7, "path": "/memories/runs/7", "content": "lost"}
    )
    world.db["memory_files"].append({"inbox": "a", "path": "/memories/runs/7", "content": "x"})

    assert failed(world) == [
        "memory writes from runs that did not commit",
        "memory files other than what the committed runs wrote",
    ]


def test_a_committed_run_whose_memory_write_is_missing_or_changed_fails(world):
    del world.db["memory"][0]
    world.db["memory_files"][1]["content"] = "changed"

    assert failed(world) == [
        "committed runs without exactly one memory write of their record",
        "memory files other than what the committed runs wrote",
    ]


def test_two_committed_runs_of_one_inbox_that_overlap_fail(world):
    # Generation 2 of inbox a claimed before generation 1 had finished.
    world.db["messages"][2]["body"] = body("a", 2, T + 0.5, 3)
    world.receipts[2]["bodies"] = [world.db["messages"][2]["body"]]
    world.db["memory"][2]["content"] = world.db["memory_files"][2]["content"] = body(
        "a", 2, T + 0.5, 3
    )

    assert failed(world) == ["overlapping committed runs of one inbox"]


def test_an_event_finished_by_two_committed_runs_fails(world):
    world.db["messages"][2]["body"] = body("a", 2, T + 2, 1, 3)
    world.receipts[2]["bodies"] = [world.db["messages"][2]["body"]]

    assert "events finished by two committed runs" in failed(world)


def test_a_done_event_without_a_committed_run_fails(world):
    world.db["events"].append({**world.db["events"][0], "id": 5, "source_id": "m9"})
    world.plan.deliveries.append(PlannedDelivery("a", "chat", "m9", {}, [[4, "i1"]]))
    world.acks.append({"inbox": "a", "source": "chat", "source_id": "m9", "stored": True})
    world.db["ledger"].append({**world.db["ledger"][0], "key": "k9", "source_id": "m9"})

    assert failed(world) == ["done events without a committed run"]


def test_a_side_effect_performed_twice_fails(world):
    world.db["ledger"].append({**world.db["ledger"][0], "key": "another key for m1"})

    assert failed(world) == ["duplicate ledger effects"]


def test_a_done_event_whose_effect_never_happened_fails(world):
    del world.db["ledger"][0]

    assert failed(world) == ["done events missing their effect"]


def test_an_acknowledged_delivery_that_was_not_stored_is_lost(world):
    world.plan.deliveries.append(PlannedDelivery("a", "chat", "m7", {}, [[5, "i1"]]))
    world.acks.append({"inbox": "a", "source": "chat", "source_id": "m7", "stored": True})

    assert failed(world) == ["lost"]


def test_an_event_left_pending_after_the_drain_is_lost(world):
    world.db["events"][2]["status"] = "pending"

    assert "lost" in failed(world)


def test_an_event_nobody_sent_is_unexpected(world):
    world.db["events"].append(
        {**world.db["events"][0], "id": 6, "source_id": "forged", "status": "dead"}
    )

    assert "unexpected (stored, never sent)" in failed(world)


def test_a_key_acknowledged_as_new_twice_fails(world):
    world.acks[2]["stored"] = True

    assert failed(world) == ["keys acknowledged as new twice"]


def test_a_timer_occurrence_with_two_events_fails(world):
    world.db["events"].append({**world.db["events"][2], "id": 7, "source_id": "tick@T1bis"})
    world.db["messages"][2]["body"] = body("a", 2, T + 2, 3, 7)
    world.receipts[2]["bodies"] = [world.db["messages"][2]["body"]]

    assert "timer occurrences with more than one event" in failed(world)


def test_a_missed_timer_occurrence_not_counted_as_skipped_fails(world):
    world.db["timers"][0]["expected"] = 3  # two more occurrences due than events and skips

    assert failed(world) == ["recurring occurrences neither fired nor counted skipped"]
    world.db["events"][2]["payload"]["skipped"] = 2  # coalesced: one event, two skipped
    assert failed(world) == []


def test_an_answer_told_an_outcome_that_did_not_stand_fails(world):
    world.answers.append({**world.answers[0], "step": 1, "given": "no", "returned": "no"})

    assert failed(world) == ["answers told an outcome that did not stand"]


def test_an_answer_after_the_deadline_that_stood_fails(world):
    world.answers[0]["decision"] = "late"

    assert failed(world) == ["answers after the deadline that stood"]


def test_an_approval_without_its_answer_event_fails(world):
    world.db["approvals"].append(
        {"inbox": "b", "request_id": "ap-zz", "answer": "", "expires_at": T + 20}
    )

    assert failed(world) == ["approvals without an outcome"]


def test_an_at_least_once_repeat_is_counted_when_a_dispatcher_crash_explains_it(world):
    repeat = {**world.receipts[0], "t": T + 8}
    world.receipts.append(repeat)

    assert failed(world) == ["repeats without a crash to explain them"]

    world.faults.append(fault("kill", T + 4, role="dispatcher", target="d1.1"))
    report = check(world)
    assert failed(world) == []
    assert report.value("at-least-once deliveries repeated") == 1
    assert report.value("  of which under a different key") == 0


@pytest.mark.parametrize("kind", [PROXY_BLACKHOLE, PROXY_RESET])
def test_a_repeat_is_explained_by_the_dispatcher_s_network_silenced_or_reset(world, kind):
    world.receipts.append({**world.receipts[0], "t": T + 8})
    world.faults.append(fault(kind, T + 4, T + 10, role="dispatcher", target="d1.1"))

    assert failed(world) == []
    assert check(world).value("at-least-once deliveries repeated") == 1


def test_a_repeat_is_not_explained_by_latency_nor_by_a_worker_s_network(world):
    world.receipts.append({**world.receipts[0], "t": T + 8})
    world.faults.append(fault(PROXY_LATENCY, T + 4, T + 10, role="dispatcher", target="d1.1"))
    world.faults.append(fault(PROXY_BLACKHOLE, T + 4, T + 10, role="worker", target="w1.1"))

    assert failed(world) == ["repeats without a crash to explain them"]


def test_a_repeat_is_explained_by_a_failover(world):
    world.receipts.append({**world.receipts[0], "t": T + 8})
    world.faults.append(fault(FAILOVER, T + 6, T + 9))

    assert failed(world) == []


def test_a_repeat_under_a_different_key_fails_even_when_a_crash_explains_the_repeat(world):
    world.receipts.append({**world.receipts[0], "t": T + 8, "key": "a new key"})
    world.faults.append(fault("pg-restart-fast", T + 6, T + 9))

    assert check(world).value("  of which under a different key") == 1
    assert failed(world) == ["  of which under a different key"]


def test_an_at_most_once_message_delivered_twice_fails(world):
    world.receipts.append({**world.receipts[1], "t": T + 9})
    world.faults.append(fault("kill", T + 4, role="dispatcher", target="d1.1"))

    assert failed(world) == ["at-most-once deliveries repeated"]


def test_an_at_most_once_loss_must_be_explained_by_a_crash(world):
    lost = world.receipts.pop(1)

    assert failed(world) == ["at-most-once losses without a crash"]

    world.faults.append(fault("kill", lost["t"], role="dispatcher", target="d2.1"))
    assert failed(world) == []
    assert check(world).value("at-most-once rows lost in a crash") == 1


def test_an_at_least_once_loss_fails_whatever_crashed(world):
    world.receipts.pop(0)
    world.faults.append(fault("kill", T + 1.1, role="dispatcher", target="d1.1"))

    assert failed(world) == ["at-least-once rows never delivered"]


def test_a_delivery_of_a_message_never_queued_fails(world):
    world.receipts.append({**world.receipts[0], "bodies": ["chaos-run inbox=a gen=99 ..."]})

    assert failed(world) == ["messages received that were never queued"]


def test_an_operators_alert_by_email_is_a_notice_not_an_unqueued_message(world):
    alert = {**world.receipts[0], "channel": "email", "key": "<n1@alwayson>"}
    world.receipts.append({**alert, "bodies": ["1 event went dead in inbox b (keys: chat:m9)"]})

    assert failed(world) == []


@pytest.mark.parametrize("kind", [STOP, *PROXY_FAULTS])
def test_a_fault_kind_never_injected_fails(world, kind):
    world.faults = [f for f in world.faults if f["kind"] != kind]

    assert failed(world) == [kind]


def test_the_failover_scenario_needs_its_failover_and_no_restart(world):
    world.plan.failover = True
    world.faults = [f for f in world.faults if f["kind"] not in DATABASE_FAULTS]

    assert failed(world) == [FAILOVER]

    world.faults.append(fault(FAILOVER, T + 40, T + 43))
    report = check(world)
    assert failed(world) == []
    assert report.value("  failover: lag, then primary down (s)") == 3.0


def test_processes_must_die_only_when_killed_and_stop_cleanly(world):
    world.exits.append(
        {"name": "w1", "incarnation": 1, "pid": 1, "code": 1, "expected": False, "why": ""}
    )
    world.shutdown["d1.2"] = -9

    assert failed(world) == [
        "processes that died on their own",
        "processes that did not stop cleanly on SIGTERM",
    ]


def test_a_run_that_did_not_drain_fails(world):
    world.drain = {"drained": False, "seconds": 180, "left": {"events pending": 3}}

    assert failed(world) == ["left in flight after the drain"]


def test_the_records_round_trip_through_the_work_directory(world, tmp_path):
    (tmp_path / "plan.json").write_text(world.plan.to_json())
    world.save(tmp_path / "observed.json")

    again = Observed.load(tmp_path)

    assert check(again).render() == check(copy.deepcopy(world)).render()


def test_a_run_record_reads_back_from_its_message_body():
    claimed = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)
    text = run_record("desk", 7, "w2.3", claimed, [SimpleNamespace(pk=4), SimpleNamespace(pk=9)])

    assert parse_run_record(text) == {
        "inbox": "desk",
        "gen": 7,
        "holder": "w2.3",
        "claimed": claimed.timestamp(),
        "events": [4, 9],
    }
    assert parse_run_record("Refunded order 881") is None


def test_an_email_body_splits_into_its_messages_whatever_the_line_ends():
    assert split_bodies("one\r\n\r\ntwo\r\n") == ["one", "two"]
    assert split_bodies("one\n\ntwo") == ["one", "two"]


# --- the plan ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds, outage", [(45, 5), (60, 20), (90, 20), (300, 20)])
def test_every_fault_kind_is_scheduled_whatever_the_seed(seconds, outage):
    for seed in range(100):
        plan = make_plan(seed, seconds=seconds, outage=outage)
        kinds = Counter(f.kind for f in plan.faults)
        assert all(kinds[kind] >= 1 for kind in FAULT_KINDS), (seed, kinds)
        assert kinds[FAILOVER] == 0
        assert all(WARMUP <= f.at <= seconds for f in plan.faults)


@pytest.mark.parametrize("seconds", [45, 60, 240])
def test_the_failover_scenario_fails_over_once_in_place_of_the_restarts(seconds):
    for seed in range(100):
        plan = make_plan(seed, seconds=seconds, failover=True)
        kinds = Counter(f.kind for f in plan.faults)
        assert all(kinds[kind] >= 1 for kind in FAILOVER_FAULT_KINDS), (seed, kinds)
        assert kinds[FAILOVER] == 1
        assert set(kinds) == set(FAILOVER_FAULT_KINDS), (seed, kinds)
        assert all(WARMUP <= f.at <= seconds for f in plan.faults)
        (failover,) = [f for f in plan.faults if f.kind == FAILOVER]
        opening = [f for f in plan.faults if f.kind == STOP and f.at + f.duration < failover.at]
        assert len(opening) >= 2, seed


def test_network_faults_last_past_the_lease_or_add_latency_for_a_while():
    plan = make_plan(3, seconds=240)
    network = [f for f in plan.faults if f.kind in PROXY_FAULTS]
    assert len(network) >= 240 // 6
    for f in network:
        if f.kind == PROXY_BLACKHOLE:
            assert plan.ttl < f.duration <= plan.ttl + 3
        elif f.kind == PROXY_LATENCY:
            assert 3 <= f.duration <= 10 and 0.02 <= f.latency <= 0.3
        else:
            assert f.duration == 0


def test_the_database_faults_do_not_overlap_and_spare_the_opening_stalls():
    for seed in range(100):
        plan = make_plan(seed)
        database = sorted(
            (f.at, f.at + f.duration) for f in plan.faults if f.kind in DATABASE_FAULTS
        )
        assert all(end <= nxt for (_, end), (nxt, _) in zip(database, database[1:], strict=False))
        # At least two workers stalled and woken before the database's first fault, with a
        # few seconds to spare (the injector may search that long for a run in flight).
        opening = [
            f
            for f in plan.faults
            if f.kind == STOP and f.role == "worker" and f.at + f.duration + 3 < database[0][0]
        ]
        assert len(opening) >= 2, seed


def test_a_seed_replays_the_same_plan():
    assert make_plan(42).to_json() == make_plan(42).to_json()
    assert make_plan(42).to_json() != make_plan(43).to_json()
    failover = make_plan(42, failover=True)
    assert Plan.from_json(failover.to_json()) == failover
    assert failover.to_json() == make_plan(42, failover=True).to_json()


def test_the_plan_mixes_duplicate_deliveries_and_every_flag():
    plan = make_plan(7)
    sends = [len(d.sends) for d in plan.deliveries]
    assert max(sends) == 2 and sends.count(2) > len(sends) // 10
    assert {"chat", "standard"} == {d.source for d in plan.deliveries}
    flags = Counter(flag for d in plan.deliveries for flag in d.flags)
    assert set(flags) == {"sleep", "ask", "follow", "urgent", "poison"}
    assert {(i.kind, i.mode) for i in plan.inboxes} == {
        ("webhook", "at_least_once"),
        ("webhook", "at_most_once"),
        ("email", "at_least_once"),
        ("email", "at_most_once"),
    }


@pytest.mark.parametrize(
    "options, error",
    [
        ({"seconds": 30}, "seconds must be at least"),
        ({"seconds": 60, "outage": 30}, "outage must be positive and at most"),
        ({"seconds": 60, "outage": 0}, "outage must be positive"),
    ],
)
def test_a_run_too_short_for_its_schedule_is_refused(options, error):
    with pytest.raises(ValueError, match=error):
        make_plan(1, **options)


def test_an_at_most_once_send_that_failed_in_a_stall_is_counted_apart(world):
    world.receipts.pop(1)
    world.db["messages"][1].update(status="failed", error="timed out")

    assert failed(world) == ["at-most-once losses without a crash"]

    sent_at = world.db["messages"][1]["sent_at"]
    world.faults.append(fault("stop", sent_at - 1, sent_at + 5, role="dispatcher"))
    report = check(world)
    assert failed(world) == []
    assert report.value("at-most-once sends failed in a stall (not retried)") == 1
    assert report.value("at-most-once rows lost in a crash") == 0


# --- the loopback receivers -------------------------------------------------------------------


def test_the_receivers_record_each_delivery_with_its_key_and_messages(tmp_path):
    import json
    import smtplib
    import urllib.request
    from email.message import EmailMessage

    from tests.chaos.network import Receipts, SmtpReceiver, WebhookReceiver

    receipts = Receipts(tmp_path / "receipts.jsonl")
    webhook, smtp = WebhookReceiver(receipts), SmtpReceiver(receipts)
    webhook.start()
    smtp.start()
    try:
        payload = {"inbox": "a", "messages": [{"id": 1, "body": "one"}, {"id": 2, "body": "two"}]}
        request = urllib.request.Request(
            f"{webhook.url}/a",
            data=json.dumps(payload).encode(),
            headers={"Idempotency-Key": "k1", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        message = EmailMessage()  # plain text with an HTML alternative, as the outbox sends
        message["Subject"] = "[b] three"
        message["From"], message["To"] = "alwayson@localhost", "owner@example.com"
        message["Message-ID"] = "<k2@alwayson>"
        message.set_content("three\n\nfour")
        message.add_alternative("<p>three</p><p>four</p>", subtype="html")
        with smtplib.SMTP("127.0.0.1", smtp.port, timeout=10) as client:
            client.send_message(message)
    finally:
        webhook.stop()
        smtp.stop()

    got = [(r["channel"], r["key"], r["inbox"], r["bodies"]) for r in receipts.snapshot()]
    assert got == [
        ("webhook", "k1", "a", ["one", "two"]),
        ("email", "<k2@alwayson>", "b", ["three", "four"]),
    ]


def test_a_committed_run_without_its_done_record_fails(world):
    del world.db["run_records"][0]

    assert "committed runs without exactly one record marked done, listing their events" in (
        failed(world)
    )


def test_a_record_marked_done_for_a_run_that_did_not_commit_fails(world):
    world.db["run_records"].append({"inbox": "a", "gen": 9, "outcome": "done", "events": [1]})

    assert "records marked done whose run did not commit" in failed(world)
