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

    with pytest.raises(MayNotAnswer):
        desk.answer("refund-881", "yes", by=vic)


# --8<-- [end:tests]
