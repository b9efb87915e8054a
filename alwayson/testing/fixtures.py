"""The pytest fixtures of alwayson.testing (registered by `pytest_plugins =
["alwayson.testing"]`). They need pytest-django: `harness` asks for its `db` fixture, so a
test that uses it gets the database (and `@pytest.mark.django_db(transaction=True)` is
honoured); `scripted_model` sets its settings through pytest-django's `settings`."""

import pytest


@pytest.fixture
def scripted_model(settings):
    """A ScriptedModel the Claude agent reaches for the test; a request past its script
    fails the test."""
    from .model import ScriptedModel, forget_clients

    model = ScriptedModel().start()
    for name, value in model.settings.items():
        setattr(settings, name, value)
    forget_clients()
    yield model
    model.stop()
    forget_clients()
    assert not model.unexpected, f"the model got requests past its script: {model.unexpected}"


@pytest.fixture
def harness(request, db):
    """A started Harness, its clock pinned for the test. With `scripted_model` in the same
    test, `tool_calls()` reads that model's requests."""
    from .harness import Harness

    model = (
        request.getfixturevalue("scripted_model")
        if "scripted_model" in request.fixturenames
        else None
    )
    with Harness(model=model) as started:
        yield started
