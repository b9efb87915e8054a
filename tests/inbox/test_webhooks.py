"""Webhook endpoints: published vectors, the signing libraries' own output, every refusal.

The verification functions take `now`; through the endpoints, deliveries are signed with the
current time, and where a fixed instant is needed (the Standard Webhooks vector) the views'
clock is pinned. No test sleeps.
"""

import base64
import hmac
import json
import time
from datetime import UTC, datetime

import pytest
import stripe
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook as StandardWebhook

from alwayson.settings import env
from inbox import webhooks
from inbox.apps import checked_inbox_secrets, checked_secrets
from inbox.models import Event, Lease
from inbox.webhooks import BadSignature, Malformed, Stale
from tests.support.webhooks import (
    BODY,
    GITHUB_SECRET,
    SCHEMES,
    STANDARD_SECRET,
    STRIPE_SECRET,
    github_headers,
    hex_hmac,
    post,
    signed,
    standard_headers,
    standard_sign,
    stripe_event,
    stripe_headers,
)

GITHUB_EXAMPLE_BODY = b"Hello, World!"
GITHUB_EXAMPLE_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

STRIPE_OLD_SECRET = "whsec_alwayson_test_rotated_away_000"

# The Standard Webhooks spec's published vector (libraries/*/tests in the spec's repository).
STANDARD_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
STANDARD_TIMESTAMP = 1614265330
STANDARD_BODY = b'{"test": 2432232314}'
STANDARD_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
OTHER_STANDARD_SECRET = "whsec_" + base64.b64encode(b"another-secret-of-32-bytes-long!").decode()


def flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


@pytest.fixture
def client():
    # enforce_csrf_checks: the endpoints must be CSRF-exempt, not merely tested without CSRF.
    return Client(enforce_csrf_checks=True)


# --- building signed deliveries -------------------------------------------------------------


# A well-formed secret of each scheme that is not the configured one.
OTHER_SECRETS = {
    "github": "not-the-secret",
    "stripe": STRIPE_OLD_SECRET,
    "standard": OTHER_STANDARD_SECRET,
}


# --- GitHub -----------------------------------------------------------------------------------


