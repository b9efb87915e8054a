"""A run that commits nothing, for replaying a recorded run against a candidate agent
(alwayson/claude/replay.py): its verbs are kept as effects that are never applied, it
never loses its lease nor renews it, it makes no outbound HTTP call, and every application
tool it runs is a stub that records the call and answers with a given text.
"""

import dataclasses
from contextlib import contextmanager

from approvals.services import Ask

from . import tools
from .run import Run


class NotInSandbox(Exception):
    """What a replayed run may not do (an outbound call): the candidate run ends with it."""


class SandboxRun(Run):
    """A Run over recorded events and the state its recorded run started from. The worker
    never sees it: no lease is held, so nothing it does can be fenced or committed."""

    def __init__(self, inbox, generation, events, state):
        # A clock that never moves: the lease's deadline is never reached.
        super().__init__(inbox, "replay", generation, events, state, clock=lambda: 0.0)

    def renew(self):
        self.check_lease()  # no database write: there is no lease to renew

    @property
    def http(self):
        raise NotInSandbox(
            "run.http is not available in a replay: a replayed run makes no outbound call"
        )

    def ask(self, request_id: str, action: str, expires_in, details=None, **options):
        # Not checked against the approvals as they are now: the recorded run's own request
        # has been answered since, and a replay asks it again without harm (nothing commits).
        ask = Ask(
            self.inbox.pk,
            request_id,
            action,
            expires_in,
            details=details,
            generation=self.generation,
            **options,
        )
        self._effects.append(ask)
        self.asked += 1

    def recorded_effects(self) -> list:
        """What the run would have committed, without its state (the sandbox's own)."""
        return list(self._effects)


@contextmanager
def stubbed_tools(answer: str):
    """While inside, every registered application tool records its call in the list this
    yields ({"tool", "arguments"}) and returns `answer` instead of running. For one process
    (a replay command), never for a worker: the registry is the process's."""
    would_call = []
    # A replay's process may not have imported the tools' modules yet (a worker's first run
    # does): imported inside, they would register the real tools over the stubs.
    tools.application_tools()
    saved = dict(tools._registry)

    def stub_of(name):
        def stub(call, **arguments):
            would_call.append({"tool": name, "arguments": arguments})
            return answer

        return stub

    for name, registered in saved.items():
        tools._registry[name] = dataclasses.replace(registered, function=stub_of(name))
    try:
        yield would_call
    finally:
        tools._registry.clear()
        tools._registry.update(saved)
