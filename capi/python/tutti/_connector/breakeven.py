"""The break-even rule: a hit is reported to vLLM only when loading it is expected to be faster
than recomputing it.

A KV tier that serves every hit makes serving slower whenever reading a prefix takes longer
than computing it again (slow or busy drives, a long write backlog, a small model). So at
``get_num_new_matched_tokens`` the scheduler-side connector asks :class:`BreakEven` how much of
the hit to report: the longest prefix whose expected load time is below its expected recompute
time, or nothing.

* Load time of ``k`` blocks = ``latency + (backlog + k * block_bytes) / read_rate``: the
  per-request latency and the read rate are fitted online to the loads the workers timed
  (bytes of one rank's shard → seconds), the backlog is what the drives must move first —
  loads already granted in this scheduling pass (they share the step's reads) and the saves a
  worker still has in flight (deferred saves are completed before the next step's loads are
  submitted). Writes are counted at the read rate: the drives are taken as symmetric.
* Recompute time of ``k`` blocks = ``k * tokens_per_block * s_per_token``, the marginal cost
  per prefilled token fitted online to the forward passes the workers timed (prefill steps:
  scheduled tokens → seconds of compute, the time spent inside tutti's hooks taken out). A
  slack table (``sched_slack_table``, from ``tutti profile`` or the connector's own
  ``slack_table``) is the starting point until two prefill steps were seen: its windows are
  the profiled compute time per layer.
* Until there is a load estimate and a recompute estimate every hit is reported (and counted
  as ``match_learning``): the first requests load, and the rates are learnt from them.
* A rule that stops loading stops measuring loads. When the latest load estimate is older than
  ``probe_after_s`` and a declined load was expected to take less than twice its recompute, the
  load is made anyway (``match_probes``) to refresh the estimate; a load expected to take longer
  than that is never probed.

The fits are exponentially weighted least squares of ``y = a + b * x`` (each observation
weighs ``alpha`` against the past): with too little spread in ``x`` (every request the same
size) the line goes through the origin, which folds the latency into the rate. A timed load
whose completion was not seen exactly (the layers were in before the engine waited for them)
is an upper bound: it lowers an estimate above it and is otherwise ignored.

The timings travel from the workers to the scheduler through vLLM's worker-metadata channel
(``build_connector_worker_meta`` → ``update_connector_output``, vLLM >= 0.32): one object per
step, aggregated across ranks by vLLM. Where a vLLM has no such channel nothing is learnt and
every hit is reported, as with ``"load_policy": "always"``.
"""

from __future__ import annotations

import json
import logging
import math
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

log = logging.getLogger("vllm.tutti")

POLICIES = ("breakeven", "always")

# A layer wait that took longer than this blocked on the drives: its return is when the layer landed.
BLOCKED_S = 2e-4


class Line:
    """``y ≈ a + b * x`` by exponentially weighted least squares; ``a >= 0`` and ``b > 0`` always."""

    def __init__(self, alpha: float = 0.25):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha {alpha} is not in (0, 1]")
        self.alpha = alpha
        self.n = 0  # observations taken (bounds that lowered the line included)
        self.last = 0.0  # clock time of the latest observation
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._fit: tuple[float, float] | None = None

    def add(self, x: float, y: float, now: float = 0.0) -> None:
        if not (x > 0 and y >= 0 and math.isfinite(x) and math.isfinite(y)):
            return
        d = 1.0 - self.alpha
        self._w = self._w * d + 1.0
        self._sx = self._sx * d + x
        self._sy = self._sy * d + y
        self._sxx = self._sxx * d + x * x
        self._sxy = self._sxy * d + x * y
        self.n += 1
        self.last = now
        self._fit = None

    def cap(self, x: float, y_max: float, now: float = 0.0) -> bool:
        """An upper bound: ``y(x) <= y_max``. Taken as an observation when the line is above it."""
        if self.n and self.predict(x) > y_max:
            self.add(x, y_max, now)
            return True
        return False

    def fit(self) -> tuple[float, float]:
        """(intercept, slope)."""
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float]:
        if self._w <= 0.0 or self._sx <= 0.0:
            return 0.0, 0.0
        w = self._w
        mx, my = self._sx / w, self._sy / w
        vx = self._sxx / w - mx * mx
        if self.n >= 2 and vx > (0.05 * mx) ** 2:
            b = (self._sxy / w - mx * my) / vx
            a = my - b * mx
            if b > 0.0 and a >= 0.0:
                return a, b
        # Too little spread, or a line that would need a negative latency: through the origin.
        return 0.0, max(self._sxy / self._sxx, 1e-30)

    def predict(self, x: float) -> float:
        a, b = self.fit()
        return a + b * x


