"""Agents for the benchmarks: no model call, so the figures measure alwayson itself."""


def quiet(run):
    """Reads its events and ends without a message."""
    for event in run.events:
        event.payload  # noqa: B018


def reply(run):
    """Says one line per run: an outbox row committed with every finish."""
    run.say(f"handled {len(run.events)} event(s)")
