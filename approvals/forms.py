"""What a person may send with an answer, as forms: the call's arguments built from their JSON
Schema (to edit before approving), a reason for a denial, the reply to a question.

The forms only turn text into values; the answer (approvals/services.py) checks them against
the schema and the asking agent's policy, so the page and the Python API refuse the same.
Every field of one approval carries its prefix, so a page showing a turn's several calls
keeps their fields apart.
"""

import json
import re
from functools import cached_property

from django import forms

from .services import REASON_MAX

# A string longer than this is edited in a text area.
LONG_TEXT = 200
NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


class _Omitted:
    """A blank optional field: the argument is left out, not set to nothing (JSON's null is
    a value a person may write)."""

    def __repr__(self):
        return "OMITTED"


OMITTED = _Omitted()


class _Typed(forms.CharField):
    """Text read as a JSON value; blank is OMITTED (or "required")."""

    def to_python(self, value):
        text = super().to_python(value)
        if text in self.empty_values:
            if self.required:
                raise forms.ValidationError(self.error_messages["required"], code="required")
            return OMITTED
        return self.parse(text)

    def shown(self, value) -> str:
        """An argument's value as the field shows it."""
        return json.dumps(value, ensure_ascii=False)


class NumberField(_Typed):
    """A JSON number as typed: 600 stays an int, 49.5 a float."""

    widget = forms.NumberInput(attrs={"step": "any", "inputmode": "decimal"})

    def parse(self, text):
        if not NUMBER.fullmatch(text):
            raise forms.ValidationError(f"Enter a number, not {text[:40]!r}.", code="invalid")
        value = json.loads(text)
        return int(value) if isinstance(value, float) and value.is_integer() else value


class IntegerField(NumberField):
    widget = forms.NumberInput(attrs={"step": "1", "inputmode": "numeric"})

    def parse(self, text):
        value = super().parse(text)
        if not isinstance(value, int):
            raise forms.ValidationError(f"Enter a whole number, not {text[:40]!r}.", code="invalid")
        return value


class JSONTextField(_Typed):
    """Any JSON value (a nested object, a list), written as JSON."""

    widget = forms.Textarea(attrs={"rows": 4, "spellcheck": "false"})

    def parse(self, text):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc.msg}.", code="invalid") from None

    def shown(self, value) -> str:
        return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True)


class JSONChoiceField(forms.ChoiceField):
    """One of a schema's `enum` values (or a boolean's two), whatever their JSON type."""

    def __init__(self, values, required, labels=None, **kwargs):
        labels = labels or {}
        choices = [
            (
                json.dumps(v),
                labels.get(json.dumps(v)) or (v if isinstance(v, str) else json.dumps(v)),
            )
            for v in values
        ]
        if not required:
            choices.insert(0, ("", "(not given)"))
        super().__init__(choices=choices, required=required, **kwargs)

    def clean(self, value):
        text = super().clean(value)
        return OMITTED if text in self.empty_values else json.loads(text)

    def shown(self, value) -> str:
        return json.dumps(value)


class StringField(forms.CharField):
    def __init__(self, keeps_blank, **kwargs):
        # Spaces are kept as typed: the schema, not the form, says what a string may be.
        super().__init__(strip=False, **kwargs)
        self.keeps_blank = keeps_blank  # "" the model gave stays "", a blank is left out

    def clean(self, value):
        value = super().clean(value)
        return OMITTED if value == "" and not self.keeps_blank else value

    def shown(self, value):
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _field(name, schema, required, present):
    """The form field for one argument, by its schema."""
    options = {
        "label": name,
        "required": required,
        "help_text": str(schema.get("description") or ""),
    }
    kind = schema.get("type")
    if isinstance(schema.get("enum"), list):
        return JSONChoiceField(schema["enum"], **options)
    if kind == "boolean":
        return JSONChoiceField([True, False], labels={"true": "yes", "false": "no"}, **options)
    if kind == "integer":
        return IntegerField(**options)
    if kind == "number":
        return NumberField(**options)
    if kind == "string":
        longest = schema.get("maxLength")
        widget = (
            forms.Textarea(attrs={"rows": 3})
            if isinstance(longest, int) and longest > LONG_TEXT
            else None
        )
        return StringField(present, widget=widget, **options)
    return JSONTextField(**{**options, "label": f"{name} (JSON)"})


