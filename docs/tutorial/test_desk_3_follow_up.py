"""Step 3's tests (docs/tutorial/first-agent.md); CI runs every step's."""
# --8<-- [start:tests]

from datetime import timedelta

pytest_plugins = ["alwayson.testing"]

AGENT = "desk_3_follow_up.agent"


def test_it_follows_up_a_day_after_the_last_message(harness):
    desk = harness.inbox("desk", agent=AGENT)
    desk.chat("call me Dana")
    harness.run_until_idle()
    harness.advance(hours=12)
    desk.chat("one more thing")
    harness.run_until_idle()

    [follow_up] = desk.timers()
    assert (follow_up.key, follow_up.due) == ("follow-up", harness.now + timedelta(days=1))

    harness.advance(hours=23)
    assert desk.said()[-1] == "Hello Dana, that is message 2."
    harness.advance(hours=1)
    assert desk.said()[-1] == "Hello Dana, is there anything else I can do?"
    assert desk.timers() == []


# --8<-- [end:tests]
