"""The credential taken out of whatever a service answers, in every form it may be echoed."""

import re
from functools import lru_cache
from itertools import product

REDACTED = "[redacted]"


def scrub(data, secret):
    """`data` (str or bytes) with the credential replaced by REDACTED in every form a service
    may write it back in, wherever an answer reaches the agent: body, headers, reason phrase,
    an EgressFailed message. A str is matched as its UTF-8 bytes."""
    if not secret or not isinstance(data, str | bytes):
        return data
    pattern, redacted = secret_pattern(secret), REDACTED.encode()
    if isinstance(data, bytes):
        return pattern.sub(redacted, data)
    return pattern.sub(redacted, data.encode("utf-8", "surrogatepass")).decode(
        "utf-8", "surrogatepass"
    )


@lru_cache(maxsize=16)
def secret_pattern(secret: str) -> re.Pattern:
    """The credential as a service may echo it: each character literal or escaped (see
    _chars), so raw, percent-encoded (quote or quote_plus, either case of hex, also %25XX
    double-encoded), JSON-escaped (\\uXXXX either case, \\/, fully or in part) and HTML
    character references, mixed in any way; or its base64 (_base64), each base64 character
    escaped the same ways. Not covered: other text encodings (UTF-16, hex, MIME base64 broken
    into lines), and an echo a service transforms further (hashed, reversed, split)."""
    data = secret.encode()
    forms = [b"".join(_chars(ch) for ch in secret)]
    # Under 6 bytes, the base64 forms are too few characters not to match unrelated text.
    if len(data) >= 6:
        forms += _base64(data)
    return re.compile(b"|".join(forms))


_HTML_NAMES = {
    "&": "amp",
    "<": "lt",
    ">": "gt",
    '"': "quot",
    "'": "apos",
    "/": "sol",
    "+": "plus",
    "=": "equals",
}
_JSON_SHORT = {
    "/": "/",
    '"': '"',
    "\\": "\\",
    "\b": "b",
    "\f": "f",
    "\n": "n",
    "\r": "r",
    "\t": "t",
}


def _hex(value: int, digits: int = 0) -> bytes:
    """`value` in hexadecimal as a pattern matching either case, with optional leading 0s."""
    text = f"{value:0{digits}x}" if digits else "0*" + f"{value:x}"
    return "".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in text).encode()


def _chars(chars) -> bytes:
    """A pattern for any one of `chars` as a service may write it. Each form starts with its
    own byte (the character, %, \\, & or +), so a position that starts none fails fast."""
    literal, percent, backslash, reference = [], [], [], []
    for char in chars:
        code, utf8 = ord(char), char.encode()
        literal.append(re.escape(utf8))
        percent.append(b"%(?:25)?".join(_hex(byte, 2) for byte in utf8))
        units = [code]
        if code > 0xFFFF:  # JSON writes it as a surrogate pair
            high, low = divmod(code - 0x10000, 0x400)
            units = [0xD800 + high, 0xDC00 + low]
        backslash.append(b"u" + rb"\\u".join(_hex(unit, 4) for unit in units))
        if char in _JSON_SHORT:
            backslash.append(re.escape(_JSON_SHORT[char].encode()))
        reference += [f"#0*{code}".encode(), b"#[xX]" + _hex(code)]
        if char in _HTML_NAMES:
            reference.append(_HTML_NAMES[char].encode())
    forms = [
        b"(?:" + b"|".join(literal) + b")",
        b"%(?:25)?(?:" + b"|".join(percent) + b")",
        rb"\\(?:" + b"|".join(backslash) + b")",
        b"&(?:" + b"|".join(reference) + b");",
    ]
    if " " in chars:
        forms.append(rb"\+")
    return b"(?:" + b"|".join(forms) + b")"


_BASE64_ALPHABETS = (
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
)


def _base64(data: bytes) -> list[bytes]:
    """Patterns for `data` inside base64 text (standard and urlsafe, padded or not) at each
    of the three alignments it can have there: `Basic user:secret` puts it after a prefix of
    any length. A base64 character that mixes the secret's bits with its neighbours' matches
    any of the characters those neighbours could make, so the match takes every character
    that carries a bit of the secret."""
    patterns = []
    for alphabet in _BASE64_ALPHABETS:
        for offset in range(3):
            bits = "?" * 8 * offset + "".join(f"{byte:08b}" for byte in data)
            bits += "?" * (-len(bits) % 6)
            chars = []
            for start in range(0, len(bits), 6):
                window = bits[start : start + 6]
                if window == "??????":
                    continue  # the prefix's alone
                choices = product(*("01" if bit == "?" else bit for bit in window))
                values = sorted({int("".join(choice), 2) for choice in choices})
                chars.append(_chars([alphabet[value] for value in values]))
            patterns.append(b"".join(chars) + _chars("=") + b"{0,2}")
    return patterns
