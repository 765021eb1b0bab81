"""kube-apiserver's truncating backend: events cut to a size, batches split by size.

The rules of ``staging/src/k8s.io/apiserver/plugin/pkg/audit/truncate/truncate.go``:

* an event larger than ``max_event_size`` at level ``Request`` or ``RequestResponse``
  loses its ``requestObject`` and ``responseObject`` and gains the annotation
  ``audit.k8s.io/truncated: "true"``;
* an event still larger (or at ``Metadata`` level) is dropped;
* events are grouped in order into batches of at most ``max_batch_size`` bytes (a batch
  always takes at least one event).

Sizes are those of the event's JSON as it is sent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["TRUNCATED", "TruncateLimits", "fit", "split"]

#: The annotation kube-apiserver sets on an event it truncated.
TRUNCATED = "audit.k8s.io/truncated"


@dataclass(frozen=True)
class TruncateLimits:
    """kube-apiserver's defaults: 10 MiB batches, 100 KiB events."""

    max_batch_size: int = 10 * 1024 * 1024
    max_event_size: int = 100 * 1024


def fit(record: bytes, max_event_size: int) -> bytes | None:
    """``record`` (an event's JSON) within ``max_event_size``, truncated if it must be;
    ``None`` when it cannot be made to fit (or is not an event at all)."""
    if len(record) <= max_event_size:
        return record
    try:
        event = json.loads(record)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("level") not in ("Request", "RequestResponse"):
        return None
    event.pop("requestObject", None)
    event.pop("responseObject", None)
    annotations = event.get("annotations")
    event["annotations"] = {**(annotations if isinstance(annotations, dict) else {}), TRUNCATED: "true"}
    smaller = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
    return smaller if len(smaller) <= max_event_size else None


def split(sizes: Sequence[int], max_batch_size: int) -> list[int]:
    """How many of the items, in order, go into each batch so no batch passes ``max_batch_size``
    (one item larger than it goes alone)."""
    counts: list[int] = []
    count = total = 0
    for size in sizes:
        if count and total + size > max_batch_size:
            counts.append(count)
            count = total = 0
        count += 1
        total += size
    if count:
        counts.append(count)
    return counts
