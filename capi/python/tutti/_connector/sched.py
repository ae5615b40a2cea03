"""Passing vLLM's compute timeline to tutti's scheduler (ABI 1.6).

Every load and store the connector submits goes through libtutti's scheduler: per-drive
arbitration always (no read and write in flight on one drive, reads first), and with
``sched_mode`` ``"slack"``/``"slack_online"`` writes only into the compute slack the engine
announces. The announcements come from the hooks vLLM already calls:

- a prefill layer's compute runs from ``wait_for_layer_load(l)`` (its KV is in) to
  ``save_kv_layer(l)`` (its new KV is out): ``tutti_sched_layer_start`` / ``_end``;
- a step without prefill tokens is a decode step, from ``bind_connector_metadata`` (vLLM hands
  the worker the step's plan before the forward pass; vLLM >= 0.32 calls ``start_load_kv`` after
  it when a step has no loads) to ``wait_for_save``: ``tutti_sched_decode_start`` / ``_end``.
  Deferred writes drain into it.

With ``deferred_saves`` a step's stores are finished at the start of the next step, so the
writes the slack of one step cannot take are left to the following (decode) steps; without it
``wait_for_save`` blocks on them, which the scheduler treats as urgent (written at once, still
never beside reads on a drive).

On a GPU these hooks run when the layer's kernels are launched, not when they execute, so the
windows are launch-time windows; the scheduler's online correction (``slack_online``) absorbs a
steady offset. The scheduler never breaks serving: a hook error is logged and the hooks stop.
"""

from __future__ import annotations

from ..runtime import Runtime
from .hooks import StoppingHooks


class SchedHooks(StoppingHooks):
    what = "scheduler timing hooks"

    def __init__(self, runtime: Runtime):
        self.rt = runtime
        self.prefill = (0, 0)  # (input tokens, prefix tokens) of the current step, if it prefills
        self.decode = False
        self.open_layer: int | None = None
        self.failed = False

    @classmethod
    def configure(cls, runtime: Runtime, config) -> "SchedHooks":
        """Applies the connector's ``sched_*`` keys to the runtime (before any job)."""
        if (config.sched_mode, config.sched_slack_table, config.sched_backlog_bytes,
                config.sched_backlog_full, config.sched_idle_ms) != ("arbitrate", None, 0, "backpressure", 0):
            runtime.configure_scheduler(
                mode=config.sched_mode,
                slack_table=config.sched_slack_table,
                backlog_bytes=config.sched_backlog_bytes,
                backlog_full=config.sched_backlog_full,
                idle_ms=config.sched_idle_ms,
            )
        return cls(runtime)

    def begin_step(self, prefill_tokens: int, prefix_tokens: int, context_tokens: int) -> None:
        self.prefill = (prefill_tokens, prefix_tokens) if prefill_tokens > 0 else (0, 0)
        self.open_layer = None
        self.decode = prefill_tokens == 0 and context_tokens > 0
        if self.decode:
            self._call(self.rt.sched_decode_start, min(context_tokens, 0xFFFFFFFF))

    def layer_begins(self, layer: int) -> None:
        if self.prefill[0] > 0 and self.open_layer is None:
            self.open_layer = layer
            n, p = self.prefill
            self._call(self.rt.sched_layer_start, min(n, 0xFFFFFFFF), min(p, 0xFFFFFFFF), layer)

    def layer_ends(self, layer: int) -> None:
        if self.open_layer == layer:
            self.open_layer = None
            self._call(self.rt.sched_layer_end, layer)

    def end_step(self) -> None:
        if self.open_layer is not None:
            self._call(self.rt.sched_layer_end, self.open_layer)
            self.open_layer = None
        if self.decode:
            self.decode = False
            self._call(self.rt.sched_decode_end)
