"""The metric types a process counts with: counters and histograms, by labels."""

import json
import math
from bisect import bisect_left
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from . import recorder

INF = math.inf


def _labels(labelnames, labels) -> str:
    if set(labels) != set(labelnames):
        raise ValueError(f"labels must be {sorted(labelnames)}, not {sorted(labels)}")
    return json.dumps({name: str(labels[name]) for name in sorted(labels)}, separators=(",", ":"))


@dataclass(frozen=True)
class Counter:
    name: str  # without _total: the exposition adds it
    documentation: str
    labelnames: tuple = ()
    # Label values always shown, at 0 until counted: {"outcome": RUN_OUTCOMES}.
    known: tuple = ()

    def inc(self, amount=1, **labels):
        recorder.RECORDER.add([((self.name, _labels(self.labelnames, labels), ""), amount)])

    def family(self, totals):

        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        series = {labels: values.get("", 0.0) for labels, values in totals.items()}
        for labels in _known_series(self.labelnames, self.known):
            series.setdefault(labels, 0.0)
        for labels, value in sorted(series.items()):
            family.add_metric(_label_values(labels, self.labelnames), value)
        return family


@dataclass(frozen=True)
class Histogram:
    name: str
    documentation: str
    buckets: tuple  # upper bounds, ascending, without +Inf
    labelnames: tuple = ()
    known: tuple = ()

    def observe(self, value, **labels):
        self.observe_many([value], **labels)

    def observe_many(self, values, **labels):
        """Observations of one series, counted as one addition (one flush, not one each)."""
        labels = _labels(self.labelnames, labels)
        items = [((self.name, labels, "sum"), sum(values))]
        for value in values:
            items.append(((self.name, labels, _bound_text(self.bucket_of(value))), 1))
        recorder.RECORDER.add(items)

    def bucket_of(self, value) -> float:
        """The smallest bound at or above `value`: a row per bucket, made cumulative at scrape."""
        index = bisect_left(self.buckets, value)
        return self.buckets[index] if index < len(self.buckets) else INF

    def family(self, totals):

        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        series = dict(totals)
        for labels in _known_series(self.labelnames, self.known):
            series.setdefault(labels, {})
        bounds = (*self.buckets, INF)
        for labels, values in sorted(series.items()):
            counts = [0.0] * len(bounds)
            for bucket, value in values.items():
                if bucket != "sum":
                    # A bound from an older release falls in the next bound of this one.
                    counts[bounds.index(self.bucket_of(float(bucket)))] += value
            cumulative, running = [], 0.0
            for bound, count in zip(bounds, counts, strict=True):
                running += count
                cumulative.append((floatToGoString(bound), running))
            family.add_metric(
                _label_values(labels, self.labelnames), cumulative, sum_value=values.get("sum", 0.0)
            )
        return family


def _bound_text(bound) -> str:
    """A bucket's upper bound as stored: "0.5", "600.0", "+Inf"."""
    return "+Inf" if bound == INF else repr(float(bound))


def _known_series(labelnames, known):
    if not labelnames:
        return ["{}"]
    if not known:
        return []
    (name,) = labelnames
    return [_labels(labelnames, {name: value}) for value in known]


def _label_values(labels, labelnames):
    parsed = json.loads(labels)
    return [parsed.get(name, "") for name in labelnames]
