"""A service that echoes the credential gets it back to the agent in no encoding: raw,
percent-encoded, JSON-escaped, HTML-escaped or base64, in the body (also once decoded with
.json()), any header, `Location`, or the status line's reason phrase. Loopback servers only."""

import base64
import binascii
import html
import json
import logging
import re
from contextlib import suppress
from urllib.parse import quote, quote_plus, unquote, unquote_plus

import pytest

from alwayson.egress.gateway import Egress
from alwayson.egress.models import EgressCall
from alwayson.egress.scrub import REDACTED, scrub
from alwayson.egress.services import check_services
from tests.support.egress import every_stored_value
from tests.support.loopback import Loopback

pytestmark = pytest.mark.django_db

# The characters that escape differently in each encoding: + / = & and a space.
SECRETS = ("sk+live/PLANTED=7c&1f 9e", "u&p=a+b/c d==x/+/Q9")


def lower_hex(text):
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), text)


def json_every_char(secret, spec="\\u{:04X}"):
    return "".join(spec.format(ord(ch)) for ch in secret)


def b64(text, encode=base64.b64encode):
    return encode(text.encode()).decode()


# How a service may write back what it received; each is JSON-safe, so it can sit in a string.
ENCODINGS = {
    "raw": lambda s: s,
    "quote": lambda s: quote(s, safe=""),
    "quote-lower-hex": lambda s: lower_hex(quote(s, safe="")),
    "quote-path": lambda s: quote(s),  # `/` left as it is
    "quote-plus": lambda s: quote_plus(s, safe=""),
    "quote-plus-lower-hex": lambda s: lower_hex(quote_plus(s, safe="")),
    "double-quoted": lambda s: quote(quote(s, safe=""), safe=""),
    "json-every-char-upper": json_every_char,
    "json-every-char-lower": lambda s: json_every_char(s, "\\u{:04x}"),
    # .NET's System.Text.Json and PHP's json_encode: some characters escaped, the rest not.
    "json-dotnet": lambda s: "".join(f"\\u{ord(ch):04X}" if ch in "+&<>'" else ch for ch in s),
    "json-php": lambda s: s.replace("/", "\\/"),
    "html-escape": html.escape,
    "html-numeric": lambda s: "".join(ch if ch.isalnum() else f"&#{ord(ch)};" for ch in s),
    "html-hex": lambda s: "".join(ch if ch.isalnum() else f"&#x{ord(ch):X};" for ch in s),
    "base64": b64,
    "base64-unpadded": lambda s: b64(s).rstrip("="),
    "base64-urlsafe": lambda s: b64(s, base64.urlsafe_b64encode),
    "base64-urlsafe-unpadded": lambda s: b64(s, base64.urlsafe_b64encode).rstrip("="),
    "base64-quoted": lambda s: quote(b64(s), safe=""),
    "base64-json-php": lambda s: b64(s).replace("/", "\\/"),
    # Inside a longer base64 text, at each of the three alignments the secret can have.
    "base64-basic-auth-0": lambda s: b64(f"abc:{s}"),
    "base64-basic-auth-1": lambda s: b64(f"abcd:{s}"),
    "base64-basic-auth-2": lambda s: b64(f"a:{s}"),
    "base64-bearer-header": lambda s: b64(f"Authorization: Bearer {s}\r\nAccept: */*"),
}


