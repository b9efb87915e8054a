"""A message sent mid-run reaches the run (issue 40, part 4), for any agent: `run.more()`
under the inbox's `join`, on both databases.

The worker runs for real (Worker.step: the take, the agent, the fenced finish); each agent
here is a rule-based one that, mid-run, sees the owner send a chat message and asks for it.
"""

import re
from datetime import timedelta

import pytest
from django.db.models import F

from alwayson.runtime.models import AgentConfig, MidRun
from alwayson.runtime.run import LeaseLost
from alwayson.runtime.worker import Worker
from approvals.models import Approval
from approvals.services import answer_approval
from inbox import clock
from inbox.models import Event, Lease, RunRecord
from inbox.services import acquire, claim_batch, claim_more, ingest
from outbox.models import OutboxMessage

pytestmark = pytest.mark.django_db


@pytest.fixture
def joining(inbox):
    AgentConfig.objects.create(inbox=inbox, mid_run=MidRun.JOIN)
    return inbox


def chat(inbox, key, text):
    assert ingest(inbox, "chat", key, {"text": text, "from": "owner"})


def event(inbox, key) -> Event:
    return Event.objects.get(inbox=inbox, source_id=key)


def said(inbox):
    return list(OutboxMessage.objects.filter(inbox=inbox).values_list("body", flat=True))


def keys(events):
    return [e.source_id for e in events]


def takeover(inbox):
    """An hour later the lost run's lease and its events' backoff have lapsed."""
    Event.objects.filter(inbox=inbox).update(updated=F("updated") - timedelta(hours=1))
    Lease.objects.filter(inbox=inbox).update(until=None, work_at=clock.database_now())


def refund_agent(seen):
    """Refunds what the last message says, after reading what the owner sent meanwhile."""

    def agent(run):
        chat(run.inbox, "m2", "actually, make it 600")
        joined = run.more()
        seen.append((keys(joined), keys(run.events), keys(run.joined)))
        run.say(f"refunding: {run.events[-1].payload['text']}")

    return agent


def test_run_more_takes_a_message_sent_mid_run_and_the_finish_marks_it_done(joining):
    inbox = joining
    chat(inbox, "m1", "refund order 7: 500")
    seen = []

    result = Worker("w1", refund_agent(seen)).step()

    assert seen == [(["m2"], ["m1", "m2"], ["m2"])]
    assert (result.outcome, result.events) == ("said 1", 2)
    assert said(inbox) == ["refunding: actually, make it 600"]
    m1, m2 = event(inbox, "m1"), event(inbox, "m2")
    # Claimed by the claim's rules, under the run's generation, done in its finish.
    assert (m2.status, m2.attempts, m2.claim_gen) == ("done", 1, result.generation)
    assert m1.status == "done"
    record = RunRecord.objects.get(inbox=inbox, generation=result.generation)
    assert (record.outcome, record.events) == ("done", [m1.pk, m2.pk])
    assert Worker("w1", refund_agent([])).step() is None  # nothing left for a next run


def test_run_more_with_nothing_new_takes_nothing_and_the_run_ends_as_before(joining):
    inbox = joining
    chat(inbox, "m1", "hello")
    seen = []

    def agent(run):
        seen.append((run.more(), run.joined))
        run.say("hi")

    result = Worker("w1", agent).step()

    assert seen == [([], [])]
    assert (result.outcome, result.events) == ("said 1", 1)


@pytest.mark.parametrize("configured", [False, True], ids=["no configuration", "queue"])
def test_under_queue_a_message_sent_mid_run_waits_for_the_next_run(inbox, configured):
    if configured:
        AgentConfig.objects.create(inbox=inbox)
        assert AgentConfig.objects.get(inbox=inbox).mid_run == MidRun.QUEUE  # the default
    chat(inbox, "m1", "refund order 7: 500")
    seen = []

    first = Worker("w1", refund_agent(seen)).step()

    assert seen == [([], ["m1"], [])]
    assert (first.outcome, first.events) == ("said 1", 1)
    assert said(inbox) == ["refunding: refund order 7: 500"]
    m2 = event(inbox, "m2")
    assert (m2.status, m2.attempts, m2.claim_gen) == ("pending", 0, None)

    def reads(run):
        seen.append(keys(run.events))

    second = Worker("w1", reads).step()

    assert seen[-1] == ["m2"] and second.generation > first.generation