class TestGitHubSignature:
    def test_the_published_example_verifies(self):
        webhooks.verify_github(GITHUB_EXAMPLE_BODY, GITHUB_EXAMPLE_SIGNATURE, [GITHUB_SECRET])

    def test_our_hmac_reproduces_the_published_signature(self):
        assert "sha256=" + hex_hmac(GITHUB_SECRET, GITHUB_EXAMPLE_BODY) == GITHUB_EXAMPLE_SIGNATURE

    @pytest.mark.parametrize("index", range(len(GITHUB_EXAMPLE_BODY)))
    def test_any_flipped_body_byte_fails(self, index):
        with pytest.raises(BadSignature):
            webhooks.verify_github(
                flip(GITHUB_EXAMPLE_BODY, index), GITHUB_EXAMPLE_SIGNATURE, [GITHUB_SECRET]
            )

    def test_a_flipped_signature_digit_fails(self):
        tampered = GITHUB_EXAMPLE_SIGNATURE[:-1] + "f"
        with pytest.raises(BadSignature):
            webhooks.verify_github(GITHUB_EXAMPLE_BODY, tampered, [GITHUB_SECRET])

    def test_a_rotated_secret_list_accepts_either(self):
        webhooks.verify_github(
            GITHUB_EXAMPLE_BODY, GITHUB_EXAMPLE_SIGNATURE, ["new-secret", GITHUB_SECRET]
        )
        with pytest.raises(BadSignature):
            webhooks.verify_github(GITHUB_EXAMPLE_BODY, GITHUB_EXAMPLE_SIGNATURE, ["new-secret"])

    @pytest.mark.parametrize(
        "header",
        [
            None,
            "",
            "sha256=",
            "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            "sha1=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e1",
            "sha256=zz7107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17 ",
            "sha256=７57107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        ],
    )
    def test_a_missing_or_malformed_header_is_a_bad_signature(self, header):
        with pytest.raises(BadSignature):
            webhooks.verify_github(GITHUB_EXAMPLE_BODY, header, [GITHUB_SECRET])


# --- Stripe -----------------------------------------------------------------------------------


class TestStripeSignature:
    T = 1_772_366_400

    def header(self, body=BODY, secret=STRIPE_SECRET, timestamp=T):
        return stripe.WebhookSignature.generate_signature_header(
            body.decode(), secret, timestamp=timestamp
        )

    def test_the_stripe_librarys_header_verifies(self):
        assert webhooks.verify_stripe(BODY, self.header(), [STRIPE_SECRET], self.T) == self.T

    def test_stripe_agrees_that_the_header_is_valid(self):
        # The oracle: Stripe's own verifier accepts what we accept.
        header = self.header(timestamp=int(time.time()))
        assert stripe.WebhookSignature.verify_header(BODY.decode(), header, STRIPE_SECRET, 300)
        webhooks.verify_stripe(BODY, header, [STRIPE_SECRET], int(time.time()))

    def test_now_may_be_an_aware_datetime(self):
        now = datetime.fromtimestamp(self.T + 10, UTC)
        webhooks.verify_stripe(BODY, self.header(), [STRIPE_SECRET], now)
        with pytest.raises(ValueError):
            webhooks.verify_stripe(BODY, self.header(), [STRIPE_SECRET], now.replace(tzinfo=None))

    def test_a_stale_header_is_refused_at_the_tolerance(self):
        webhooks.verify_stripe(BODY, self.header(), [STRIPE_SECRET], self.T + 300)
        with pytest.raises(Stale):
            webhooks.verify_stripe(BODY, self.header(), [STRIPE_SECRET], self.T + 301)

    def test_the_tolerance_is_configurable_but_never_zero(self):
        webhooks.verify_stripe(BODY, self.header(), [STRIPE_SECRET], self.T + 900, tolerance=900)
        with pytest.raises(Stale):
            webhooks.verify_stripe(BODY, self.header(), [STRIPE_SECRET], self.T + 61, tolerance=60)
        for tolerance in (0, -1, None, True):
            with pytest.raises(ValueError):
                webhooks.verify_stripe(BODY, self.header(), [STRIPE_SECRET], self.T, tolerance)

    def test_a_timestamp_ahead_of_now_is_accepted_like_stripes_own_libraries(self):
        webhooks.verify_stripe(BODY, self.header(), [STRIPE_SECRET], self.T - 3600)

    def test_a_tampered_body_fails(self):
        with pytest.raises(BadSignature):
            webhooks.verify_stripe(flip(BODY, 3), self.header(), [STRIPE_SECRET], self.T)

    def test_a_header_with_only_v0_fails(self):
        v1 = self.header().split(",v1=")[1]
        with pytest.raises(BadSignature, match="no v1"):
            webhooks.verify_stripe(BODY, f"t={self.T},v0={v1}", [STRIPE_SECRET], self.T)

    @pytest.mark.parametrize("matching_first", [True, False])
    def test_two_v1_of_which_one_matches_passes(self, matching_first):
        good = self.header().split(",v1=")[1]
        bad = self.header(secret=STRIPE_OLD_SECRET).split(",v1=")[1]
        pair = [good, bad] if matching_first else [bad, good]
        header = f"t={self.T},v1={pair[0]},v1={pair[1]},v0={bad}"
        webhooks.verify_stripe(BODY, header, [STRIPE_SECRET], self.T)

    def test_two_v1_of_which_none_matches_fails(self):
        bad = self.header(secret=STRIPE_OLD_SECRET).split(",v1=")[1]
        with pytest.raises(BadSignature):
            webhooks.verify_stripe(BODY, f"t={self.T},v1={bad},v1={bad}", [STRIPE_SECRET], self.T)

    def test_every_configured_secret_is_tried(self):
        header = self.header(secret=STRIPE_OLD_SECRET)
        webhooks.verify_stripe(BODY, header, [STRIPE_SECRET, STRIPE_OLD_SECRET], self.T)

    @pytest.mark.parametrize(
        "header, error",
        [
            (None, BadSignature),
            ("", BadSignature),
            ("v1=abc", Malformed),
            ("t=,v1=abc", Malformed),
            ("t=abc,v1=abc", Malformed),
            ("t=-5,v1=abc", Malformed),
            ("t=1e9,v1=abc", Malformed),
            ("t=１２３,v1=abc", Malformed),
            (f"t={T},t={T},v1=abc", Malformed),
            (f"t={T}", BadSignature),
            (f"t={T},v1", BadSignature),
            (f"t={T},v1=", BadSignature),
            (f"t={T},v1=zz", BadSignature),
            (f"t={T},v1=é", BadSignature),
            ("garbage", Malformed),
            (",,,=,=", Malformed),
        ],
    )
    def test_malformed_headers_are_400_or_401(self, header, error):
        with pytest.raises(error) as caught:
            webhooks.verify_stripe(BODY, header, [STRIPE_SECRET], self.T)
        assert caught.value.status in (400, 401)


# --- Standard Webhooks ------------------------------------------------------------------------


class TestStandardSignature:
    def verify(self, signature=STANDARD_SIGNATURE, body=STANDARD_BODY, now=STANDARD_TIMESTAMP):
        return webhooks.verify_standard(
            body,
            STANDARD_ID,
            str(STANDARD_TIMESTAMP),
            signature,
            [STANDARD_SECRET],
            now,
        )

    def test_the_published_vector_verifies(self):
        assert self.verify() == STANDARD_TIMESTAMP

    def test_the_reference_package_reproduces_the_vector(self):
        signature = standard_sign(STANDARD_SECRET, STANDARD_ID, STANDARD_TIMESTAMP, STANDARD_BODY)
        assert signature == STANDARD_SIGNATURE

    def test_the_secret_prefix_is_optional(self):
        bare = STANDARD_SECRET.removeprefix("whsec_")
        assert webhooks.standard_key(bare) == webhooks.standard_key(STANDARD_SECRET)

    def test_a_flipped_body_byte_fails(self):
        with pytest.raises(BadSignature):
            self.verify(body=flip(STANDARD_BODY, 5))

    def test_the_window_is_five_minutes_each_way(self):
        self.verify(now=STANDARD_TIMESTAMP + 300)
        self.verify(now=STANDARD_TIMESTAMP - 300)
        with pytest.raises(Stale):
            self.verify(now=STANDARD_TIMESTAMP + 301)
        with pytest.raises(Stale):
            self.verify(now=STANDARD_TIMESTAMP - 301)

    def test_one_matching_entry_among_others_passes(self):
        signature = f"v1a,abcd v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= {STANDARD_SIGNATURE}"
        self.verify(signature=signature)

    def test_a_malformed_entry_does_not_hide_a_valid_one(self):
        self.verify(signature=f"v1 v1,!!! v1,a,b {STANDARD_SIGNATURE} ,")

    @pytest.mark.parametrize(
        "signature",
        [
            None,
            "",
            " ",
            "v1",
            "v1,",
            ",",
            "v1,!!!",
            "v1,abc",
            "v1,a,b",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE==",
            "v1,g0hM9SsE-OTPJTGt_tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            "V1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=x",
            "v1,ｇ0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            "v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ],
    )
    def test_malformed_or_wrong_entries_are_a_bad_signature(self, signature):
        with pytest.raises(BadSignature):
            self.verify(signature=signature)

    @pytest.mark.parametrize(
        "msg_id, timestamp",
        [
            (None, str(STANDARD_TIMESTAMP)),
            ("", str(STANDARD_TIMESTAMP)),
            ("msg with spaces", str(STANDARD_TIMESTAMP)),
            ("x" * 129, str(STANDARD_TIMESTAMP)),
            (STANDARD_ID, None),
            (STANDARD_ID, "soon"),
            (STANDARD_ID, "1614265330.0"),
            (STANDARD_ID, "+1614265330"),
            (STANDARD_ID, " 1614265330"),
        ],
    )
    def test_malformed_id_or_timestamp_is_400(self, msg_id, timestamp):
        with pytest.raises(Malformed):
            webhooks.verify_standard(
                STANDARD_BODY, msg_id, timestamp, STANDARD_SIGNATURE, [STANDARD_SECRET], 0
            )

    def test_the_reference_package_accepts_what_we_accept(self):
        # The oracle the other way round: the package verifies a header signed at `now`.
        now = int(time.time())
        headers = standard_headers(STANDARD_BODY, msg_id=STANDARD_ID, timestamp=now)
        StandardWebhook(STANDARD_SECRET).verify(STANDARD_BODY, headers)
        webhooks.standard_delivery(headers, STANDARD_BODY, [STANDARD_SECRET], now)


# --- secrets and settings ---------------------------------------------------------------------


def webhook_secrets(name, scheme):
    """A scheme's secrets as start-up reads them: the settings split the variable
    (alwayson/settings/webhooks.py), the inbox app's ready() checks each."""
    return checked_secrets(name, scheme, env.items(name))


def webhook_inbox_secrets(name):
    """Per-inbox secrets as start-up reads them: JSON in the settings, checked in ready()."""
    return checked_inbox_secrets(
        name, env.json_value(name, {}, like='{"slug": {"github": ["secret"]}}')
    )


class TestSecrets:
    @pytest.mark.parametrize(
        "scheme, secret",
        [
            ("github", ""),
            ("github", "   "),
            ("stripe", "sk_live_123"),
            ("stripe", ""),
            ("standard", "whsec_abc"),  # too short
            ("standard", "whsec_not base64!!"),
            ("standard", "whsec_" + base64.b64encode(b"x" * 65).decode()),  # too long
            ("gitlab", "whatever"),
        ],
    )
    def test_malformed_secrets_are_refused(self, scheme, secret):
        with pytest.raises(ValueError):
            webhooks.check_secret(scheme, secret)

    def test_secrets_come_from_the_environment_comma_separated(self, monkeypatch):
        monkeypatch.setenv("ALWAYSON_GITHUB_SECRETS", f"{GITHUB_SECRET} , next-secret")
        assert webhook_secrets("ALWAYSON_GITHUB_SECRETS", "github") == [
            GITHUB_SECRET,
            "next-secret",
        ]
        monkeypatch.setenv("ALWAYSON_GITHUB_SECRETS", "")
        assert webhook_secrets("ALWAYSON_GITHUB_SECRETS", "github") == []

    @pytest.mark.parametrize(
        "name, scheme, value",
        [
            ("ALWAYSON_GITHUB_SECRETS", "github", "a,,b"),
            ("ALWAYSON_GITHUB_SECRETS", "github", "a,"),
            ("ALWAYSON_STRIPE_SECRETS", "stripe", f"{STRIPE_SECRET},sk_test_oops"),
            ("ALWAYSON_STANDARD_SECRETS", "standard", "whsec_tooshort"),
        ],
    )
    def test_a_malformed_variable_stops_start_up(self, monkeypatch, name, scheme, value):
        monkeypatch.setenv(name, value)
        with pytest.raises(ImproperlyConfigured, match=name):
            webhook_secrets(name, scheme)

    def test_per_inbox_secrets_are_json(self, monkeypatch):
        value = {"desk": {"github": ["a", "b"], "stripe": STRIPE_SECRET}}
        monkeypatch.setenv("ALWAYSON_WEBHOOK_INBOX_SECRETS", json.dumps(value))
        assert webhook_inbox_secrets("ALWAYSON_WEBHOOK_INBOX_SECRETS") == {
            "desk": {"github": ["a", "b"], "stripe": [STRIPE_SECRET]}
        }

    @pytest.mark.parametrize(
        "value",
        [
            "not json",
            "[]",
            '{"desk": []}',
            '{"desk": {}}',
            '{"desk": {"gitlab": ["x"]}}',
            '{"desk": {"github": []}}',
            '{"desk": {"github": [""]}}',
            '{"desk": {"stripe": ["sk_live_1"]}}',
            '{"desk": {"standard": ["whsec_short"]}}',
            '{"": {"github": ["x"]}}',
        ],
    )
    def test_malformed_per_inbox_secrets_stop_start_up(self, monkeypatch, value):
        monkeypatch.setenv("ALWAYSON_WEBHOOK_INBOX_SECRETS", value)
        with pytest.raises(ImproperlyConfigured, match="ALWAYSON_WEBHOOK_INBOX_SECRETS"):
            webhook_inbox_secrets("ALWAYSON_WEBHOOK_INBOX_SECRETS")

    def test_defaults(self):
        from django.conf import settings

        assert settings.ALWAYSON_WEBHOOK_MAX_BYTES == 1024 * 1024
        assert settings.ALWAYSON_STRIPE_TOLERANCE == 300


# --- bodies -----------------------------------------------------------------------------------


class TestParseJson:
    @pytest.mark.parametrize(
        "body",
        [
            b"",
            b"Hello, World!",
            b"\xff\xfe{}",
            b'{"a": NaN}',
            b'{"a": Infinity}',
            b'{"a": 1e999}',
            b'{"a": "\\u0000"}',
            b'{"\\u0000": 1}',
            b'{"a": "\\ud800"}',
            b"[" * 101 + b"]" * 101,
            b"[" * 100_000,
            b"1" * 5000,
        ],
    )
    def test_unstorable_bodies_are_malformed(self, body):
        with pytest.raises(Malformed):
            webhooks.parse_json(body)

    def test_a_body_nested_to_the_limit_is_accepted(self):
        assert webhooks.parse_json(b"[" * 100 + b"]" * 100)

    def test_paired_surrogates_are_fine(self):
        assert webhooks.parse_json(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}


# --- endpoints --------------------------------------------------------------------------------


def events():
    return list(Event.objects.order_by("id"))


@pytest.mark.django_db
class TestEndpoints:
    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_a_signed_delivery_is_stored_and_acknowledged(self, client, secrets, inbox, scheme):
        response = post(client, scheme, inbox.slug, BODY, signed(scheme, BODY))
        assert response.status_code == 202, response.content
        assert response.json() == {"stored": True, "duplicate": False}
        [event] = events()
        assert event.inbox_id == inbox.pk and event.source == scheme
        assert event.payload["body"] == json.loads(BODY)

    def test_github_keys_by_hook_and_delivery_and_types_by_the_event_header(
        self, client, secrets, inbox
    ):
        headers = github_headers(BODY, hook_id="77", delivery="72d3162e", event="pull_request")
        assert post(client, "github", inbox.slug, BODY, headers).status_code == 202
        [event] = events()
        assert event.source_id == "77:72d3162e"
        assert event.payload == {"type": "pull_request", "body": json.loads(BODY)}

    def test_stripe_keys_by_event_id_and_types_by_its_type(self, client, secrets, inbox):
        body = stripe_event("evt_3Ab", "invoice.paid")
        assert post(client, "stripe", inbox.slug, body, stripe_headers(body)).status_code == 202
        [event] = events()
        assert event.source_id == "evt_3Ab"
        assert event.payload == {"type": "invoice.paid", "body": json.loads(body)}

    def test_standard_keys_by_webhook_id_and_types_by_the_bodys_type(self, client, secrets, inbox):
        body = b'{"type": "contact.created", "data": {"id": 1}}'
        headers = standard_headers(body, msg_id="msg_2KWPBg")
        assert post(client, "standard", inbox.slug, body, headers).status_code == 202
        [event] = events()
        assert event.source_id == "msg_2KWPBg"
        assert event.payload == {"type": "contact.created", "body": json.loads(body)}

    def test_the_standard_published_vector_verifies_through_the_endpoint(
        self, client, secrets, inbox, monkeypatch
    ):
        monkeypatch.setattr(
            "inbox.views.database_now", lambda: datetime.fromtimestamp(STANDARD_TIMESTAMP, UTC)
        )
        headers = {
            "webhook-id": STANDARD_ID,
            "webhook-timestamp": str(STANDARD_TIMESTAMP),
            "webhook-signature": STANDARD_SIGNATURE,
        }
        response = post(client, "standard", inbox.slug, STANDARD_BODY, headers)
        assert response.status_code == 202, response.content
        [event] = events()
        assert event.source_id == STANDARD_ID
        assert event.payload == {"type": None, "body": {"test": 2432232314}}

    def test_headers_signed_by_the_standardwebhooks_package_verify(self, client, secrets, inbox):
        now = datetime.now(UTC)
        body = b'{"type": "invoice.paid", "data": {"n": 1}}'
        signature = StandardWebhook(STANDARD_SECRET).sign("msg_pkg", now, body.decode())
        headers = {
            "webhook-id": "msg_pkg",
            "webhook-timestamp": str(int(now.timestamp())),
            # A rotated-away key's signature alongside, as a sender rolling its secret sends.
            "webhook-signature": "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= " + signature,
        }
        assert post(client, "standard", inbox.slug, body, headers).status_code == 202

    def test_stripe_headers_from_the_stripe_library_verify(self, client, secrets, inbox):
        body = stripe_event("evt_lib")
        header = stripe.WebhookSignature.generate_signature_header(body.decode(), STRIPE_SECRET)
        response = post(client, "stripe", inbox.slug, body, {"Stripe-Signature": header})
        assert response.status_code == 202

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_the_same_delivery_twice_is_one_event_and_two_2xx(self, client, secrets, inbox, scheme):
        headers = signed(scheme, BODY)
        first = post(client, scheme, inbox.slug, BODY, headers)
        second = post(client, scheme, inbox.slug, BODY, headers)
        assert (first.status_code, second.status_code) == (202, 200)
        assert second.json() == {"stored": False, "duplicate": True}
        assert len(events()) == 1

    def test_a_stripe_retry_is_re_signed_and_still_a_duplicate(self, client, secrets, inbox):
        now = int(time.time())
        post(client, "stripe", inbox.slug, BODY, stripe_headers(BODY, timestamp=now - 60))
        retry = post(client, "stripe", inbox.slug, BODY, stripe_headers(BODY, timestamp=now))
        assert retry.status_code == 200 and len(events()) == 1

    def test_a_standard_retry_is_re_signed_and_still_a_duplicate(self, client, secrets, inbox):
        now = int(time.time())
        post(client, "standard", inbox.slug, BODY, standard_headers(BODY, timestamp=now - 60))
        retry = post(client, "standard", inbox.slug, BODY, standard_headers(BODY, timestamp=now))
        assert retry.status_code == 200 and len(events()) == 1

    def test_two_github_hooks_on_one_delivery_are_two_events(self, client, secrets, inbox):
        for hook_id in ("1", "2"):
            headers = github_headers(BODY, hook_id=hook_id, delivery="same")
            assert post(client, "github", inbox.slug, BODY, headers).status_code == 202
        assert [e.source_id for e in events()] == ["1:same", "2:same"]

    def test_the_same_key_in_two_inboxes_is_two_events(self, client, secrets, make_inbox):
        for slug in ("one", "two"):
            make_inbox(slug)
            assert post(client, "stripe", slug, BODY, stripe_headers(BODY)).status_code == 202
        assert len(events()) == 2

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_the_url_without_its_trailing_slash_works(self, client, secrets, inbox, scheme):
        response = post(client, scheme, inbox.slug, BODY, signed(scheme, BODY), False)
        assert response.status_code == 202

    # --- refusals ---

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_an_unknown_inbox_is_404(self, client, secrets, inbox, scheme):
        response = post(client, scheme, "nobody", BODY, signed(scheme, BODY))
        assert response.status_code == 404
        assert "nobody" in response.json()["error"]
        assert events() == []

    @pytest.mark.parametrize("scheme", SCHEMES)
    @pytest.mark.parametrize("unsigned", ["missing", "other secret", "tampered", "no secret"])
    def test_an_unsigned_delivery_cannot_tell_whether_an_inbox_exists(
        self, client, secrets, inbox, scheme, unsigned
    ):
        body, headers = BODY, signed(scheme, BODY)
        if unsigned == "missing":
            headers = {}
        elif unsigned == "other secret":
            headers = signed(scheme, BODY, secret=OTHER_SECRETS[scheme])
        elif unsigned == "tampered":
            body = flip(BODY, 10)
        else:
            secrets.ALWAYSON_GITHUB_SECRETS = []
            secrets.ALWAYSON_STRIPE_SECRETS = []
            secrets.ALWAYSON_STANDARD_SECRETS = []
        known = post(client, scheme, inbox.slug, body, headers)
        unknown = post(client, scheme, "nobody", body, headers)
        assert (known.status_code, known.json()) == (unknown.status_code, unknown.json())
        assert known.status_code == 401
        assert inbox.slug not in known.content.decode()
        assert events() == []

    @pytest.mark.parametrize("scheme", SCHEMES)
    @pytest.mark.parametrize("method", ["get", "put", "delete", "patch", "head", "options"])
    def test_other_methods_are_405(self, client, secrets, inbox, scheme, method):
        response = getattr(client, method)(f"/hooks/{scheme}/{inbox.slug}/")
        assert response.status_code == 405
        assert response["Allow"] == "POST"
        if method != "head":
            assert "error" in response.json()

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_a_body_over_the_limit_is_413(self, client, secrets, inbox, scheme, settings):
        settings.ALWAYSON_WEBHOOK_MAX_BYTES = len(BODY)
        assert post(client, scheme, inbox.slug, BODY, signed(scheme, BODY)).status_code == 202
        body = stripe_event("evt_2", padding=" ")
        settings.ALWAYSON_WEBHOOK_MAX_BYTES = len(body) - 1
        response = post(client, scheme, inbox.slug, body, signed(scheme, body))
        assert response.status_code == 413
        assert str(len(body) - 1) in response.json()["error"]
        assert len(events()) == 1

    def test_the_default_limit_is_one_mebibyte(self, client, secrets, inbox):
        body = stripe_event(padding="x" * (1024 * 1024))
        response = post(client, "stripe", inbox.slug, body, stripe_headers(body))
        assert response.status_code == 413

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_a_missing_signature_is_401_and_stores_nothing(self, client, secrets, inbox, scheme):
        headers = signed(scheme, BODY)
        del headers[
            {
                "github": "X-Hub-Signature-256",
                "stripe": "Stripe-Signature",
                "standard": "webhook-signature",
            }[scheme]
        ]
        response = post(client, scheme, inbox.slug, BODY, headers)
        assert response.status_code == 401
        assert "missing" in response.json()["error"]
        assert events() == []

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_a_tampered_body_is_401_and_stores_nothing(self, client, secrets, inbox, scheme):
        headers = signed(scheme, BODY)
        response = post(client, scheme, inbox.slug, flip(BODY, 10), headers)
        assert response.status_code == 401
        assert events() == []

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_another_secret_is_401(self, client, secrets, inbox, scheme):
        other = OTHER_SECRETS[scheme]
        response = post(client, scheme, inbox.slug, BODY, signed(scheme, BODY, secret=other))
        assert response.status_code == 401
        assert events() == []

    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_no_configured_secret_is_401(self, client, settings, inbox, scheme):
        settings.ALWAYSON_GITHUB_SECRETS = []
        settings.ALWAYSON_STRIPE_SECRETS = []
        settings.ALWAYSON_STANDARD_SECRETS = []
        response = post(client, scheme, inbox.slug, BODY, signed(scheme, BODY))
        assert response.status_code == 401
        assert "no webhook secret" in response.json()["error"]
        assert events() == []

    @pytest.mark.parametrize("scheme", ["stripe", "standard"])
    def test_a_stale_timestamp_is_400_and_stores_nothing(self, client, secrets, inbox, scheme):
        stale = int(time.time()) - 3600
        response = post(client, scheme, inbox.slug, BODY, signed(scheme, BODY, timestamp=stale))
        assert response.status_code == 400
        assert "older than" in response.json()["error"]
        assert events() == []

    def test_the_stripe_tolerance_setting_is_used(self, client, secrets, inbox):
        secrets.ALWAYSON_STRIPE_TOLERANCE = 7200
        old = int(time.time()) - 3600
        response = post(client, "stripe", inbox.slug, BODY, stripe_headers(BODY, timestamp=old))
        assert response.status_code == 202

    def test_a_standard_timestamp_far_ahead_is_400(self, client, secrets, inbox):
        ahead = int(time.time()) + 3600
        headers = standard_headers(BODY, timestamp=ahead)
        response = post(client, "standard", inbox.slug, BODY, headers)
        assert response.status_code == 400
        assert "future" in response.json()["error"]

    @pytest.mark.parametrize(
        "signature",
        ["v1", "v1,", "v1,!!!", "v1,a,b", ",", "v2,abc", "v1,g0hM9SsE+OTPJTGt", "\x00", "é"],
    )
    def test_a_malformed_standard_signature_entry_is_401_never_500(
        self, client, secrets, inbox, signature
    ):
        headers = standard_headers(BODY)
        headers["webhook-signature"] = signature
        response = post(client, "standard", inbox.slug, BODY, headers)
        assert response.status_code == 401
        assert events() == []

    @pytest.mark.parametrize(
        "header", ["t=,v1=", "t=abc,v1=00", "v1=abc", "t=1,t=2,v1=0", "=", "é", "t=1\x00"]
    )
    def test_a_malformed_stripe_header_is_400_never_500(self, client, secrets, inbox, header):
        response = post(client, "stripe", inbox.slug, BODY, {"Stripe-Signature": header})
        assert response.status_code == 400
        assert "Stripe-Signature" in response.json()["error"]

    @pytest.mark.parametrize("missing", ["X-GitHub-Hook-ID", "X-GitHub-Delivery", "X-GitHub-Event"])
    def test_github_delivery_headers_are_required_after_the_signature(
        self, client, secrets, inbox, missing
    ):
        headers = github_headers(BODY)
        del headers[missing]
        response = post(client, "github", inbox.slug, BODY, headers)
        assert response.status_code == 400
        assert missing in response.json()["error"]
        assert events() == []

    def test_a_github_hook_id_with_a_colon_is_400(self, client, secrets, inbox):
        headers = github_headers(BODY, hook_id="1:2")
        assert post(client, "github", inbox.slug, BODY, headers).status_code == 400

    @pytest.mark.parametrize(
        "body",
        [
            b"Hello, World!",
            b'{"id": "evt_1", "type": "x", "n": NaN}',
            b'{"id": "evt_1", "type": "x", "s": "\\u0000"}',
            b"[" * 200 + b"]" * 200,
        ],
    )
    @pytest.mark.parametrize("scheme", SCHEMES)
    def test_a_signed_body_that_is_not_storable_json_is_400(
        self, client, secrets, inbox, scheme, body
    ):
        response = post(client, scheme, inbox.slug, body, signed(scheme, body))
        assert response.status_code == 400
        assert "body" in response.json()["error"]
        assert events() == []

    @pytest.mark.parametrize(
        "body",
        [
            b"[]",
            b'{"type": "charge.succeeded"}',
            b'{"id": 7, "type": "charge.succeeded"}',
            b'{"id": "evt 1", "type": "charge.succeeded"}',
            b'{"id": "evt_1"}',
            b'{"id": "evt_1", "type": ""}',
        ],
    )
    def test_a_stripe_event_without_id_or_type_is_400(self, client, secrets, inbox, body):
        response = post(client, "stripe", inbox.slug, body, stripe_headers(body))
        assert response.status_code == 400
        assert events() == []

    def test_a_standard_body_that_is_not_an_object_is_stored_untyped(self, client, secrets, inbox):
        body = b"[1, 2]"
        assert post(client, "standard", inbox.slug, body, standard_headers(body)).status_code == 202
        assert events()[0].payload == {"type": None, "body": [1, 2]}

    # --- per-inbox secrets ---

    def test_an_inbox_with_its_own_secret_refuses_the_schemes(self, client, secrets, make_inbox):
        make_inbox("private")
        make_inbox("shared")
        secrets.ALWAYSON_WEBHOOK_INBOX_SECRETS = {"private": {"github": ["private-secret"]}}
        shared = github_headers(BODY)
        own = github_headers(BODY, secret="private-secret")
        assert post(client, "github", "private", BODY, shared).status_code == 401
        assert post(client, "github", "private", BODY, own).status_code == 202
        assert post(client, "github", "shared", BODY, shared).status_code == 202
        assert post(client, "github", "shared", BODY, own).status_code == 401
        # Its own secrets replace only that scheme's.
        assert post(client, "stripe", "private", BODY, stripe_headers(BODY)).status_code == 202

    def test_per_inbox_rotation_accepts_every_listed_secret(self, client, secrets, inbox):
        secrets.ALWAYSON_WEBHOOK_INBOX_SECRETS = {
            inbox.slug: {"standard": [OTHER_STANDARD_SECRET, STANDARD_SECRET]}
        }
        for n, secret in enumerate([STANDARD_SECRET, OTHER_STANDARD_SECRET]):
            headers = standard_headers(BODY, secret=secret, msg_id=f"msg_{n}")
            assert post(client, "standard", inbox.slug, BODY, headers).status_code == 202


# --- property: random input never reaches the inbox unsigned, and never a 500 ----------------

HEADER_NAMES = {
    "github": ["X-Hub-Signature-256", "X-GitHub-Hook-ID", "X-GitHub-Delivery", "X-GitHub-Event"],
    "stripe": ["Stripe-Signature"],
    "standard": ["webhook-id", "webhook-timestamp", "webhook-signature"],
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def bodies(draw):
    kind = draw(st.sampled_from(["bytes", "text", "json", "event"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "text":
        return draw(st.text(max_size=100)).encode("utf-8", "surrogatepass")
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    extra = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
    event = {
        **extra,
        "id": draw(st.sampled_from(["evt_1", "evt_2"]) | st.text(max_size=12)),
        "type": draw(st.just("charge.succeeded") | st.text(max_size=12)),
    }
    return json.dumps(event).encode()


@st.composite
def deliveries(draw, scheme):
    """(body, headers, signed_validly): a valid signature only in the 'valid' mode."""
    body = draw(bodies())
    mode = draw(st.sampled_from(["valid", "wrong-secret", "tampered", "random"]))
    # Offsets stay clear of the tolerance edges, so the seconds a request takes cannot matter.
    offset = draw(st.integers(-120, 120) | st.integers(-(10**6), -400) | st.integers(400, 10**6))
    timestamp = int(time.time()) + offset
    # Stripe refuses only old timestamps; Standard Webhooks refuses both directions.
    fresh = offset >= -120 if scheme == "stripe" else abs(offset) <= 120
    msg_id = draw(st.sampled_from(["msg_1", "msg_2"]) | st.text(max_size=20))
    signing_body = body + b"!" if mode == "tampered" else body
    secret = {
        "github": "not-the-secret",
        "stripe": STRIPE_OLD_SECRET,
        "standard": OTHER_STANDARD_SECRET,
    }[scheme]
    if mode in ("valid", "tampered"):
        secret = {"github": GITHUB_SECRET, "stripe": STRIPE_SECRET, "standard": STANDARD_SECRET}[
            scheme
        ]

    if scheme == "github":
        headers = {
            "X-Hub-Signature-256": "sha256=" + hex_hmac(secret, signing_body),
            "X-GitHub-Hook-ID": draw(st.just("9") | st.text(max_size=10)),
            "X-GitHub-Delivery": draw(st.sampled_from(["d-1", "d-2"]) | st.text(max_size=10)),
            "X-GitHub-Event": draw(st.just("push") | st.text(max_size=10)),
        }
    elif scheme == "stripe":
        v1 = hex_hmac(secret, f"{timestamp}.".encode() + signing_body)
        headers = {"Stripe-Signature": f"t={timestamp},v1={v1}"}
    else:
        key = webhooks.standard_key(secret)
        mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode("utf-8", "surrogatepass"), "sha256")
        mac.update(signing_body)
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode(),
        }
    if mode == "random":
        for name in HEADER_NAMES[scheme]:
            headers[name] = draw(st.none() | st.text(max_size=80) | st.just(headers[name]))
    valid = mode == "valid" and (scheme == "github" or fresh)
    return body, headers, valid


@pytest.mark.django_db
@pytest.mark.parametrize("scheme", SCHEMES)
def test_random_deliveries_never_500_and_never_store_unsigned(secrets, inbox, scheme):
    client = Client()

    @hsettings(
        max_examples=150,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(delivery=deliveries(scheme))
    def check(delivery):
        body, headers, valid = delivery
        before = Event.objects.count()
        # The test client re-raises any exception a view lets out, so a would-be 500 fails here.
        response = post(client, scheme, inbox.slug, body, headers)
        assert response.status_code < 500
        assert "error" in response.json() or response.status_code in (200, 202)
        stored = Event.objects.count() - before
        if not valid:
            assert response.status_code in (400, 401), response.content
            assert stored == 0
        if response.status_code in (200, 202):
            assert valid
            assert stored == (1 if response.status_code == 202 else 0)

    check()


# --- queries per delivery -------------------------------------------------------------------
# A webhook delivery costs the fewest queries the database allows, so a regression (a lookup
# per request, a session read, an extra clock query) fails here instead of in a benchmark.

# PostgreSQL: the one statement that resolves the slug, stores and shares the inbox's lock
# while its marker stands (and, for the schemes whose signatures carry a time, the
# database's clock). An idle inbox's first delivery takes a second statement, the one that
# moves the marker and wakes a worker (the first wrote nothing: still one commit). SQLite:
# the slug, then BEGIN IMMEDIATE, the INSERT, the marker's UPDATE (not for a duplicate) and
# COMMIT.
STORE = {"postgresql": 1, "sqlite": 5}
WAKE = {"postgresql": 2, "sqlite": 5}
DUPLICATE = {"postgresql": 1, "sqlite": 4}
CLOCK = {"github": 0, "stripe": 1, "standard": 1}
CLOCK_QUERIES = {"postgresql": 1, "sqlite": 0}
ANOTHER_KEY = {"github": {"delivery": "d-2"}, "stripe": {}, "standard": {"msg_id": "msg_2"}}


def deliver_once(client, scheme, slug, key=None):
    body = stripe_event(event_id="evt_2") if key is not None and scheme == "stripe" else BODY
    return post(client, scheme, slug, body, signed(scheme, body, **(key or {})))


# transaction=True: counted as in production, where no test transaction wraps the request.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_stored_delivery_and_its_retry_take_the_fewest_queries(client, secrets, inbox, scheme):
    vendor = connection.vendor
    clock = CLOCK[scheme] * CLOCK_QUERIES[vendor]
    with CaptureQueriesContext(connection) as woke:
        assert deliver_once(client, scheme, inbox.slug).status_code == 202
    with CaptureQueriesContext(connection) as duplicate:
        assert deliver_once(client, scheme, inbox.slug).status_code == 200
    with CaptureQueriesContext(connection) as stored:
        assert deliver_once(client, scheme, inbox.slug, ANOTHER_KEY[scheme]).status_code == 202
    assert len(woke) == WAKE[vendor] + clock, [q["sql"] for q in woke]
    assert len(duplicate) == DUPLICATE[vendor] + clock, [q["sql"] for q in duplicate]
    assert len(stored) == STORE[vendor] + clock, [q["sql"] for q in stored]
    assert Event.objects.filter(inbox=inbox).count() == 2
    assert Lease.objects.get(inbox=inbox).work_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_delivery_to_an_unknown_inbox_is_one_query_and_a_404(client, secrets):
    with CaptureQueriesContext(connection) as queries:
        assert deliver_once(client, "github", "nobody").status_code == 404
    assert len(queries) == 1