class ArgumentsForm(forms.Form):
    """The arguments of a call as its schema describes them, filled with `arguments` (what a
    yes approves now), in the order of `names`. Arguments the schema does not describe are
    kept as they are."""

    def __init__(self, schema, arguments, names, *args, **kwargs):
        super().__init__(*args, label_suffix="", **kwargs)
        self.arguments = arguments
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = set(schema.get("required") or [])
        self.names = [name for name in names if name in properties]
        self.names += [name for name in properties if name not in self.names]
        for index, name in enumerate(self.names):
            described = properties[name] if isinstance(properties[name], dict) else {}
            field = _field(name, described, name in required, name in arguments)
            if name in arguments:
                field.initial = field.shown(arguments[name])
            self.fields[f"arg-{index}"] = field

    def edited(self) -> dict:
        """The arguments as the form has them (after is_valid)."""
        values = {name: self.cleaned_data[f"arg-{i}"] for i, name in enumerate(self.names)}
        edited = {}
        for name in [*self.names, *(n for n in self.arguments if n not in self.names)]:
            if name not in values:
                edited[name] = self.arguments[name]  # not in the schema: kept as it was
            elif values[name] is not OMITTED:
                edited[name] = values[name]
        return edited

    def posted(self) -> bool:
        """Whether the answer carried these fields: a plain Approve button does not."""
        return any(key.startswith(f"{self.prefix}-arg-") for key in self.data)


class DenyForm(forms.Form):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, label_suffix="", **kwargs)

    reason = forms.CharField(
        label="Reason (optional; the agent reads it)",
        required=False,
        max_length=REASON_MAX,
        widget=forms.Textarea(attrs={"rows": 2}),
    )


class ReplyForm(forms.Form):
    """A question's answer: one of its choices, or (if it takes free text) one's own."""

    def __init__(self, question, *args, **kwargs):
        super().__init__(*args, label_suffix="", **kwargs)
        self.question = question
        if question["choices"]:
            self.fields["choice"] = forms.ChoiceField(
                label="Choose an answer",
                choices=[(choice, choice) for choice in question["choices"]],
                required=False,
                widget=forms.RadioSelect,
            )
        if question["free_text"]:
            self.fields["own"] = forms.CharField(
                label="Your answer" if not question["choices"] else "Or write your own answer",
                required=False,
                max_length=question["max_length"],
                widget=forms.Textarea(attrs={"rows": 2}),
            )

    def clean(self):
        given = [
            value.strip()
            for value in (self.cleaned_data.get("choice"), self.cleaned_data.get("own"))
            if value and value.strip()
        ]
        if len(given) != 1:
            raise forms.ValidationError(
                "Choose one answer or write your own, not both."
                if given
                else "Choose an answer or write one."
            )
        self.cleaned_data["reply"] = given[0]
        return self.cleaned_data


class Invalid(Exception):
    """An answer's forms did not validate; the page shows their errors."""


class AnswerForms:
    """The forms of one approval on a page. All unbound; the one an answer uses is bound to
    what was posted (answer()), so the page shows it back with its errors."""

    def __init__(self, approval, data=None):
        self.approval = approval
        self.data = data
        self.prefix = f"a{approval.pk}"
        self.used = None

    # Each made when first asked for: an answer uses one of them, a page shows them all.
    @cached_property
    def arguments(self):
        return self._arguments() if self.approval.editable else None

    @cached_property
    def deny(self):
        return DenyForm(prefix=self.prefix)

    @cached_property
    def reply(self):
        question = self.approval.question
        return ReplyForm(question, prefix=self.prefix) if question else None

    def _arguments(self, data=None):
        approval = self.approval
        return ArgumentsForm(
            approval.details["schema"],
            approval.current_arguments,
            approval.argument_names,
            data,
            prefix=self.prefix,
        )

    def answer(self, answer) -> dict:
        """answer_approval's keywords for `answer` from the posted forms; Invalid if they do
        not validate. A "yes" without the argument fields (a plain Approve) changes nothing."""
        if answer == "yes" and self.approval.editable:
            posted = self._arguments(self.data)
            if not posted.posted():
                return {}
            self.arguments = self.used = posted
            if not posted.is_valid():
                raise Invalid
            return {"arguments": posted.edited()}
        if answer == "no":
            self.deny = self.used = DenyForm(self.data, prefix=self.prefix)
            if not self.deny.is_valid():
                raise Invalid
            return {"reason": self.deny.cleaned_data["reason"]}
        if answer == "replied":
            if not self.approval.question:
                raise ValueError(
                    f"reply: {self.approval.request_id} asks for a yes or a no, not a value"
                )
            self.reply = self.used = ReplyForm(
                self.approval.question, self.data, prefix=self.prefix
            )
            if not self.reply.is_valid():
                raise Invalid
            return {"reply": self.reply.cleaned_data["reply"]}
        return {}

    @property
    def editing(self) -> bool:
        """The answer changed the arguments: shown open again, with what was typed."""
        return self.used is not None and self.used is self.arguments

    @property
    def denying(self) -> bool:
        return self.used is not None and self.used is self.deny

    def problems(self) -> list[str]:
        """The errors of the form the answer used, each naming its field."""
        form = self.used
        if form is None:
            return []
        problems = []
        for name, errors in form.errors.items():
            label = form.fields[name].label if name in form.fields else ""
            problems += [f"{label}: {error}" if label else str(error) for error in errors]
        return problems
