"""Compressed bytes in a service's answer, opened as an agent could open them, so that the
scrub (alwayson/egress/scrub.py) sees what is inside: the transfer's `Content-Encoding`
(decode_transfer: here, not by httpx, whose decoders put no bound on what one chunk inflates
to) and compressed content, said to be so or recognised by its magic bytes.

Each layer is opened, what it holds opened again, and scrubbed; a layer that carried the
credential is packed again without it, in its format. An answer whose layers cannot all be
checked or written again is withheld (Withheld), and every byte any layer opens to counts
against one budget, so a compression bomb costs at most max_unpacked_bytes of work. What
is opened and what is withheld: docs/how-to/egress.md, "Compressed answers".
"""

import bz2
import gzip
import io
import re
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

try:
    import lzma
except ImportError:  # a Python built without liblzma
    lzma = None
try:
    import brotli
except ImportError:
    brotli = None
try:
    from compression import zstd  # Python 3.14
except ImportError:
    try:
        from backports import zstd
    except ImportError:
        zstd = None

# Layers inside layers (a gzip in a zip in a gzip is 3): deeper, the answer is withheld.
MAX_DEPTH = 4
# Zip members in one answer, all archives together, and the most one member may inflate
# relative to its compressed size (deflate itself stops near 1032).
MAX_MEMBERS = 1000
MAX_RATIO = 1100
CHUNK = 64 * 1024


class Withheld(Exception):
    """The answer cannot be shown to the agent: why, in words an agent can act on."""


class Budget:
    """What every layer of one answer may open to, together."""

    def __init__(self, limit: int, members: int = MAX_MEMBERS, over: str = ""):
        self.limit = limit
        self.left = limit
        self.members = members
        self.over = over or f"its compressed content opens to more than {limit} bytes"

    def spend(self, size: int):
        self.left -= size
        if self.left < 0:
            raise Withheld(self.over)


class _ZlibReader:
    """zlib (wbits 15) or raw deflate (-15) streams read as a file, each stream's unused
    data opened as the next, as an agent's decompressobj loop would."""

    def __init__(self, data: bytes, wbits: int):
        self.wbits = wbits
        self.stream = zlib.decompressobj(wbits)
        self.tail = data

    def read(self, size: int) -> bytes:
        while True:
            if self.stream.eof:
                if not self.stream.unused_data:
                    return b""
                self.tail = self.stream.unused_data
                self.stream = zlib.decompressobj(self.wbits)
            out = self.stream.decompress(self.tail, size)
            self.tail = self.stream.unconsumed_tail
            if out:
                return out
            if not self.tail and not self.stream.eof:
                raise EOFError("the stream ended before its end marker")


class _BrotliReader:
    """A brotli stream read as a file: brotli's own bound on each call's output."""

    def __init__(self, data: bytes):
        self.stream = brotli.Decompressor()
        self.data = data

    def read(self, size: int) -> bytes:
        if self.stream.is_finished():
            return b""
        data, self.data = self.data, b""
        out = self.stream.process(data, output_buffer_limit=size)
        if not out and not self.stream.is_finished():
            raise EOFError("the stream ended before its end marker")
        return out


def _deflate_reader(data: bytes):
    """HTTP's "deflate" is zlib's format; some servers send raw deflate (httpx reads both)."""
    return _ZlibReader(data, 15 if _zlib_header(data) else -15)


def _deflate_pack(original: bytes) -> Callable[[bytes], bytes]:
    if _zlib_header(original):
        return zlib.compress

    def raw(data):
        packer = zlib.compressobj(wbits=-15)
        return packer.compress(data) + packer.flush()

    return raw


@dataclass(frozen=True)
class Format:
    label: str  # as an agent reads it
    reader: Callable | None  # bytes -> an object with read(size); None: not installed
    pack: Callable | None  # (original bytes) -> (bytes -> the same format); None: cannot
    missing: str = ""  # what to install to open it


def _same(pack):
    return lambda original: pack


_ERRORS = [OSError, EOFError, ValueError, zlib.error]
FORMATS = {
    "gzip": Format(
        "gzip",
        lambda data: gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb"),
        _same(lambda data: gzip.compress(data, mtime=0)),
    ),
    "zlib": Format("zlib", lambda data: _ZlibReader(data, 15), _same(zlib.compress)),
    "deflate": Format("deflate", _deflate_reader, _deflate_pack),
    "bzip2": Format(
        "bzip2", lambda data: bz2.BZ2File(io.BytesIO(data), mode="rb"), _same(bz2.compress)
    ),
    "xz": Format(
        "xz",
        lzma and (lambda data: lzma.LZMAFile(io.BytesIO(data), mode="rb")),
        lzma and _same(lzma.compress),
        "a Python built with lzma",
    ),
    # brotli 1.2 on: the first with a bound on what one call returns (output_buffer_limit).
    "br": Format(
        "brotli",
        brotli and hasattr(brotli.Decompressor, "can_accept_more_data") and _BrotliReader,
        brotli and _same(brotli.compress),
        "the brotli package (1.2 or later)",
    ),
    "zstd": Format(
        "zstd",
        zstd and (lambda data: zstd.ZstdFile(io.BytesIO(data), mode="rb")),
        zstd and _same(zstd.compress),
        "the backports.zstd package (Python 3.14's compression.zstd)",
    ),
}
if lzma:
    _ERRORS.append(lzma.LZMAError)
