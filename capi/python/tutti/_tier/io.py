"""The tutti tier's I/O threads: loads and stores on threads of their own.

vLLM calls a secondary tier from its scheduler thread and wants every call to return at once,
so each tutti job (one ``tutti_load_submit``, or one store session: begin, submit, wait,
commit) runs to its end on a thread here and its result waits in a queue for
``get_finished_jobs``. Read threads take only loads and write threads only stores, so a load
never queues behind a backlog of stores for a thread; on the drives, tutti's scheduler keeps
reads ahead of writes (``sched_mode`` ``"arbitrate"``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("tutti.vllm_tier")

Task = Callable[[], Any]


class IoPool:
    """Read and write threads; each task returns its result, which :meth:`finished` hands back."""

    def __init__(self, n_read: int, n_write: int, on_error: Callable[[Any, BaseException], Any]):
        self._loads: queue.SimpleQueue = queue.SimpleQueue()
        self._stores: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._on_error = on_error
        self._cv = threading.Condition()
        self._in_flight = 0
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"tutti_tier_{kind}{i}", daemon=True)
            for kind, q, n in (("read", self._loads, n_read), ("write", self._stores, n_write))
            for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def _put(self, q: queue.SimpleQueue, tag: Any, task: Task) -> None:
        with self._cv:
            if self._stopped:
                raise RuntimeError("tutti tier: submit after shutdown")
            self._in_flight += 1
        q.put((tag, task))

    def load(self, tag: Any, task: Task) -> None:
        self._put(self._loads, tag, task)

    def store(self, tag: Any, task: Task) -> None:
        self._put(self._stores, tag, task)

    def _run(self, q: queue.SimpleQueue) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            tag, task = item
            try:
                result = task()
            except BaseException as e:  # a task never kills its thread: its job fails instead
                log.exception("tutti tier: job %s failed", tag)
                result = self._on_error(tag, e)
            self._done.put(result)
            with self._cv:
                self._in_flight -= 1
                self._cv.notify_all()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def pending(self) -> bool:
        """Jobs running or queued, or results not yet taken."""
        return self._in_flight > 0 or not self._done.empty()

    def finished(self) -> list:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def wait_idle(self, timeout_s: float) -> bool:
        """Waits until no job runs or is queued (each job ends by its own deadline); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._in_flight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def shutdown(self, timeout_s: float) -> bool:
        """Lets the queued and running jobs finish (up to ``timeout_s``), then stops the threads."""
        with self._cv:
            self._stopped = True
        idle = self.wait_idle(timeout_s)
        for t in self._threads:
            (self._loads if t.name.startswith("tutti_tier_read") else self._stores).put(None)
        for t in self._threads:
            t.join(timeout=max(0.1, timeout_s))
        return idle