def test_a_finish_refused_after_a_join_puts_the_joined_event_back_with_the_others(joining):
    inbox = joining
    chat(inbox, "m1", "refund order 7: 500")

    def agent(run):
        chat(inbox, "m2", "actually, make it 600")
        assert keys(run.more()) == ["m2"]
        run.say("refunding 600")
        # Another worker takes the inbox over before this run's finish.
        Lease.objects.filter(inbox=inbox).update(holder="another-worker")

    result = Worker("w1", agent).step()

    assert (result.outcome, result.events) == ("refused", 2)
    assert said(inbox) == []  # the run's message was not committed
    m1, m2 = event(inbox, "m1"), event(inbox, "m2")
    assert [(e.status, e.attempts, e.claim_gen) for e in (m1, m2)] == [
        ("running", 1, result.generation)
    ] * 2
    refused = RunRecord.objects.get(inbox=inbox, generation=result.generation)
    assert (refused.outcome, refused.events) == ("refused", [m1.pk, m2.pk])
    takeover(inbox)
    claimed = []

    Worker("w2", lambda run: claimed.append(keys(run.events))).step()

    # The next take settles both as the claim rules say: back to pending after their
    # backoff, the attempt counted; each is then a retry, claimed alone.
    assert claimed == [["m1"]]
    m2 = event(inbox, "m2")
    assert (m2.status, m2.attempts) == ("pending", 1)
    assert m2.error == f"worker lost its lease during the run (generation {result.generation})"


def test_a_run_that_fails_after_a_join_fails_the_joined_event_with_the_others(joining):
    inbox = joining
    chat(inbox, "m1", "refund order 7: 500")

    def agent(run):
        chat(inbox, "m2", "actually, make it 600")
        run.more()
        raise ValueError("the payments provider is down")

    result = Worker("w1", agent).step()

    assert (result.recorded, result.events) == ("error", 2)
    for key in ("m1", "m2"):
        joined = event(inbox, key)
        assert (joined.status, joined.attempts) == ("pending", 1)
        assert joined.error.endswith("ValueError: the payments provider is down")
        assert joined.available_at > joined.updated  # after its backoff


def test_a_run_lost_after_a_join_leaves_the_joined_event_to_the_next_claim(joining):
    inbox = joining
    chat(inbox, "m1", "refund order 7: 500")

    def agent(run):
        chat(inbox, "m2", "actually, make it 600")
        run.more()
        run.mark_lost()
        run.renew()

    result = Worker("w1", agent).step()

    assert (result.outcome, result.events) == ("fenced", 2)
    assert event(inbox, "m2").status == "running"  # no finish: the next claim settles it
    takeover(inbox)
    Worker("w2", lambda run: None).step()
    assert (event(inbox, "m2").status, event(inbox, "m2").attempts) == ("pending", 1)


def test_run_more_after_the_lease_was_taken_over_raises_lease_lost_and_takes_nothing(joining):
    inbox = joining
    chat(inbox, "m1", "refund order 7: 500")
    raised = []

    def agent(run):
        Lease.objects.filter(inbox=inbox).update(holder="another-worker")
        chat(inbox, "m2", "actually, make it 600")
        with pytest.raises(LeaseLost) as lost:
            run.more()
        raised.append(str(lost.value))
        raise lost.value

    result = Worker("w1", agent).step()

    assert raised and "no longer this run's" in raised[0]
    assert (result.outcome, result.events) == ("fenced", 1)
    m2 = event(inbox, "m2")
    assert (m2.status, m2.attempts) == ("pending", 0)


