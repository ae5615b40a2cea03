"""The base of the connector's timing hooks (the profiler's and the scheduler's): timing never
breaks serving, so the first hook call libtutti refuses is logged and the hooks stop."""

from __future__ import annotations

import logging

from ..errors import TuttiError

log = logging.getLogger("vllm.tutti")


class StoppingHooks:
    """Calls through :meth:`_call` until one fails; then none (``failed``)."""

    #: What stops, for the log line.
    what = "timing hooks"
    failed = False

    def _call(self, fn, *args) -> None:
        if self.failed:
            return
        try:
            fn(*args)
        except TuttiError as e:
            log.warning("tutti: %s stopped: %s", self.what, e)
            self.failed = True
