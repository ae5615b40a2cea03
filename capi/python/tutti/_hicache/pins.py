"""Pins taken by ``batch_exists``, held until the get that follows it.

SGLang asks ``batch_exists`` for a batch of page keys (its prefetch thread), then, once the
scheduler has found host memory for the hit, reads a prefix of the same batch with
``batch_get_v1`` (its I/O thread). Both calls start at the same key: SGLang cuts both at
the same ``STORAGE_BATCH_SIZE`` boundaries. tutti's lookup pins the hit prefix, so nothing
evicts it in between; the get releases the pin of the run that starts at its first key.

SGLang may also never read (the hit was below its prefetch threshold, the request went
away, the prefetch was revoked): a pin older than ``ttl_s`` is released at the next call,
and at most ``max_pins`` are held (the oldest goes first).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable

log = logging.getLogger("tutti.sglang")


class PinBook:
    def __init__(self, unpin: Callable[[int], None], ttl_s: float, max_pins: int = 4096):
        self._unpin = unpin
        self._ttl = ttl_s
        self._max = max_pins
        self._lock = threading.Lock()
        # pin id -> (first key, deadline), oldest first
        self._pins: OrderedDict[int, tuple[str, float]] = OrderedDict()
        self._by_key: dict[str, list[int]] = {}
        self.expired = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._pins)

    def add(self, first_key: str, pin: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._pins[pin] = (first_key, now + self._ttl)
            self._by_key.setdefault(first_key, []).append(pin)
            drop = self._take_expired(now)
            while len(self._pins) > self._max:
                drop.append(self._take(next(iter(self._pins))))
                self.expired += 1
        self._release(drop)

    def release_run(self, first_key: str) -> None:
        """The get of the run that starts at ``first_key`` is done: its oldest pin goes."""
        with self._lock:
            pins = self._by_key.get(first_key)
            drop = [self._take(pins[0])] if pins else []
            drop += self._take_expired(time.monotonic())
        self._release(drop)

    def release_all(self) -> None:
        with self._lock:
            drop = [self._take(p) for p in list(self._pins)]
        self._release(drop)

    def sweep(self) -> None:
        with self._lock:
            drop = self._take_expired(time.monotonic())
        self._release(drop)

    def _take(self, pin: int) -> int:
        key, _ = self._pins.pop(pin)
        pins = self._by_key[key]
        pins.remove(pin)
        if not pins:
            del self._by_key[key]
        return pin

    def _take_expired(self, now: float) -> list[int]:
        out = []
        while self._pins:
            pin, (_, deadline) = next(iter(self._pins.items()))
            if deadline > now:
                break
            out.append(self._take(pin))
            self.expired += 1
        return out

    def _release(self, pins: list[int]) -> None:
        for p in pins:
            try:
                self._unpin(p)
            except Exception as e:  # noqa: BLE001 - a pin the pool already dropped (runtime closed)
                log.debug("tutti: unpin %d: %s", p, e)
