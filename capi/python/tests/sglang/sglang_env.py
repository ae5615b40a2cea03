"""SGLang's own objects, built on the CPU the way SGLang builds them, for the backend's tests.

- ``device_pool``: ``MHATokenToKVPool(..., device="cpu")`` (the GPU-side pool SGLang's
  controller reads its geometry from);
- ``host_pool``: ``MHATokenToKVPoolHost`` from the device pool's ``get_device_pool_infos()``
  buffer description, in any of SGLang's layouts, ``pin_memory=False`` (no CUDA here);
- ``controller``: SGLang's ``HiCacheController`` with a storage backend attached by SGLang's
  factory, its prefetch and backup threads running;
- ``backup`` / ``prefetch``: one operation through those threads, with the scheduler
  thread's part (host memory for a prefetch hit) done here as the radix cache does it.

The parallel topology is forced to one rank (SGLang's unit fixtures do the same), or to the
rank a test names.
"""

from __future__ import annotations

import os
import threading
import time

import torch

from sglang.srt.runtime_context import get_parallel


def set_rank(tp_rank: int = 0, tp_size: int = 1) -> None:
    get_parallel().override_permanently(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_dcp_size=1, attn_dcp_rank=0
    )


set_rank()

from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
# SGLang's MLA host pool layouts on the CPU (page_unified and Ascend's page_first_kv_split are refused).
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
# DeepSeek-V2/V3's latent: kv_lora_rank 512 + qk_rope_head_dim 64.
KV_LORA_RANK, QK_ROPE_HEAD_DIM = 512, 64
BACKEND = {"backend_name": "tutti", "module_path": "tutti.sglang", "class_name": "TuttiHiCacheStorage"}


def device_pool(tokens=64, page=4, layers=3, heads=2, head_dim=32, dtype=torch.bfloat16) -> MHATokenToKVPool:
    return MHATokenToKVPool(
        size=tokens, page_size=page, dtype=dtype, head_num=heads, head_dim=head_dim, layer_num=layers,
        device="cpu", enable_memory_saver=False,
    )


def host_pool(dev: MHATokenToKVPool, layout: str, ratio: float = 2.0) -> MHATokenToKVPoolHost:
    info = dev.get_device_pool_infos()[0].buffer_info
    return MHATokenToKVPoolHost(
        info, ratio, 0, dev.page_size, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=dev.size, start_layer=0, end_layer=dev.layer_num,
    )


def mla_device_pool(tokens=64, page=8, layers=3, dtype=torch.bfloat16, kv_lora_rank=KV_LORA_RANK,
                    qk_rope_head_dim=QK_ROPE_HEAD_DIM) -> MLATokenToKVPool:
    """SGLang's MLA device pool (DeepSeek's latent by default), on the CPU."""
    return MLATokenToKVPool(
        size=tokens, page_size=page, dtype=dtype, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
        layer_num=layers, device="cpu", enable_memory_saver=False,
    )


def mla_host_pool(dev: MLATokenToKVPool, layout: str, ratio: float = 2.0) -> MLATokenToKVPoolHost:
    """SGLang's MLA host pool over ``dev``, built as SGLang's pool assembler builds it."""
    info = dev.get_device_pool_infos()[0].buffer_info
    return MLATokenToKVPoolHost(
        info, ratio, 0, dev.page_size, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=dev.size, start_layer=0, end_layer=dev.layer_num, target_layer_num=dev.layer_num,
    )


def storage_config(extra: dict, *, model="tiny-model", tp_rank=0, tp_size=1, mla=False,
                   metrics=False, **more) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=metrics, is_page_first_layout=False, model_name=model,
        extra_config=dict(extra), **more,
    )


def make_backend(host, extra: dict, **kw):
    """SGLang's factory builds the backend by module path and class name; SGLang's controller
    registers the host pool next; so do we."""
    cfg = storage_config(dict(BACKEND, **extra), **kw)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, host)
    backend.register_mem_pool_host(host)
    return backend


def fill_random(host, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    raw = host.kv_buffer.view(-1).view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))


def page_bytes(host, first_token: int) -> bytes:
    """Every byte of one page (K and V, or the latent, of every layer), read through SGLang's own accessor."""
    page = host.get_data_page(first_token, flat=True)
    return page.contiguous().view(torch.uint8).numpy().tobytes()


def tokens_for(n_pages: int, page: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n_pages * page))


def hashes_for(tokens: list[int], page: int) -> list[str]:
    return get_hash_str(tokens, None, page_size=page)


def controller(dev, host, extra: dict, *, backend: str = "dynamic", model: str = "tiny-model"):
    """SGLang's HiCacheController with a storage backend attached (its threads started)."""
    alloc = PagedTokenToKVPoolAllocator(dev.size, dev.page_size, dev.dtype, "cpu", dev, need_sort=False)
    extra = dict(BACKEND, **extra) if backend == "dynamic" else dict(extra)
    return HiCacheController(
        alloc, host, dev.page_size, None, threading.Event(), storage_backend=backend,
        storage_backend_extra_config=extra, model_name=model, prefetch_threshold=dev.page_size,
    )


def stop(ctl: HiCacheController) -> None:
    ctl.detach_storage_backend()


def backup(ctl: HiCacheController, host_indices: torch.Tensor, tokens: list[int], timeout: float = 60.0) -> int:
    """Backup thread: host pages -> storage. Returns the tokens written."""
    hashes = hashes_for(tokens, ctl.page_size)
    op_id = ctl.write_storage(host_indices, tokens, hashes)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        op = ctl.ack_backup_queue.get(timeout=max(deadline - time.monotonic(), 0.01))
        if op.id == op_id:
            return op.completed_tokens
    raise TimeoutError("backup did not finish")


def prefetch(ctl: HiCacheController, tokens: list[int], rid: str = "r", timeout: float = 60.0):
    """Prefetch thread: batch_exists; then the scheduler's part (host pages for the hit); then the
    I/O thread: the reads. Returns (hit tokens, completed tokens, host indices or None)."""
    op = ctl.prefetch(rid, tokens, None, None)
    deadline = time.monotonic() + timeout
    hit = ctl.prefetch_hit_queue.get(timeout=timeout)
    assert hit is op
    if op.storage_hit_count == 0:
        return 0, 0, None
    host_indices = ctl.mem_pool_host.alloc(op.storage_hit_count)
    assert host_indices is not None, "host pool full"
    op.host_indices = host_indices
    ctl.prefetch_buffer.put(op)
    completed = None
    while time.monotonic() < deadline:
        ack = ctl.ack_prefetch_queue.get(timeout=max(deadline - time.monotonic(), 0.01))
        if ack.operation is not op:
            continue
        if ack.completed_tokens is not None:
            completed = ack.completed_tokens
        if getattr(ack, "completed_req", False):
            return op.storage_hit_count, completed or 0, host_indices
    raise TimeoutError("prefetch did not finish")


def tutti_bin() -> str:
    return os.environ.get("TUTTI_BIN", "tutti")
