"""Prepared instances of one worker, evicted least-recently-used by device memory.

A stream of configurations of one instance never reloads it; when a new
instance does not fit in the budget, the instances used longest ago are closed
(freeing their device memory) until it does. The one in use is never evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)


class PreparedCache(Generic[K]):
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._items: "OrderedDict[K, object]" = OrderedDict()

    def get(self, key: K, open_instance: Callable[[], object]):
        """The prepared instance for ``key``, opening (and evicting for) it when absent."""
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        instance = open_instance()
        self._items[key] = instance
        self._evict(keep=key)
        return instance

    def _evict(self, keep: K) -> None:
        while self.total_bytes > self.capacity_bytes and len(self._items) > 1:
            oldest = next(iter(self._items))
            if oldest == keep:
                break
            self._items.pop(oldest).close()

    @property
    def total_bytes(self) -> int:
        return sum(int(getattr(i, "device_bytes", 0)) for i in self._items.values())

    def keys(self) -> list[K]:
        return list(self._items)

    def unhealthy(self) -> bool:
        return any(not getattr(i, "healthy", True) for i in self._items.values())

    def close(self) -> None:
        while self._items:
            _, instance = self._items.popitem()
            try:
                instance.close()
            except Exception:  # closing during shutdown: the process exits next
                pass
