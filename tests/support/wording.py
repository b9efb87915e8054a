"""What Django's form fields and validators, and jsonschema, say when they refuse a value, asked
of them as the test runs.

A test asserts alwayson's behaviour: that it refuses, which field it names, which limit it set,
and that it passes the library's reason on. The reason's words are the library's, to change in
any release (or to translate): a test that spelled them out would fail on an upgrade that
changed nothing of alwayson's.
"""

from django import forms
from django.utils.html import escape
from jsonschema import Draft202012Validator


def field_error(field: forms.Field, code: str, **params) -> str:
    """What `field` says for the error `code` ("required", "invalid", "invalid_choice"), with
    the values Django puts in it (`value` for a choice field's invalid_choice)."""
    return str(field.error_messages[code]) % params


def limit_error(validator, shown=None) -> str:
    """What a limit validator (MinValueValidator, MaxLengthValidator, ...) says of a value
    `shown` (a length validator shows the length it found)."""
    return str(validator.message % {"limit_value": validator.limit_value, "show_value": shown})


def schema_error(schema: dict, instance, path: str = "") -> str:
    """jsonschema's message for the error at `path` ("amount", "lines/0", "" for the whole) of
    `instance` under `schema`: alwayson writes it after its own prefix."""
    for error in Draft202012Validator(schema).iter_errors(instance):
        if "/".join(str(part) for part in error.absolute_path) == path:
            return error.message
    raise AssertionError(f"the schema finds no error at {path!r} in {instance!r}")


def in_html(text: str) -> str:
    """`text` as a template writes it into a page."""
    return str(escape(text))
