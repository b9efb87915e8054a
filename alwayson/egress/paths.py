"""Paths as the services read them: the gateway's allowlist matches the normal form."""

import re
import unicodedata
from urllib.parse import unquote


class UncleanPath(ValueError):
    """A path the gateway will not send: the message says why, in words an agent can act on."""


def normal_path(path) -> str:
    """The path as the service reads it, whatever it decodes: percent-decoded until it stops
    changing. The allowlist is matched on this form, and the path is sent as written.

    Refused (UncleanPath): a path not starting with `/`; `?` or `#` (the query goes in
    params); a literal space or control character; escapes that are not UTF-8; and, in the
    decoded form, also after Unicode compatibility folding (fullwidth `．` and `／` are `.`
    and `/` to some servers): an IIS `%uXXXX` escape, a control character or NUL, a
    backslash, a `;` path parameter (`..;` is `..` to Tomcat), a `/` that was encoded, an
    empty segment (`//`) or a dot segment (`.`, `..`, or only dots and spaces, which Windows
    servers trim to nothing). Then every decoding a server may stop at has the same
    segments, and none of them climbs out of its prefix."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise UncleanPath("it must be a string starting with /")
    if "?" in path or "#" in path:
        raise UncleanPath("? and # are not part of a path: pass query parameters as params=")
    if any(ch.isspace() or unicodedata.category(ch) == "Cc" for ch in path):
        raise UncleanPath("it has a literal space or control character: percent-encode it (%20)")
    decoded = path
    try:
        while (once_more := unquote(decoded, errors="strict")) != decoded:
            decoded = once_more
    except UnicodeDecodeError:
        raise UncleanPath(
            "it has percent-escapes that are not UTF-8 (such as an overlong %c0%ae)"
        ) from None
    folded = unicodedata.normalize("NFKC", decoded)
    if re.search("%u[0-9a-f]{4}", folded, re.IGNORECASE):
        raise UncleanPath("it has an IIS %uXXXX escape: write the character in UTF-8 (%XX)")
    if any(unicodedata.category(ch) == "Cc" for ch in folded):
        raise UncleanPath("it has a control character or NUL once percent-decoded")
    if "\\" in folded:
        raise UncleanPath("it has a backslash once percent-decoded")
    if ";" in folded:
        raise UncleanPath("it has a ';' path parameter once percent-decoded")
    # Decoding and folding only ever add slashes: one more is a separator that was encoded.
    if folded.count("/") != path.count("/"):
        raise UncleanPath("it has an encoded '/' (%2F, or a look-alike once decoded)")
    if "//" in folded:
        raise UncleanPath("it has an empty segment (//)")
    if any(segment and not segment.strip(" .") for segment in folded.split("/")):
        raise UncleanPath("it has a dot segment ('.' or '..') once percent-decoded")
    return decoded


def unsafe_path(path) -> str:
    """Why a configured path prefix is refused, or "": it must be its own normal form, so
    it means what it says (`/v1/café`, not `/v1/caf%C3%A9`)."""
    try:
        normal = normal_path(path)
    except UncleanPath as exc:
        return str(exc)
    return "" if normal == path else "write it percent-decoded"
