"""Step 1's tests (docs/tutorial/first-agent.md); CI runs every step's."""
# --8<-- [start:tests]

pytest_plugins = ["alwayson.testing"]

AGENT = "desk_1_reply.agent"


def test_it_answers_a_chat_message(harness):
    desk = harness.inbox("desk", agent=AGENT)

    desk.chat("hello")
    harness.run_until_idle()

    assert desk.said() == ["Hello desk-owner, you said: hello"]
    [email] = desk.sent()
    assert (email.channel, email.to) == ("email", "desk-owner@example.com")


# --8<-- [end:tests]
