"""Reading the spans the loopback OTLP receiver (tests/tracing/conftest.py) decoded."""


def attributes(span):
    """An exported span's attributes as plain Python values."""
    out = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        value = getattr(a.value, kind)
        if kind == "array_value":
            value = [getattr(v, v.WhichOneof("value")) for v in value.values]
        out[a.key] = value
    return out
