"""A credential a service echoes inside compressed content reaches the agent in none of it:
every layer an agent could open (gzip, zlib and deflate, bzip2, xz, zip members; brotli and
zstd when their decoder is installed) is opened, scrubbed and packed again, whether or not
the answer says it is compressed; what cannot be checked is withheld; and a compression
bomb costs no more than the service's max_unpacked_bytes. Loopback servers only."""

import bz2
import gzip
import io
import json
import logging
import lzma
import tracemalloc
import zipfile
import zlib

import pytest

from alwayson.egress import unpack
from alwayson.egress.exceptions import EgressFailed
from alwayson.egress.gateway import Egress
from alwayson.egress.models import EgressCall
from alwayson.egress.scrub import REDACTED
from alwayson.egress.services import check_services
from tests.support.egress import every_stored_value
from tests.support.loopback import Loopback

pytestmark = pytest.mark.django_db

SECRET = "sk_live_PLANTED-z1p9e2f7"
FILENAME = {
    "gzip": "echo.json.gz",
    "zlib": "echo.json.zz",
    "deflate": "echo.json.deflate",
    "bzip2": "echo.json.bz2",
    "xz": "echo.json.xz",
    "zip": "echo.zip",
    "br": "echo.json.br",
    "zstd": "echo.json.zst",
}
MEDIA = {
    "gzip": "application/gzip",
    "zlib": "application/zlib",
    "deflate": "application/x-deflate",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "zip": "application/zip",
    "br": "application/x-brotli",
    "zstd": "application/zstd",
}


def raw_deflate(data):
    packer = zlib.compressobj(wbits=-15)
    return packer.compress(data) + packer.flush()


def zipped(members, method=zipfile.ZIP_DEFLATED):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return out.getvalue()


PACK = {
    "gzip": gzip.compress,
    "zlib": zlib.compress,
    "deflate": raw_deflate,
    "bzip2": bz2.compress,
    "xz": lzma.compress,
    "zip": lambda data: zipped({"echo.json": data}),
}
OPEN = {
    "gzip": gzip.decompress,
    "zlib": zlib.decompress,
    "deflate": lambda data: zlib.decompress(data, wbits=-15),
    "bzip2": bz2.decompress,
    "xz": lzma.decompress,
}
# How each case is packed, outermost last, and how the agent opens it: the same, reversed.
NESTED = {
    "gzip in zip": ["gzip", "zip-member-gz"],
    "zip in gzip": ["zip", "gzip"],
    "gzip in gzip": ["gzip", "gzip"],
    "xz in bzip2": ["xz", "bzip2"],
}


def pack(layers, data):
    for layer in layers:
        data = zipped({"echo.json.gz": data}) if layer == "zip-member-gz" else PACK[layer](data)
    return data


def opened_as_an_agent_would(data, said=None):
    """Every layer opened, by its magic bytes or as a zip, down to the plain text; raw
    deflate, which has no magic bytes, when the answer said it is (`said`)."""
    if said == "deflate":
        data = OPEN["deflate"](data)
    if zipfile.is_zipfile(io.BytesIO(data)):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return " ".join(
                f"{name}: {opened_as_an_agent_would(archive.read(name))}"
                for name in archive.namelist()
            )
    for magic, form in ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ", "xz")):
        if data.startswith(magic):
            return opened_as_an_agent_would(OPEN[form](data))
    try:
        return opened_as_an_agent_would(zlib.decompress(data))
    except zlib.error:
        return data.decode("latin-1")


def echo_body(secret):
    return json.dumps({"echo": secret, "note": "as received"}).encode()


@pytest.fixture
def compressing(settings, monkeypatch):
    """A service whose answer the test decides, with the credential planted: the request's
    Authorization, which the answer may echo. Yields `call(answer) -> (response or the
    EgressFailed, the request the service got)`."""
    monkeypatch.setenv("ECHO_TOKEN", SECRET)
    answers = []

    def answer(request):
        status, headers, make = answers[-1]
        return status, headers, make(request["headers"]["Authorization"].removeprefix("Bearer "))

    with Loopback(answer) as server:
        settings.ALWAYSON_EGRESS_SERVICES = check_services(
            {
                "echo": {
                    "base_url": server.url(),
                    "secret_env": "ECHO_TOKEN",
                    "max_bytes": 1_000_000,
                    "max_unpacked_bytes": 1_000_000,
                }
            }
        )

        def call(headers, make, status=200):
            answers.append((status, headers, make))
            try:
                return Egress("desk").get("echo", "/v1/echo"), server.requests[-1]
            except EgressFailed as exc:
                return exc, server.requests[-1]

        yield call


def assert_nowhere_else(caplog):
    elsewhere = [*every_stored_value(), *(record.getMessage() for record in caplog.records)]
    assert [text for text in elsewhere if SECRET in text] == []