if brotli:
    _ERRORS.append(brotli.error)
if zstd:
    _ERRORS.append(zstd.ZstdError)
_ERRORS = tuple(_ERRORS)
# The formats that can be decoded here: what the gateway's client accepts as an encoding.
DECODERS = sorted(name for name, form in FORMATS.items() if form.reader)
ACCEPT_ENCODING = ", ".join(
    name for name in ("gzip", "deflate", "br", "zstd") if FORMATS[name].reader
)

_ENCODINGS = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate", "br": "br", "zstd": "zstd"}
_MEDIA_TYPES = {
    "application/gzip": "gzip",
    "application/x-gzip": "gzip",
    "application/gzip-compressed": "gzip",
    "application/x-gzip-compressed": "gzip",
    "application/x-gunzip": "gzip",
    "application/x-tgz": "gzip",
    "application/zlib": "zlib",
    "application/x-zlib": "zlib",
    "application/deflate": "deflate",
    "application/x-deflate": "deflate",
    "application/brotli": "br",
    "application/x-brotli": "br",
    "application/zstd": "zstd",
    "application/x-zstd": "zstd",
    "application/x-bzip": "bzip2",
    "application/x-bzip2": "bzip2",
    "application/x-xz": "xz",
    "application/x-lzma": "xz",
    "application/zip": "zip",
    "application/x-zip": "zip",
    "application/x-zip-compressed": "zip",
}
_SUFFIXES = {
    ".gz": "gzip",
    ".gzip": "gzip",
    ".tgz": "gzip",
    ".zz": "zlib",
    ".zlib": "zlib",
    ".deflate": "deflate",
    ".br": "br",
    ".zst": "zstd",
    ".zstd": "zstd",
    ".bz2": "bzip2",
    ".tbz2": "bzip2",
    ".xz": "xz",
    ".txz": "xz",
    ".lzma": "xz",
    ".zip": "zip",
}
# Magic bytes: a format recognised whatever the answer says (brotli and raw deflate have
# none; zip is recognised by its end record, as zipfile finds it).
_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\xfd7zXZ\x00", "xz"),
)
_BZIP2 = re.compile(rb"BZh[1-9]1AY&SY")
_FILENAME = re.compile(r"""filename\*?\s*=\s*(?:[\w-]*'[\w-]*')?"?([^";]+)""", re.IGNORECASE)


def _zlib_header(data: bytes) -> bool:
    """A zlib stream's two header bytes: deflate, a window of at most 32 KiB, no preset
    dictionary (which only its writer holds), and the header's check."""
    if len(data) < 2:
        return False
    cmf, flags = data[0], data[1]
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and not flags & 0x20 and (cmf << 8 | flags) % 31 == 0


def decode_transfer(raw: bytes, content_encoding: str, budget: Budget) -> bytes:
    """The body a `Content-Encoding` (comma-separated, applied in order) was put on: each
    decoded in turn within `budget`. Withheld for an encoding not decoded here, or one that
    does not decode."""
    if not raw:
        return raw  # a HEAD's, a 204's: nothing was encoded
    body = raw
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        name = _ENCODINGS.get(coding)
        form = FORMATS.get(name) if name else None
        if form is None or not form.reader:
            raise Withheld(
                f"it was sent with Content-Encoding {coding}, which the gateway cannot decode"
                " and so cannot check for the credential"
            )
        body, complete = _open(form, body, budget)
        if not complete:
            raise Withheld(f"its Content-Encoding {coding} does not decode")
    return body