@dataclass
class Observations:
    """What one step of the worker(s) timed; vLLM aggregates the ranks' (:meth:`merge`)."""

    step: int = 0  # the scheduler's plan number of the latest step these cover
    loads: list[tuple[int, float, bool]] = field(default_factory=list)  # (bytes, seconds, exact)
    prefills: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds of compute)
    pending_write_bytes: int = 0  # saves still in flight when the step ended

    def merge(self, other: "Observations") -> "Observations":
        self.step = min(self.step, other.step) if self.step and other.step else max(self.step, other.step)
        self.loads += other.loads
        self.prefills += other.prefills
        self.pending_write_bytes = max(self.pending_write_bytes, other.pending_write_bytes)
        return self


# The order of the table body's fields as libtutti serialises them for its checksum.
_BODY_ORDER = {"": ("identity", "source", "grid", "prefill", "decode"), "identity": ("model", "gpu", "layers"),
               "grid": ("input", "prefix", "decode_context"), "prefill": ("window_ns", "sm_budget", "max_iocbs"),
               "decode": ("window_ns", "sm_budget", "max_iocbs")}


def _canonical(body: dict) -> str:
    """The body's compact JSON in libtutti's field order (the bytes its CRC-32 covers)."""

    def ordered(d: dict, key: str) -> dict:
        out = {k: d[k] for k in _BODY_ORDER[key]}
        return {k: ordered(v, k) if k in _BODY_ORDER and isinstance(v, dict) else v for k, v in out.items()}

    return json.dumps(ordered(body, ""), separators=(",", ":"), ensure_ascii=False)


class SlackPrior:
    """Compute time of a prefill from a slack table: the sum over layers of its windows.

    The table is ``tutti-slack-table`` JSON (``scheduler/src/table.rs``): windows indexed
    ``[input bucket][prefix bucket][layer]``, bilinearly interpolated here as libtutti does.
    """

    def __init__(self, path: str, layers: int):
        text = Path(path).read_text()
        doc = json.loads(text)
        if doc.get("format") != "tutti-slack-table" or doc.get("version") != 1:
            raise ValueError(f"{path}: not a version-1 tutti slack table")
        body = doc["table"]
        if zlib.crc32(_canonical(body).encode()) != doc.get("checksum"):
            raise ValueError(f"{path}: checksum mismatch (a corrupt or edited table)")
        if int(body["identity"]["layers"]) != layers:
            raise ValueError(f"{path}: made for {body['identity']['layers']} layers, the model has {layers}")
        self.inputs = [int(p) for p in body["grid"]["input"]]
        self.prefixes = [int(p) for p in body["grid"]["prefix"]]
        self.layers = layers
        windows = [int(w) for w in body["prefill"]["window_ns"]]
        if len(windows) != len(self.inputs) * len(self.prefixes) * layers:
            raise ValueError(f"{path}: {len(windows)} prefill windows do not fit the grid")
        # Per (input, prefix) cell: the whole forward pass, in seconds.
        self.cells = [
            sum(windows[(i * len(self.prefixes) + p) * layers: (i * len(self.prefixes) + p + 1) * layers]) / 1e9
            for i in range(len(self.inputs)) for p in range(len(self.prefixes))
        ]
        self.source = path

    @staticmethod
    def _locate(points: list[int], x: float) -> tuple[int, int, float]:
        if x <= points[0]:
            return 0, 0, 0.0
        if x >= points[-1]:
            return len(points) - 1, len(points) - 1, 0.0
        hi = next(i for i, p in enumerate(points) if p > x)
        lo = hi - 1
        return lo, hi, (x - points[lo]) / (points[hi] - points[lo])

    def compute_s(self, input_tokens: int, prefix_tokens: int) -> float:
        il, ih, wi = self._locate(self.inputs, input_tokens)
        pl, ph, wp = self._locate(self.prefixes, prefix_tokens)
        n = len(self.prefixes)
        c = self.cells
        return ((1 - wi) * (1 - wp) * c[il * n + pl] + (1 - wi) * wp * c[il * n + ph]
                + wi * (1 - wp) * c[ih * n + pl] + wi * wp * c[ih * n + ph])

    def recompute_s(self, tokens: int, before: int, after: int) -> float:
        """What computing ``tokens`` more costs a request with ``before`` tokens cached and
        ``after`` tokens to compute anyway."""
        return max(0.0, self.compute_s(tokens + after, before) - self.compute_s(after, before + tokens))