CASES = [
    (layers, label)
    for layers in [[form] for form in PACK] + list(NESTED.values())
    for label in ("declared", "undeclared", "file name")
    # Raw deflate has no magic bytes: it is recognised only when the answer says so.
    if not (layers == ["deflate"] and label == "undeclared")
]


@pytest.mark.parametrize("layers, label", CASES)
def test_a_credential_inside_compressed_content_is_taken_out_of_every_layer_the_agent_opens(
    compressing, layers, label, caplog
):
    caplog.set_level(logging.DEBUG)
    outer = "zip" if layers[-1] == "zip-member-gz" else layers[-1]
    headers = {
        "declared": {"Content-Type": MEDIA[outer]},
        "undeclared": {"Content-Type": "application/octet-stream"},
        "file name": {"Content-Disposition": f'attachment; filename="{FILENAME[outer]}"'},
    }[label]
    response, request = compressing(headers, lambda secret: pack(layers, echo_body(secret)))
    assert request["headers"]["Authorization"] == f"Bearer {SECRET}"  # the service got it

    assert response.status == 200
    opened = opened_as_an_agent_would(response.content, outer)
    assert SECRET not in opened
    assert f'"echo": "{REDACTED}"' in opened and '"note": "as received"' in opened
    assert SECRET.encode() not in response.content
    assert EgressCall.objects.get().outcome == "sent"
    assert_nowhere_else(caplog)


@pytest.mark.parametrize("layers", [[form] for form in PACK] + list(NESTED.values()))
def test_compressed_content_without_the_credential_reaches_the_agent_byte_for_byte(
    compressing, layers
):
    body = pack(layers, json.dumps({"refund": "re_1"}).encode())
    response, _ = compressing({"Content-Type": "application/octet-stream"}, lambda _: body)
    assert response.content == body


def test_a_credential_in_a_zip_members_name_or_a_gzip_file_name_is_taken_out(compressing):
    def named(secret):
        return zipped({f"reports/{secret}.json": b"{}", "plain.txt": b"nothing here"})

    response, _ = compressing({"Content-Type": "application/zip"}, named)
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        assert archive.namelist() == [f"reports/{REDACTED}.json", "plain.txt"]
        assert archive.read("plain.txt") == b"nothing here"

    def gzip_named(secret):
        out = io.BytesIO()
        with gzip.GzipFile(filename=f"{secret}.json", mode="wb", fileobj=out, mtime=0) as file:
            file.write(b'{"refund": "re_1"}')
        return out.getvalue()

    response, _ = compressing({"Content-Type": "application/gzip"}, gzip_named)
    assert SECRET.encode() not in response.content
    assert gzip.decompress(response.content) == b'{"refund": "re_1"}'


@pytest.mark.parametrize(
    "body",
    [
        b"x^2 is the square of x",  # a zlib header's two bytes, by chance
        b"a zip's end record reads PK\x05\x06 in its docs",
        b"\x1f\x8b but not gzip",
    ],
)
def test_a_body_that_only_looks_compressed_is_left_as_it_is(compressing, body):
    response, _ = compressing({"Content-Type": "text/plain"}, lambda _: body)
    assert response.content == body


@pytest.mark.parametrize("form", ["gzip", "zip", "bzip2", "xz"])
def test_a_body_said_to_be_compressed_that_does_not_open_is_withheld(compressing, form, caplog):
    outcome, _ = compressing(
        {"Content-Type": MEDIA[form]}, lambda secret: b"plain " + secret.encode()
    )
    assert isinstance(outcome, EgressFailed)
    assert "answer withheld" in str(outcome) and "does not open" in str(outcome)
    assert SECRET not in str(outcome)
    assert EgressCall.objects.get().outcome == "failed"
    assert_nowhere_else(caplog)


@pytest.mark.parametrize(
    "form, headers",
    [
        ("br", {"Content-Type": "application/x-brotli"}),
        ("br", {"Content-Encoding": "br", "Content-Type": "application/json"}),
        ("br", {"Content-Disposition": "attachment; filename=echo.json.br"}),
        ("zstd", {"Content-Type": "application/zstd"}),
        ("zstd", {"Content-Encoding": "zstd", "Content-Type": "application/json"}),
        ("zstd", {"Content-Type": "application/octet-stream"}),  # its magic bytes only
    ],
)
def test_brotli_and_zstd_are_opened_when_their_decoder_is_installed_and_withheld_otherwise(
    compressing, form, headers, caplog
):
    installed = unpack.FORMATS[form]
    if installed.reader:
        compress = installed.pack(b"")
        response, _ = compressing(headers, lambda secret: compress(echo_body(secret)))
        # A transfer encoding is decoded for the agent; content stays as it was sent.
        encoded = "Content-Encoding" in headers
        shown = response.content if encoded else _read_all(installed, response.content)
        assert SECRET.encode() not in shown and REDACTED.encode() in shown
    else:
        # The service's bytes do not matter: nothing here could open them, nor check them.
        magic = b"\x28\xb5\x2f\xfd" if form == "zstd" else b"\x1b"
        outcome, _ = compressing(headers, lambda secret: magic + secret.encode())
        assert isinstance(outcome, EgressFailed)
        assert "answer withheld" in str(outcome) and "cannot" in str(outcome)
        assert SECRET not in str(outcome)
        assert_nowhere_else(caplog)


