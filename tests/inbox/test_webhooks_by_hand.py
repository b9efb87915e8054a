"""docs/reference/webhooks.md's "Sending one by hand": its shell blocks, run as written with
bash, curl and openssl against a live server, deliver a signed webhook that is stored. The
page cannot rot: a wrong header, signature or command fails here."""

import json
import os
import re
import subprocess

import pytest

from inbox.models import Event
from tests.support.paths import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = ROOT / "docs" / "reference" / "webhooks.md"
DOCUMENTED_SERVER = "http://127.0.0.1:8000"


def documented_block(scheme) -> str:
    """The section's shell block that posts to `scheme`'s endpoint."""
    section = PAGE.read_text().split("## Sending one by hand\n", 1)[1].split("\n## ", 1)[0]
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if f"/hooks/{scheme}/" in b]
    return block


@pytest.mark.parametrize(
    ("scheme", "key"), [("standard", r"order-late-\d+"), ("github", r"1:manual-\d+")]
)
def test_the_documented_commands_deliver_a_signed_webhook_that_is_stored(
    live_server, settings, make_inbox, scheme, key
):
    block = documented_block(scheme)
    secret = re.search(r"^secret='([^']+)'$", block, re.M).group(1)
    # The server is configured as the block's first line says.
    assert f"ALWAYSON_{scheme.upper()}_SECRETS={secret}\n" in block
    setattr(settings, f"ALWAYSON_{scheme.upper()}_SECRETS", [secret])
    make_inbox("demo-desk")
    assert DOCUMENTED_SERVER in block

    sent = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.replace(DOCUMENTED_SERVER, live_server.url)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost"},
    )

    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout) == {"stored": True, "duplicate": False}, sent.stdout
    [event] = Event.objects.filter(inbox__slug="demo-desk")
    assert event.source == scheme
    assert re.fullmatch(key, event.source_id), event.source_id
