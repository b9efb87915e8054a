"""Step 2's tests (docs/tutorial/first-agent.md); CI runs every step's."""
# --8<-- [start:tests]

pytest_plugins = ["alwayson.testing"]

AGENT = "desk_2_remember.agent"


def test_it_remembers_across_runs(harness):
    desk = harness.inbox("desk", agent=AGENT)

    desk.chat("call me Dana")
    harness.run_until_idle()
    desk.chat("hi again")
    harness.run_until_idle()

    assert desk.said() == ["Hello Dana, that is message 1.", "Hello Dana, that is message 2."]
    assert desk.state == {"name": "Dana", "messages": 2}


# --8<-- [end:tests]