STAT_COUNTERS = (
    "match_hit_tokens", "match_reported_tokens", "match_declined_tokens", "match_declined_requests",
    "match_learning", "match_probes",
)
# Gauges: the rates the latest decision used (0 when there was no estimate).
STAT_GAUGES = ("est_read_bytes_per_s", "est_load_latency_s", "est_prefill_s_per_token", "est_backlog_bytes")


class BreakEven:
    """The scheduler side's decision (see the module docs). ``block_bytes``: one engine block of
    one rank's shard (every layer's K and V); ``tokens_per_block``: vLLM's block size."""

    def __init__(self, policy: str, block_bytes: int, tokens_per_block: int, prior: SlackPrior | None = None,
                 alpha: float = 0.25, probe_after_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        if policy not in POLICIES:
            raise ValueError(f"load policy {policy!r} is not one of {POLICIES}")
        self.policy = policy
        self.block_bytes = block_bytes
        self.B = tokens_per_block
        self.prior = prior
        self.probe_after_s = probe_after_s
        self.clock = clock
        self.load = Line(alpha)  # bytes of one rank's shard -> seconds
        self.prefill = Line(alpha)  # scheduled tokens of a prefill step -> seconds of compute
        self.fed = False  # a worker's timings arrived at least once
        self.pending_write_bytes = 0
        self.counters = {k: 0 for k in STAT_COUNTERS}
        self.gauges = {k: 0.0 for k in STAT_GAUGES}

    # --- learning --------------------------------------------------------------------------

    def observe(self, obs: Observations) -> None:
        now = self.clock()
        self.fed = True
        for nbytes, secs, exact in obs.loads:
            if exact or not self.load.n:
                self.load.add(nbytes, secs, now)
            else:
                self.load.cap(nbytes, secs, now)
        for tokens, secs in obs.prefills:
            self.prefill.add(tokens, secs, now)
        self.pending_write_bytes = obs.pending_write_bytes

    # --- deciding --------------------------------------------------------------------------

    def _recompute_s(self, k: int, before_blocks: int, after_tokens: int) -> float | None:
        tokens = k * self.B
        if self.prefill.n >= 2 or (self.prefill.n and self.prior is None):
            return self.prefill.fit()[1] * tokens
        if self.prior is not None:
            return self.prior.recompute_s(tokens, before_blocks * self.B, after_tokens)
        return None

    def decide(self, first: int, hits: int, prompt_tokens: int, backlog_bytes: int = 0) -> int:
        """How many leading blocks to report (``first``: blocks vLLM's own cache holds; ``hits``:
        leading blocks tutti holds). Returns ``hits`` or less, never below ``first``."""
        k_max = hits - first
        if k_max <= 0:
            return hits
        if self.policy == "always":
            self._count(k_max, k_max)
            return hits
        backlog = backlog_bytes + self.pending_write_bytes
        rec_full = self._recompute_s(k_max, first, prompt_tokens - hits * self.B)
        if not self.load.n or rec_full is None:
            self.counters["match_learning"] += 1
            self._count(k_max, k_max)
            return hits
        a, b = self.load.fit()
        self.gauges.update(est_read_bytes_per_s=1.0 / b if b > 0 else 0.0, est_load_latency_s=a,
                           est_prefill_s_per_token=(rec_full / (k_max * self.B)), est_backlog_bytes=float(backlog))

        def load_s(k: int) -> float:
            return a + b * (backlog + k * self.block_bytes)

        if load_s(k_max) < rec_full:
            self._count(k_max, k_max)
            return hits
        for k in range(k_max - 1, 0, -1):
            if load_s(k) < self._recompute_s(k, first, prompt_tokens - (first + k) * self.B):
                self._count(k_max, k)
                return first + k
        if self.clock() - self.load.last > self.probe_after_s and load_s(k_max) < 2.0 * rec_full:
            self.counters["match_probes"] += 1
            self.load.last = self.clock()  # one probe per interval, even if its timing never comes back
            self._count(k_max, k_max)
            return hits
        self._count(k_max, 0)
        return first

    def _count(self, hit_blocks: int, reported_blocks: int) -> None:
        c = self.counters
        c["match_hit_tokens"] += hit_blocks * self.B
        c["match_reported_tokens"] += reported_blocks * self.B
        if reported_blocks < hit_blocks:
            c["match_declined_tokens"] += (hit_blocks - reported_blocks) * self.B
            c["match_declined_requests"] += 1

    def take_stats(self) -> dict[str, float]:
        """Counters since the last call (then zeroed) and the latest gauges."""
        out: dict[str, float] = dict(self.counters)
        out.update(self.gauges)
        self.counters = {k: 0 for k in STAT_COUNTERS}
        return out


def slack_prior(path: str | None, layers: int) -> SlackPrior | None:
    """The slack table at ``path`` as a recompute prior; None (with a warning) if it cannot serve."""
    if not path:
        return None
    try:
        return SlackPrior(path, layers)
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("tutti: the slack table is not used as the break-even rule's starting point: %s", e)
        return None


class StepClock:
    """The worker side's timing of one step: how long its loads took (exact when the engine
    was seen waiting for the last of them, else an upper bound) and how long the forward pass
    computed (the step's time less the time spent inside tutti's hooks)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.obs = Observations()
        self._reset()

    def _reset(self) -> None:
        self.t0: float | None = None
        self.hooks = 0.0
        self.tokens = 0
        self.prefill = False
        self.load_bytes = 0
        self.t_submit = 0.0
        self.load_done: tuple[float, bool] | None = None  # (seconds after submit, exact)

    def begin(self, step: int, scheduled_tokens: int, prefill_tokens: int) -> None:
        self._reset()
        self.t0 = self.clock()
        self.tokens = scheduled_tokens
        self.prefill = prefill_tokens > 0
        self.obs.step = max(self.obs.step, step)

    def in_hook(self, seconds: float) -> None:
        self.hooks += seconds

    def loads_submitted(self, nbytes: int, t_submit: float) -> None:
        self.load_bytes += nbytes
        self.t_submit = t_submit

    @property
    def waiting_for_loads(self) -> bool:
        return self.load_bytes > 0 and self.load_done is None

    def loads_seen_done(self, t_before: float, t_after: float) -> None:
        """Every load of the step was found complete right after a wait from ``t_before`` to
        ``t_after``: if the wait blocked, they completed as it returned; else, before it began."""
        if self.load_done is not None:
            return
        if t_after - t_before > BLOCKED_S:
            self.load_done = (t_after - self.t_submit, True)
        else:
            self.load_done = (t_before - self.t_submit, False)

    def end_forward(self) -> None:
        """The forward pass is over (``wait_for_save``)."""
        if self.t0 is None:
            return
        if self.prefill and self.tokens > 0:
            self.obs.prefills.append((self.tokens, max(0.0, self.clock() - self.t0 - self.hooks)))
        self.t0 = None

    def end_loads(self, failed: bool = False) -> None:
        """The step's loads are over; ``failed``: some block failed (its timing is not the drives')."""
        if self.load_bytes and self.load_done is not None and not failed:
            secs, exact = self.load_done
            self.obs.loads.append((self.load_bytes, secs, exact))
        self.load_bytes = 0
        self.load_done = None

    def take(self, pending_write_bytes: int) -> Observations | None:
        obs, self.obs = self.obs, Observations(step=self.obs.step)
        obs.pending_write_bytes = pending_write_bytes
        return obs if obs.step else None