def _read_all(form, data):
    reader, out = form.reader(data), b""
    while chunk := reader.read(65536):
        out += chunk
    return out


def test_an_encoding_the_gateway_cannot_decode_is_withheld(compressing):
    outcome, _ = compressing({"Content-Encoding": "compress"}, lambda secret: secret.encode())
    assert isinstance(outcome, EgressFailed) and "Content-Encoding compress" in str(outcome)


def test_a_gzip_transfer_encoding_is_still_decoded_and_scrubbed(compressing):
    response, _ = compressing(
        {"Content-Encoding": "gzip", "Content-Type": "application/json"},
        lambda secret: gzip.compress(echo_body(secret)),
    )
    assert response.json() == {"echo": REDACTED, "note": "as received"}
    assert "content-encoding" not in response.headers


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_an_empty_body_under_a_content_encoding_is_empty(compressing, coding):
    response, _ = compressing({"Content-Encoding": coding}, lambda _: b"", status=204)
    assert (response.status, response.content) == (204, b"")


def test_an_encrypted_zip_member_is_withheld(compressing):
    def encrypted(secret):
        # Marked as ZipCrypto marks a member, in its local and its central header (zipfile
        # writes no encryption): no one here has its password.
        data = bytearray(zipped({"echo.json": echo_body(secret)}))
        for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            data[data.index(signature) + offset] |= 0x1
        return bytes(data)

    outcome, _ = compressing({"Content-Type": "application/zip"}, encrypted)
    assert isinstance(outcome, EgressFailed) and "encrypted" in str(outcome)


def zeros_gzip(size):
    packer = zlib.compressobj(wbits=31)
    block = bytes(1 << 20)
    return b"".join(packer.compress(block) for _ in range(size >> 20)) + packer.flush()


BOMBS = {
    # 32 MiB of zeros, about 32 KiB on the wire (bzip2: 46 bytes).
    "gzip content": ({"Content-Type": "application/gzip"}, lambda: zeros_gzip(32 << 20)),
    "gzip undeclared": ({}, lambda: zeros_gzip(32 << 20)),
    "gzip transfer": ({"Content-Encoding": "gzip"}, lambda: zeros_gzip(32 << 20)),
    "bzip2": ({}, lambda: bz2.compress(bytes(32 << 20))),
    "zip member": ({}, lambda: zipped({"zeros": bytes(32 << 20)})),
    "zip members": ({}, lambda: zipped({f"{n}.txt": b"" for n in range(1001)})),
    "zip ratio": ({}, lambda: zipped({"zeros": bytes(900_000)}, zipfile.ZIP_BZIP2)),
    "zip in zip": (
        {},
        lambda: zipped({f"{n}.zip": zipped({"z": bytes(200_000)}) for n in range(10)}),
    ),
    "five layers": ({}, lambda: pack(["gzip"] * 5, b"{}")),
    # Opened when their decoder is installed (within the budget), else withheld unopened.
    "br": ({"Content-Type": "application/x-brotli"}, lambda: installed_bomb("br")),
    "zstd": ({"Content-Type": "application/zstd"}, lambda: installed_bomb("zstd")),
}


def installed_bomb(form):
    packer = unpack.FORMATS[form].pack
    if packer:
        return packer(b"")(bytes(32 << 20))
    return (b"\x28\xb5\x2f\xfd" if form == "zstd" else b"\x1b") + b" unopenable here"


REASONS = {
    "gzip transfer": "larger than 1000000 bytes decoded",
    "zip members": "more than 1000 members",
    "zip ratio": "times its compressed size",
    "five layers": "more than 4 layers deep",
}


@pytest.mark.parametrize("bomb", BOMBS)
def test_a_compression_bomb_is_withheld_having_opened_no_more_than_the_budget(compressing, bomb):
    headers, make = BOMBS[bomb]
    body = make()
    tracemalloc.start()
    try:
        outcome, _ = compressing(headers, lambda _: body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(outcome, EgressFailed), outcome
    reason = REASONS.get(bomb, "opens to more than 1000000 bytes")
    if bomb in unpack.FORMATS and not unpack.FORMATS[bomb].reader:
        reason = "cannot open"
    assert reason in str(outcome)
    # The budget (1 MB) and its copies, never the 32 MiB the bomb opens to.
    assert peak < len(body) * 3 + 8_000_000, peak


def test_four_layers_are_opened(compressing):
    response, _ = compressing({}, lambda secret: pack(["gzip"] * 4, echo_body(secret)))
    assert SECRET not in opened_as_an_agent_would(response.content)