def test_only_chat_messages_never_attempted_join(joining):
    inbox = joining
    chat(inbox, "m1", "refund order 7: 500")
    joined = []

    def agent(run):
        assert ingest(inbox, "shop", "order-8", {"status": "paid"})
        chat(inbox, "m2", "and order 8 too")
        joined.append(keys(run.more()))

    Worker("w1", agent).step()

    assert joined == [["m2"]]
    assert event(inbox, "order-8").status == "pending"  # a webhook waits for the next run

    # A chat message back from a failed run is a retry: it never joins another run's batch.
    chat(inbox, "m3", "hello")
    Event.objects.filter(inbox=inbox, source_id="order-8").update(status="done")
    Event.objects.filter(inbox=inbox, source_id="m3").update(attempts=1, error="crashed")

    def agent_again(run):
        chat(inbox, "m4", "anyone there?")
        joined.append((keys(run.events), keys(run.more())))

    Worker("w1", agent_again).step()

    # m3, a retry, is claimed alone; its run joins nothing, not even the fresh m4.
    assert joined[-1] == (["m3"], [])
    assert (event(inbox, "m4").status, event(inbox, "m4").attempts) == ("pending", 0)


def test_a_joined_message_never_answers_an_approval(joining):
    inbox = joining
    chat(inbox, "m1", "refund order 7: 900")
    Worker("w1", lambda run: run.ask("refund-7", "refund order 7 (900 EUR)", 3600)).step()
    chat(inbox, "m2", "what is the status of order 8?")
    runs = []

    def agent(run):
        chat(inbox, "m3", "yes, approved, go ahead with the refund")
        answer_approval(inbox, "refund-7", "yes")  # a person answers on the page meanwhile
        runs.append((keys(run.events), keys(run.more())))

    Worker("w1", agent).step()

    # The chat message joined; the answer did not: it is the approval's own event, for the
    # next run, and only it answers the approval.
    assert runs == [(["m2"], ["m3"])]
    answer = Event.objects.get(inbox=inbox, source="approval", source_id="refund-7")
    assert (answer.status, answer.attempts) == ("pending", 0)
    assert Approval.objects.get(inbox=inbox, request_id="refund-7").answer == "yes"

    Worker("w1", lambda run: runs.append((keys(run.events), keys(run.more())))).step()

    assert runs[-1] == (["refund-7"], [])


def test_a_chat_message_joined_while_an_approval_waits_leaves_it_waiting(joining):
    inbox = joining
    chat(inbox, "m1", "refund order 7: 900")
    Worker("w1", lambda run: run.ask("refund-7", "refund order 7 (900 EUR)", 3600)).step()
    chat(inbox, "m2", "status of order 8?")

    def agent(run):
        chat(inbox, "m3", "yes, approved")
        assert keys(run.more()) == ["m3"]

    Worker("w1", agent).step()

    approval = Approval.objects.get(inbox=inbox, request_id="refund-7")
    assert (approval.answer, approval.answered_at) == ("", None)
    assert not Event.objects.filter(inbox=inbox, source="approval").exists()


def test_claim_more_is_fenced_and_checks_its_sources(inbox, t0, ttl):
    gen = acquire(inbox, "A", now=t0)
    ingest(inbox, "chat", "m1", {"text": "hello"}, now=t0)
    [m1] = claim_batch(inbox, "A", gen, now=t0)
    assert claim_more(inbox, "A", gen, ["chat"], now=t0) == []
    ingest(inbox, "chat", "m2", {"text": "again"}, now=t0 + ttl / 4)
    assert claim_more(inbox, "A", gen, ["chat"], now=t0) == []  # not due yet
    # Another holder, an older generation or a lapsed lease: refused (None), nothing taken.
    assert claim_more(inbox, "B", gen, ["chat"], now=t0 + ttl / 2) is None
    assert claim_more(inbox, "A", gen - 1, ["chat"], now=t0 + ttl / 2) is None
    assert claim_more(inbox, "A", gen, ["chat"], now=t0 + 2 * ttl) is None
    assert event(inbox, "m2").status == "pending"
    [m2] = claim_more(inbox, "A", gen, ("chat",), now=t0 + ttl / 2)
    assert (m2.source_id, m2.status, m2.attempts, m2.claim_gen) == ("m2", "running", 1, gen)
    assert event(inbox, "m1").attempts == 1  # the batch's own events are left as they were
    for sources, why in [
        ("chat", "sources must be a non-empty list of sources, not 'chat'"),
        ([], "sources must be a non-empty list of sources, not []"),
        ([""], "sources must be a non-empty string"),
        (["x" * 101], "sources is longer than 100 characters"),
    ]:
        with pytest.raises(ValueError, match=re.escape(why)):
            claim_more(inbox, "A", gen, sources, now=t0 + ttl / 2)
