"""One model per key in a process: the cache every weight-holding module keeps.

Batch workers, Serve replicas and drivers ask for the same model many times; it is built
once per key (its location, device, ...) and kept, behind a lock, so threads share it and
only one of them builds it. `clear()` forgets them all (each is freed once nothing else
holds it).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ProcessCache(Generic[T]):
    """Models by key, each built on first use by `build()` (under the lock, checked again
    there, so two threads never build the same one)."""

    def __init__(self):
        self._items: dict[Hashable, T] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        item = self._items.get(key)
        if item is not None:
            return item
        with self._lock:
            item = self._items.get(key)
            if item is None:
                item = build()
                self._items[key] = item
        return item

    def pop(self, key: Hashable, default: Any = None) -> T | Any:
        with self._lock:
            return self._items.pop(key, default)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