def declared(content_type: str, content_disposition: str) -> str | None:
    """The compressed format an answer's headers say its body is, if any."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media in _MEDIA_TYPES:
        return _MEDIA_TYPES[media]
    match = _FILENAME.search(content_disposition or "")
    return _suffix(match.group(1)) if match else None


@dataclass(frozen=True)
class Credential:
    """The credential as the scrub finds it (scrub.secret_pattern), and what replaces it."""

    pattern: re.Pattern
    redacted: bytes

    def sub(self, data: bytes) -> bytes:
        return self.pattern.sub(self.redacted, data)

    def search(self, data: bytes) -> bool:
        return self.pattern.search(data) is not None


def opened_and_scrubbed(data: bytes, hint: str | None, scrub: Credential, budget) -> bytes:
    """`data` scrubbed, with every compressed layer in it opened, checked and, where it
    carries the credential, packed again without it (the module's docstring). `hint`: the
    format the answer's headers say it is (declared)."""
    return _content(data, hint, scrub, budget, 0)


def _content(data, hint, scrub, budget, depth) -> bytes:
    name, said = _recognise(data, hint)
    if name is None:
        return scrub.sub(data)
    if depth >= MAX_DEPTH:
        raise Withheld(f"its compressed content is nested more than {MAX_DEPTH} layers deep")
    if name == "zip":
        return _zip(data, said, scrub, budget, depth)
    return _stream(name, data, said, scrub, budget, depth)


def _recognise(data, hint) -> tuple[str | None, bool]:
    """The format of `data` (by its magic bytes, else by what it was said to be), and
    whether it was said to be compressed (a layer said to be compressed that does not
    open is withheld; one only sniffed is then taken as plain bytes)."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name, hint is not None
    if _BZIP2.match(data):
        return "bzip2", hint is not None
    if _zlib_header(data):
        return "zlib", hint is not None
    if hint == "zip" or _zip_end(data):
        return "zip", hint is not None
    return hint, hint is not None


def _zip_end(data) -> bool:
    """A zip's end record anywhere zipfile looks for it (the last 64 KiB: a comment may
    follow it)."""
    return b"PK\x05\x06" in data[-(65536 + 22) :]


def _open(form: Format, data: bytes, budget: Budget) -> tuple[bytes, bool]:
    """What `data` opens to as `form`, read a chunk at a time within `budget`, and whether
    it opened to its end (False: damaged or truncated; what opened before is returned)."""
    out = bytearray()
    try:
        reader = form.reader(data)
        while chunk := reader.read(min(CHUNK, budget.left + 1)):
            budget.spend(len(chunk))
            out += chunk
    except _ERRORS:
        return bytes(out), False
    return bytes(out), True


def _stream(name, data, said, scrub, budget, depth) -> bytes:
    form = FORMATS[name]
    if not form.reader:
        raise Withheld(
            f"it is {form.label} content, which the gateway cannot open without"
            f" {form.missing}, and so cannot check for the credential"
        )
    inner, complete = _open(form, data, budget)
    if not inner and not complete:
        if said:
            raise Withheld(f"it says it is {form.label} content but does not open as that")
        return scrub.sub(data)  # only looked like it: plain bytes
    opened = _content(inner, None, scrub, budget, depth + 1)
    if opened == inner and not scrub.search(data):
        return data
    if not complete:
        raise Withheld(
            f"its {form.label} content carries the credential and is damaged, so it cannot"
            " be written again without it"
        )
    pack = form.pack and form.pack(data)
    if not pack:
        raise Withheld(
            f"its {form.label} content carries the credential, and the gateway cannot write"
            f" {form.label} again without {form.missing}"
        )
    return pack(opened)


def _zip(data, said, scrub, budget, depth) -> bytes:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, *_ERRORS):
        if said:
            raise Withheld("it says it is a zip archive but does not open as one") from None
        return scrub.sub(data)
    with archive:
        members = archive.infolist()
        budget.members -= len(members)
        if budget.members < 0:
            raise Withheld(f"its zip archives hold more than {MAX_MEMBERS} members")
        if sum(member.file_size for member in members) > budget.left:
            raise Withheld(budget.over)
        for member in members:
            if member.flag_bits & 0x1:
                raise Withheld("its zip archive has an encrypted member, which cannot be checked")
            if member.file_size > MAX_RATIO * max(member.compress_size, 1):
                raise Withheld(
                    f"a member of its zip archive opens to more than {MAX_RATIO} times its"
                    " compressed size"
                )
        contents = [_member(archive, member, budget) for member in members]
    changed = bool(scrub.search(data))  # a name, a comment, an extra field
    opened = []
    for member, content in zip(members, contents, strict=True):
        inner = _content(content, _suffix(member.filename), scrub, budget, depth + 1)
        name = scrub.sub(member.filename.encode(errors="surrogatepass")).decode(
            errors="surrogatepass"
        )
        changed = changed or inner != content or name != member.filename
        opened.append((member, name, inner))
    return _packed_zip(opened) if changed else data


def _member(archive, member, budget) -> bytes:
    out = bytearray()
    try:
        with archive.open(member) as opened:
            while chunk := opened.read(min(CHUNK, budget.left + 1)):
                budget.spend(len(chunk))
                out += chunk
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, *_ERRORS):
        raise Withheld(
            "a member of its zip archive does not open, so it cannot be checked"
        ) from None
    return bytes(out)


def _packed_zip(members) -> bytes:
    """The archive again: each member under its scrubbed name, with its opened content, its
    time, attributes and compression method; no comment or extra field."""
    out = io.BytesIO()
    methods = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2}
    if lzma:
        methods.add(zipfile.ZIP_LZMA)
    with zipfile.ZipFile(out, "w") as archive:
        for member, name, content in members:
            entry = zipfile.ZipInfo(name, date_time=member.date_time)
            entry.external_attr = member.external_attr
            entry.compress_type = (
                member.compress_type if member.compress_type in methods else zipfile.ZIP_DEFLATED
            )
            archive.writestr(entry, content)
    return out.getvalue()


def _suffix(name: str) -> str | None:
    lowered = name.strip().lower()
    for suffix, form in _SUFFIXES.items():
        if lowered.endswith(suffix):
            return form
    return None
