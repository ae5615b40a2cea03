"""What the scheduler-side connector tells the worker-side one each step.

vLLM pickles this into the worker process with the scheduler output, so it
holds plain data only: chunk hashes and block ids, never addresses.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoadSpec:
    """Load chunk ``hashes[i]`` into engine block ``block_ids[i]`` for every layer; then, from the
    cluster tier (Mooncake), chunk ``remote_hashes[i]`` into block ``remote_block_ids[i]``.
    ``group``: the KV-cache group whose block table the ids are from (0 with one group).
    ``notify``: vLLM loads the request asynchronously (it waits outside the batch): the worker
    reports it once all its loads are done, as failed if a block did not load (a hybrid KV
    cache: vLLM takes failed block ids from one group only)."""

    req_id: str
    hashes: list[bytes]
    block_ids: list[int]
    remote_hashes: list[bytes] = field(default_factory=list)
    remote_block_ids: list[int] = field(default_factory=list)
    group: int = 0
    notify: bool = False


@dataclass
class SaveSpec:
    """Store engine block ``block_ids[i]`` as chunk ``hashes[i]`` once its layers are computed
    (the layers of KV-cache group ``group``)."""

    req_id: str
    hashes: list[bytes]
    block_ids: list[int]
    group: int = 0


@dataclass
class StepPlan:
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    # The step's shape, for the profiler: tokens prefilled, tokens they extend
    # (already computed or loaded), and the KV context of decoding requests.
    prefill_tokens: int = 0
    prefix_tokens: int = 0
    decode_context_tokens: int = 0
    # Every token the step computes, and the plan's number (the workers' timings name it).
    scheduled_tokens: int = 0
    step: int = 0

    def is_empty(self) -> bool:
        return not self.loads and not self.saves
