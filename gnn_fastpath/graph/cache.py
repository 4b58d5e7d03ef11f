"""A bounded, per-device LRU of values built from source objects, never stale.

:func:`cached` keys an entry by the source object's identity and holds the source only
weakly, so the entry dies with it. A *version* of the source (any hashable that changes
when the source does: tensor version counters, a graph's structure object) and an *extra*
key (e.g. the node counts asked for) are stored with the entry and compared on every hit;
any difference rebuilds. :meth:`Graph.of` stores its Graphs here.

Mini-batch training builds a new graph every step, so each device keeps at most
:func:`cache_size` entries (least recently used first out).
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Callable, Hashable, TypeVar

import torch

T = TypeVar("T")

_DEFAULT_SIZE = 32
_lock = threading.Lock()
_size = _DEFAULT_SIZE
# device key -> OrderedDict[id(source) -> (weakref to source, version, extra, value)]
_caches: "dict[str, OrderedDict]" = {}


def cache_size() -> int:
    """How many entries each device's cache keeps."""
    return _size


def set_cache_size(n: int) -> None:
    """Bound each device's cache to ``n`` entries (``n >= 1``); evicts the oldest."""
    global _size
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    evicted = []  # dropped after the lock is released (see _forget)
    with _lock:
        _size = int(n)
        for cache in _caches.values():
            while len(cache) > _size:
                evicted.append(cache.popitem(last=False))
    del evicted


def clear_cache() -> None:
    """Drop every cached entry."""
    with _lock:
        dropped = list(_caches.values())
        _caches.clear()
    # Outside the lock: a value dying may let its source die too, whose weakref callback
    # (_forget) takes the lock.
    del dropped


def cached_count(device=None) -> int:
    """Entries cached for ``device`` (all devices when None)."""
    if device is None:
        return sum(len(c) for c in _caches.values())
    return len(_caches.get(str(torch.device(device)), ()))


def _forget(device_key: str, key: int, ref) -> None:
    with _lock:
        cache = _caches.get(device_key)
        if cache is not None:
            entry = cache.get(key)
            if entry is not None and entry[0] is ref:
                del cache[key]


def cached(source, version: Hashable, build: Callable[[], T], device_key: str, extra: Hashable = None) -> T:
    """The value cached for ``source``, or ``build()``'s, stored in ``device_key``'s LRU.

    Args:
        source: the object the value derives from; it must support weak references (the
            entry is dropped when it dies). Keyed by ``id(source)``.
        version: compared with the stored one on every hit (``==``); a mismatch rebuilds.
            Hold what makes it unique while the entry lives: an ``id`` alone can be
            recycled by a new object.
        build: makes the value; called outside the lock (building may take a while, and may
            itself use the cache).
        device_key: which device's LRU holds the entry (``str(device)``, as
            :func:`cached_count` reads it).
        extra: the rest of the request (e.g. node counts), part of the match.
    """
    key = id(source)
    with _lock:
        cache = _caches.get(device_key)
        entry = None if cache is None else cache.get(key)
        if entry is not None:
            ref, old_version, old_extra, value = entry
            if ref() is source and old_version == version and old_extra == extra:
                cache.move_to_end(key)
                return value
            stale = cache.pop(key)
    value = build()
    ref = weakref.ref(source, lambda r, d=device_key, k=key: _forget(d, k, r))
    evicted = []  # dropped after the lock is released (see clear_cache)
    with _lock:
        cache = _caches.setdefault(device_key, OrderedDict())
        old = cache.get(key)
        if old is not None:
            evicted.append(old)
        cache[key] = (ref, version, extra, value)
        cache.move_to_end(key)
        while len(cache) > _size:
            evicted.append(cache.popitem(last=False))
    del evicted
    return value
