"""What each shard added to a stage's counts: the numbers of one partition, for its metadata.

A run over a range of shards fills in one counts object for the whole range; the run summary
wants those totals, but each partition's materialization should carry its own numbers (a run
of 90 chunks over 16 shards must not show ``chunks 90`` on every partition). The stages that
work shard by shard are measured between the pairs they yield; the embed and write stages,
which do not, record per shard themselves into the same kind of mapping.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# Fields that are not sums over files: a maximum, the vector width.
_NOT_ADDITIVE = frozenset({"dims"})


def additive(counts: Any) -> dict[str, int]:
    """The integer fields of a counts dataclass that add up over shards."""
    if not is_dataclass(counts):
        return {}
    out: dict[str, int] = {}
    for f in fields(counts):
        value = getattr(counts, f.name)
        if isinstance(value, int) and not isinstance(value, bool) and f.name not in _NOT_ADDITIVE and not f.name.startswith("max_"):
            out[f.name] = value
    return out


def listed(counts: Any) -> dict[str, list]:
    """The list fields of a counts dataclass (its ``failures``): entries that belong to one shard."""
    if not is_dataclass(counts):
        return {}
    return {f.name: value for f in fields(counts) if isinstance(value := getattr(counts, f.name), list)}


def measured(
    stream: Iterable[tuple[str, T]], counts: Any, into: dict[str, dict[str, int]], lists: dict[str, dict[str, list]] | None = None
) -> Iterator[tuple[str, T]]:
    """Pass a stage's ``(shard, frame)`` pairs through, recording in ``into[shard]`` what that shard
    added to ``counts`` (a stage yields a shard's frame once that shard's work is counted; a shard
    that comes in pieces adds up what each piece added), and in ``lists[shard]`` the entries it
    added to the counts' lists (its failures)."""
    before = additive(counts)
    lengths = {k: len(v) for k, v in listed(counts).items()}
    for shard, frame in stream:
        now = additive(counts)
        got = into.setdefault(shard, {})
        for k, v in now.items():
            got[k] = got.get(k, 0) + v - before.get(k, 0)
        before = now
        if lists is not None:
            own = lists.setdefault(shard, {})
            for k, v in listed(counts).items():
                own.setdefault(k, []).extend(v[lengths.get(k, 0) :])
                lengths[k] = len(v)
        yield shard, frame
        del frame  # not held while the stage makes the next


def delta(before: dict[str, int], counts: Any) -> dict[str, int]:
    """What ``counts`` gained since ``before`` (an :func:`additive` snapshot)."""
    return {k: v - before.get(k, 0) for k, v in additive(counts).items()}


__all__ = ["additive", "delta", "listed", "measured"]
