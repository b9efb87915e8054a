"""The spans alwayson opens: the worker's invoke_agent run, the Claude agent's chat and
execute_tool spans inside it. Exported through the loopback OTLP receiver (conftest.py)."""

import pytest

from alwayson import tracing
from alwayson.runtime.api import ingest
from alwayson.runtime.worker import Worker


def attributes(span):
    """An exported span's attributes as plain Python values."""
    out = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        value = getattr(a.value, kind)
        if kind == "array_value":
            value = [getattr(v, v.WhichOneof("value")) for v in value.values]
        out[a.key] = value
    return out


def saying_agent(run):
    run.say("hello")


@pytest.mark.django_db
def test_a_worker_step_exports_one_invoke_agent_span_with_the_runs_attributes(receiver, inbox):
    ingest(inbox, "chat", "m1", {})
    ingest(inbox, "chat", "m2", {})

    result = Worker("w1", saying_agent).step()
    tracing.force_flush()

    (run,) = receiver
    name = f"{__name__}.saying_agent"
    assert run.name == f"invoke_agent {name}"
    assert run.kind == run.SPAN_KIND_INTERNAL
    assert attributes(run) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": name,
        "alwayson.inbox": inbox.slug,
        "alwayson.generation": result.generation,
        "alwayson.events": 2,
        "alwayson.outcome": result.outcome,
    }


@pytest.mark.django_db
def test_an_agent_with_a_name_is_traced_by_it_and_its_failure_is_the_outcome(receiver, inbox):
    class Failing:
        name = "refunds"

        def __call__(self, run):
            raise RuntimeError("boom")

    ingest(inbox, "chat", "m1", {})

    result = Worker("w1", Failing()).step()
    tracing.force_flush()

    (run,) = receiver
    assert run.name == "invoke_agent refunds"
    assert result.outcome.startswith("error: ")
    assert attributes(run)["alwayson.outcome"] == result.outcome


@pytest.mark.django_db
def test_with_tracing_off_a_worker_step_exports_nothing(receiver, inbox):
    tracing.shutdown()
    ingest(inbox, "chat", "m1", {})

    result = Worker("w1", saying_agent).step()

    assert result.events == 1
    assert not tracing.enabled()
    assert receiver == []
