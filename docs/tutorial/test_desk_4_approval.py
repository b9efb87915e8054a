"""Step 4's tests (docs/tutorial/first-agent.md); CI runs every step's."""
# --8<-- [start:tests]

import pytest

pytest_plugins = ["alwayson.testing"]

AGENT = "desk_4_approval.agent"


def test_a_refund_waits_for_an_approver(harness):
    desk = harness.inbox("desk", agent=AGENT)
    dana = desk.member("dana", role="approver")
    desk.chat("refund 881")
    harness.run_until_idle()

    [approval] = desk.waiting_for_approval()
    assert approval.action == "refund order 881"
    assert harness.answer(approval, "yes", by=dana) == "yes"
    harness.run_until_idle()

    assert desk.said()[-1] == "Refunded order 881, approved by dana."


def test_a_refund_nobody_approves_expires_after_four_hours(harness):
    desk = harness.inbox("desk", agent=AGENT)
    desk.chat("refund 881")
    harness.run_until_idle()

    harness.advance(hours=4)

    assert desk.waiting_for_approval() == []
    assert desk.said()[-1] == (
        "Nobody approved the refund of order 881 in time: nothing was refunded."
    )
    assert harness.answer(desk.approvals()[0], "yes") == "expired"  # too late now


def test_a_viewer_cannot_approve(harness):
    from approvals.services import MayNotAnswer

    desk = harness.inbox("desk", agent=AGENT)
    vic = desk.member("vic", role="viewer")
    desk.chat("refund 881")
    harness.run_until_idle()

    [approval] = desk.waiting_for_approval()
    with pytest.raises(MayNotAnswer):
        desk.answer(approval.request_id, "yes", by=vic)


def test_an_order_asked_about_again_after_its_answer_is_a_new_request(harness):
    desk = harness.inbox("desk", agent=AGENT)
    desk.chat("refund 881")
    harness.run_until_idle()
    harness.answer(desk.waiting_for_approval()[0], "no")
    harness.run_until_idle()

    desk.chat("refund 881")
    harness.run_until_idle()

    [again] = desk.waiting_for_approval()
    assert again.action == "refund order 881"
    assert desk.said()[-1] == "Refund order 881? I have asked for approval."


# --8<-- [end:tests]
