"""A thread-safe least-recently-used map bounded by the summed cost of its values: what a
searcher keeps between queries (the full-text leg's per-term weights, the vectors it took)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``max_cost`` of ``cost(value)`` summed (one per entry by default); the least
    recently read or written entries go first. Shared by a server's threads."""

    def __init__(self, max_cost: int, cost: Callable[[V], int] = lambda _: 1) -> None:
        self.max_cost = max_cost
        self._cost = cost
        self._items: OrderedDict[K, V] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def get_many(self, keys: Iterable[K]) -> dict[K, V]:
        with self._lock:
            got: dict[K, V] = {}
            for key in keys:
                value = self._items.get(key)
                if value is not None:
                    self._items.move_to_end(key)
                    got[key] = value
            return got

    def put(self, key: K, value: V) -> None:
        self.put_many(((key, value),))

    def put_many(self, items: Iterable[tuple[K, V]]) -> None:
        with self._lock:
            for key, value in items:
                old = self._items.pop(key, None)
                if old is not None:
                    self._total -= self._cost(old)
                self._items[key] = value
                self._total += self._cost(value)
            while self._total > self.max_cost and self._items:
                _, dropped = self._items.popitem(last=False)
                self._total -= self._cost(dropped)

    def __len__(self) -> int:
        return len(self._items)
