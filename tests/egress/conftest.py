"""The egress tests' service: a loopback server that answers as tests/support/egress.py says,
and the settings that point the gateway's services at it with planted credentials."""

import pytest

from tests.support.egress import QUERY_SECRET, SECRET, answer, services_for
from tests.support.loopback import Loopback


@pytest.fixture
def service():
    with Loopback(answer) as server:
        yield server


@pytest.fixture
def egress_settings(settings, service, monkeypatch):
    monkeypatch.setenv("PAYMENTS_TOKEN", SECRET)
    monkeypatch.setenv("MAPS_KEY", QUERY_SECRET)
    settings.ALWAYSON_EGRESS_SERVICES = services_for(service.url())
    return settings
