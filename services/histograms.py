"""The bucket boundaries of every duration histogram the services record.

OpenTelemetry's default explicit buckets (0, 5, 10, 25, … 10000) were chosen
for milliseconds; Basalt records durations in seconds (the unit OpenTelemetry's
semantic conventions ask for), so under the defaults every put, read and fsync
fell in the first bucket and ``histogram_quantile`` answered 2.5 s for a
0.23 ms put. The boundaries here run from 50 µs to 10 s on a 1-2.5-5 ladder,
each at most 2.5 times the one before, so a local put (~0.1-1 ms), an fsync
on a slow disk and a read a long poll held for seconds each land in buckets
that tell them apart. A call held longer than 10 s lands in ``+Inf``
(``histogram_quantile`` then answers 10 s, the last finite bound).

They reach the SDK as the instrument's advisory
(``explicit_bucket_boundaries_advisory``, an API argument): whatever
MeterProvider a process installs uses them unless a View of its own says
otherwise, and the services stay on the OpenTelemetry API alone.
"""

from __future__ import annotations

from opentelemetry.metrics import Histogram, Meter

#: Upper bounds (seconds, inclusive) of the explicit buckets of every duration
#: histogram: 50 µs … 10 s; slower lands in the ``+Inf`` bucket.
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


def duration_histogram(meter: Meter, name: str, description: str) -> Histogram:
    """A histogram of durations in seconds, bucketed by :data:`DURATION_BUCKETS_S`."""
    return meter.create_histogram(
        name,
        unit="s",
        description=description,
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
    )
