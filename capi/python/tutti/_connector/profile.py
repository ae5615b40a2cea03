"""Feeding vLLM's layer timings to tutti's profiler (the slack table's source).

Each forward pass that prefills tokens is reported as one profiled "request"
(input tokens = the step's prefill tokens, prefix tokens = those it got from
caches) whose layer ``l`` runs from ``wait_for_layer_load(l)`` to
``save_kv_layer(l)`` — the two hooks vLLM calls around every attention
layer. Steps without prefill are decode steps, timed from
``bind_connector_metadata`` (before the forward pass; vLLM >= 0.32 calls
``start_load_kv`` after it when a step has no loads) to ``wait_for_save``.

On a GPU those hooks run when the layer's kernels are *launched*, not when
they execute, so times are taken with CUDA events on the current stream and
resolved after the step; on the host ``tutti_clock_ns`` is used directly.
The CUDA path needs torch and a GPU and is not exercised by the tests here.

Profiling never breaks serving: a profiler error is logged and the step goes on.
"""

from __future__ import annotations

from typing import Any

from ..runtime import Runtime, clock_ns
from .hooks import StoppingHooks


class _HostClock:
    def mark(self) -> int:
        return clock_ns()

    def resolve(self, mark: int) -> int:
        return mark


class _CudaClock:
    """CUDA events on the current stream, turned into tutti clock times once the step is done."""

    def __init__(self, torch: Any):
        self.torch = torch
        self.base = None
        self.base_ns = 0

    def mark(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        if self.base is None:
            self.base, self.base_ns = ev, clock_ns()
        return ev

    def resolve(self, ev) -> int:
        ev.synchronize()
        return self.base_ns + int(self.base.elapsed_time(ev) * 1e6)


class StepProfiler(StoppingHooks):
    what = "profiling"

    def __init__(self, runtime: Runtime):
        self.rt = runtime
        self.step = 0
        self.clock: Any = _HostClock()
        self.prefill = False
        self.context = 0
        self.start: Any = None
        self.layer_start: dict[int, Any] = {}
        self.layers: list[tuple[int, Any, Any]] = []
        self.failed = False

    def use_cuda(self, torch: Any) -> None:
        self.clock = _CudaClock(torch)

    def begin_step(self, prefill_tokens: int, prefix_tokens: int, context_tokens: int) -> None:
        self.step += 1
        self.prefill = prefill_tokens > 0
        self.context = context_tokens
        self.layer_start.clear()
        self.layers.clear()
        if isinstance(self.clock, _CudaClock):
            self.clock.base = None
        self.start = self.clock.mark()
        if self.prefill:
            self._call(self.rt.profile_request_begin, self.step, prefill_tokens, prefix_tokens)

    def layer_begins(self, layer: int) -> None:
        if self.prefill and layer not in self.layer_start:
            self.layer_start[layer] = self.clock.mark()

    def layer_ends(self, layer: int) -> None:
        start = self.layer_start.pop(layer, None)
        if self.prefill and start is not None:
            self.layers.append((layer, start, self.clock.mark()))

    def end_step(self) -> None:
        if self.start is None:
            return
        end = self.clock.mark()
        if self.prefill:
            for layer, s, e in self.layers:
                self._call(self.rt.profile_layer, self.step, layer, self.clock.resolve(s), self.clock.resolve(e))
        elif self.context:
            self._call(
                self.rt.profile_decode_step, self.step, self.context, self.clock.resolve(self.start),
                self.clock.resolve(end),
            )
        self.start = None
