"""A small least-recently-used map, sized by count or by the values' bytes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class LRU:
    """A small least-recently-used map: get() refreshes, put() evicts the oldest while the values'
    total `size` (1 each by default; e.g. their bytes) is above `capacity`. A value whose size is
    above `max_item` (default: capacity) is not kept: put() leaves the map as it was."""

    def __init__(self, capacity: int, size: Callable[[Any], int] | None = None, max_item: int | None = None):
        self.capacity = capacity
        self.max_item = capacity if max_item is None else max_item
        self._size = size or (lambda value: 1)
        self._total = 0
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def items(self):
        return self._items.items()

    @property
    def total(self) -> int:
        """The values' summed `size` (bytes, for a cache sized by bytes)."""
        return self._total

    def values(self):
        return self._items.values()

    def clear(self) -> None:
        self._items.clear()
        self._total = 0

    def get(self, key: Hashable) -> Any:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        return None

    def put(self, key: Hashable, value: Any) -> None:
        if self._size(value) > self.max_item:
            return
        if key in self._items:
            self._total -= self._size(self._items[key])
        self._items[key] = value
        self._total += self._size(value)
        self._items.move_to_end(key)
        while self._total > self.capacity and self._items:
            self._total -= self._size(self._items.popitem(last=False)[1])
