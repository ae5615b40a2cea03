"""tutti's connector counters on vLLM's Prometheus metrics (its ``/metrics``).

vLLM hands each stats interval's :class:`tutti.vllm.TuttiConnectorStats` (the workers' and the
scheduler side's, aggregated) to the connector class's ``build_prom_metrics`` object; this module
makes that object. Every counter key becomes a Prometheus counter ``vllm:tutti_<key>_total``
increased by the interval's value, every gauge key a gauge ``vllm:tutti_<key>`` set to the
latest estimate, each with vLLM's own labels (``model_name``, ``engine``). A key ending in ``_s``
counts seconds and is named ``..._seconds``.

What the numbers cover: this vLLM engine's connector (its scheduler side and its workers), not
the pool. For the pool as a whole (every engine that shares it through tuttid) see ``tutti serve
--metrics`` (docs/operating.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # vLLM's types, for type checkers only: no import of vLLM at run time
    from vllm.config import VllmConfig

# What each key counts (the rest are described in TuttiConnectorStats).
HELP = {
    "bytes_loaded": "KV bytes tutti loaded from its drives into vLLM's blocks",
    "bytes_stored": "KV bytes tutti stored from vLLM's blocks on its drives",
    "hit_tokens": "Prompt tokens the scheduler side reported as loadable from tutti",
    "load_s": "Time the workers waited for tutti loads",
    "save_s": "Time the workers spent completing tutti saves",
    "failed_blocks": "Blocks whose tutti load failed (handed to vLLM to recompute)",
    "loads": "Requests whose KV tutti loaded",
    "saves": "Requests whose KV tutti stored",
}


def metric_name(key: str) -> str:
    """The Prometheus name of a stats key (without the ``_total`` a counter gets)."""
    base = key[:-2] + "_seconds" if key.endswith("_s") else key
    return f"vllm:tutti_{base}"


def build(base: type, vllm_config: VllmConfig, metric_types: dict, labelnames: list[str],
          per_engine_labelvalues: dict[int, list[object]], counters: tuple[str, ...],
          gauges: frozenset[str]) -> Any:
    """A ``base`` (vLLM's ``KVConnectorPromMetrics``) whose ``observe`` records the stats keys
    ``counters`` (summed) and ``gauges`` (latest value) per engine."""

    class TuttiPromMetrics(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            self._children: dict[tuple[int, str], Any] = {}
            for key in counters:
                doc = HELP.get(key, f"tutti connector counter {key} (see tutti.vllm.TuttiConnectorStats)")
                metric = self._counter_cls(name=metric_name(key), documentation=doc, labelnames=labelnames)
                for idx, values in per_engine_labelvalues.items():
                    self._children[(idx, key)] = metric.labels(*values)
            for key in sorted(gauges):
                doc = f"tutti connector estimate {key}, as its latest decision used (see tutti.vllm.TuttiConnectorStats)"
                metric = self._gauge_cls(name=metric_name(key), documentation=doc, labelnames=labelnames,
                                         multiprocess_mode="mostrecent")
                for idx, values in per_engine_labelvalues.items():
                    self._children[(idx, key)] = metric.labels(*values)

        def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
            for key, value in (transfer_stats_data or {}).items():
                child = self._children.get((engine_idx, key))
                if child is None or not isinstance(value, (int, float)) or value <= 0:
                    continue
                if key in gauges:
                    child.set(value)
                else:
                    child.inc(value)

    return TuttiPromMetrics()
