"""The metrics of a model base path in a bucket (serving/repository/bucket.py): the store's faults, and its
requests, so that what polling costs can be read off a scrape (docs/serving-versions.md, "Object storage").

`ServingMetrics` (serving/observability/metrics.py) builds them with its own counter factory, so they render,
and add up over the workers of `--num_workers`, as every other counter does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ctr_store.errors import ERROR, HASH_MISMATCH, REASONS
from ctr_store.versions import BAD_MANIFEST

# Labels of ctr_serving_repository_errors_total: ctr_store's reasons, and a version's own bad bytes.
STORE_ERROR_REASONS = (*REASONS, HASH_MISMATCH, BAD_MANIFEST, ERROR)
STORE_REQUEST_KINDS = ("LIST", "GET")  # what a poll and a download send (shown at 0 from start-up)

C = TypeVar("C")


def store_counters(counter: Callable[[str, str, Sequence[str]], C]) -> tuple[C, C]:
    """(errors, requests), made by `counter(name, help, labelnames)`."""
    errors = counter(
        "ctr_serving_repository_errors_total",
        "Failed polls and downloads of a model base path in a bucket, by the store's fault: "
        f"{', '.join(STORE_ERROR_REASONS)}.",
        ("model_name", "reason"),
    )
    requests = counter(
        "ctr_serving_repository_store_requests_total",
        "Requests sent to the object store for a model base path in a bucket, by kind (LIST, GET).",
        ("model_name", "kind"),
    )
    return errors, requests