def readings(text):
    """`text` and what a reader could decode it into: percent-decoding, HTML and JSON
    unescaping, and every run of base64 characters decoded at each alignment."""
    found = {text, unquote(text), unquote(unquote(text)), unquote_plus(text), html.unescape(text)}
    with suppress(ValueError):
        found.add(json.loads(f'"{text}"'))
    for reading in list(found):
        for run in re.findall(r"[A-Za-z0-9+/_\\-]{8,}", reading.replace("\\/", "/")):
            for start in range(4):
                part = run[start:]
                part = part[: len(part) // 4 * 4]
                for decode in (base64.b64decode, base64.urlsafe_b64decode):
                    with suppress(binascii.Error, ValueError):
                        found.add(decode(part).decode("latin-1"))
    return found


def assert_unreadable(text, secret, form):
    assert form not in text, f"the echoed form is shown as it was: {text!r}"
    for reading in readings(text):
        assert secret not in reading, f"{text!r} reads as the secret"


def echo(request):
    """A service that answers with what it was sent, in the encoding the path names: a 301 to
    itself (a trailing-slash redirect), a header, the reason phrase and a JSON body."""
    secret = request["headers"]["Authorization"].removeprefix("Bearer ")
    form = ENCODINGS[request["path"].rsplit("/", 1)[1]](secret)
    body = f'{{"echo": "{form}", "page": "<p>No page {form}</p>"}}'
    headers = {"X-Echo": form, "Location": f"/v1/echo/?token={form}"}
    return 301, headers, body.encode(), f"Moved to {form}"


@pytest.fixture
def echo_service(settings):
    with Loopback(echo) as server:
        settings.ALWAYSON_EGRESS_SERVICES = check_services(
            {"echo": {"base_url": server.url(), "paths": ["/v1/echo"], "secret_env": "ECHO_TOKEN"}}
        )
        yield server


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_credential_echoed_in_any_encoding_reaches_nothing_the_agent_sees(
    echo_service, inbox, monkeypatch, caplog, secret, encoding
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("ECHO_TOKEN", secret)
    form = ENCODINGS[encoding](secret)
    answer = Egress(inbox).get("echo", f"/v1/echo/{encoding}")
    [request] = echo_service.requests
    assert request["headers"]["Authorization"] == f"Bearer {secret}"  # the service got it

    assert answer.status == 301
    decoded = answer.json()
    shown = {
        "body": answer.content.decode(),
        "text": answer.text,
        "json": repr(decoded),
        "json values": " ".join(decoded.values()),
        "reason": answer.reason,
        **{f"header {name}": value for name, value in answer.headers.items()},
    }
    for text in shown.values():
        assert_unreadable(text, secret, form)
    for where in ("text", "reason", "header x-echo", "header location"):
        assert REDACTED in shown[where], where
    assert REDACTED in decoded["echo"] and REDACTED in decoded["page"]
    # Only the credential is taken out: what stood around it is still there.
    assert decoded["page"].startswith("<p>No page ") and decoded["page"].endswith("</p>")
    assert answer.headers["location"].startswith("/v1/echo/?token=")
    assert answer.reason.startswith("Moved to ")
    elsewhere = [*every_stored_value(), *(record.getMessage() for record in caplog.records)]
    assert [text for text in elsewhere if secret in text or form in text] == []
    assert EgressCall.objects.get().outcome == "sent"


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_scrub_takes_every_encoding_out_of_text_and_bytes(secret, encoding):
    # The one function that cleans an answer's body, headers and reason and an EgressFailed.
    form = ENCODINGS[encoding](secret)
    text = f"before {form} after"
    assert_unreadable(scrub(text, secret), secret, form)
    assert scrub(text.encode(), secret) == scrub(text, secret).encode()
    assert scrub(text, secret).startswith("before ") and scrub(text, secret).endswith(" after")


def test_scrub_leaves_text_without_the_secret_alone():
    text = "sk+live/PLANTED=7c&1f 9 e, c2srbGl2ZS9QTEFOVEVE, %2Bx, \\u002b, &amp; 7c&amp;1f"
    assert scrub(text, SECRETS[0]) == text
    assert scrub(text, "") == text


def test_a_query_credential_repeated_by_a_trailing_slash_redirect_and_a_404_page_is_scrubbed(
    settings, inbox, monkeypatch
):
    """The service repeats the path and query as it received them (percent-encoded by the
    gateway's client), in a Location, a header and an HTML page."""
    secret = SECRETS[0]

    def repeat(request):
        page = f"<h1>Not found</h1><p>{html.escape(request['path'])}</p>"
        headers = {"Location": request["path"].replace("?", "/?", 1), "X-Path": request["path"]}
        return 301, headers, page.encode(), f"Moved {request['path']}"

    monkeypatch.setenv("MAPS_KEY", secret)
    with Loopback(repeat) as server:
        settings.ALWAYSON_EGRESS_SERVICES = check_services(
            {"maps": {"base_url": server.url(), "secret_env": "MAPS_KEY", "query": "key"}}
        )
        answer = Egress(inbox).get("maps", "/geocode", params={"q": "Berlin"})
        [request] = server.requests
    form = request["path"].partition("key=")[2]
    assert form and unquote_plus(form) == secret  # the service got it, encoded
    for text in (answer.text, answer.reason, *answer.headers.values()):
        assert_unreadable(text, secret, form)
    assert answer.headers["location"] == f"/geocode/?q=Berlin&key={REDACTED}"


def test_json_reads_utf8_only_so_a_utf16_answer_cannot_carry_the_secret_past_the_scrub(
    settings, inbox, monkeypatch
):
    secret = SECRETS[0]
    body = json.dumps({"echo": secret}).encode("utf-16")
    monkeypatch.setenv("ECHO_TOKEN", secret)
    with Loopback(lambda request: (200, {"Content-Type": "application/json"}, body)) as server:
        settings.ALWAYSON_EGRESS_SERVICES = check_services(
            {"echo": {"base_url": server.url(), "secret_env": "ECHO_TOKEN"}}
        )
        answer = Egress(inbox).get("echo", "/")
    with pytest.raises(ValueError):
        answer.json()
    assert secret not in answer.text
