//! Registering the engine's KV memory, and the chunk index: chained hashes,
//! lookup (with pins) and unpin.

use crate::error::{guard, lock, CapiError, Result};
use crate::io_config::{
    TUTTI_EXECUTOR_CONTROL, TUTTI_EXECUTOR_DIRECT, TUTTI_EXECUTOR_GIO_CUDA, TUTTI_EXECUTOR_GIO_HOST,
};
use crate::link::Registered;
use crate::ptr::{self, SizePrefixed, TUTTI_MAX_BLOCKS_PER_CALL, TUTTI_MAX_TOKENS_PER_CALL};
use crate::runtime::{tutti_runtime_t, Runtime};
use crate::status::TUTTI_OK;
use std::ffi::c_char;
use tutti_objstore::layout::LayoutKind;
use tutti_objstore::{hash, BlockHash, CacheIdentity, KvLayout, KvMemoryKind, LayerBases, TableSizes};

fn executor_name(e: u32) -> &'static str {
    match e {
        TUTTI_EXECUTOR_GIO_HOST => "TUTTI_EXECUTOR_GIO_HOST",
        TUTTI_EXECUTOR_DIRECT => "TUTTI_EXECUTOR_DIRECT",
        TUTTI_EXECUTOR_GIO_CUDA => "TUTTI_EXECUTOR_GIO_CUDA",
        TUTTI_EXECUTOR_CONTROL => "TUTTI_EXECUTOR_CONTROL",
        _ => "another executor",
    }
}

/// vLLM flash-attn: per layer one tensor `[2, num_blocks, block_size, kv_heads, head_dim]`.
pub const TUTTI_LAYOUT_VLLM_PER_LAYER: u32 = 1;
/// One region `[num_blocks, layers, 2, block_size, kv_heads, head_dim]`.
pub const TUTTI_LAYOUT_CONTIGUOUS: u32 = 2;
/// Caller-given K and V bases per layer and one block stride.
pub const TUTTI_LAYOUT_STRIDED: u32 = 3;

/// Host memory of this process, mapped for the drives (direct DMA).
pub const TUTTI_MEMORY_HOST: u32 = 1;
/// CUDA device memory of the runtime's GPU (ABI 1.4: needs
/// `TUTTI_EXECUTOR_GIO_CUDA`). Its GPU pages are pinned and mapped through
/// GDRCopy where it can be loaded (`libgdrapi.so.2`, or the library
/// `TUTTI_GDRAPI` names; no ABI addition: the data path reports P2P since
/// 1.10), then mapped for the drives and probed as
/// `TUTTI_MEMORY_DEVICE_P2P` is: `TUTTI_DATA_PATH_P2P` (provider `gdrcopy`)
/// when the probe passes, else the staged data path with `p2p_missing`
/// saying why; `TUTTI_P2P` applies as there. Other executors refuse it with
/// `TUTTI_E_UNSUPPORTED` (gio on the host) or `TUTTI_E_INVALID_ARG`
/// (direct), naming why.
pub const TUTTI_MEMORY_CUDA: u32 = 2;
/// ABI 1.4: host memory of this process that the drives must not touch: it
/// is never mapped for them, and the executor copies every chunk through
/// staging slots (the staged data path, testable without a GPU). Needs a
/// gio executor.
pub const TUTTI_MEMORY_HOST_STAGED: u32 = 3;
/// ABI 1.10: memory of another device that this process has mapped at the
/// layout's addresses as a PFN map the CPU can read and write (a PCI BAR
/// mmapped through vfio-pci, a GPU BAR1 window GDRCopy mapped). It is mapped
/// for the drives (`VFIO_IOMMU_MAP_DMA` follows PFN maps) and probed: the data
/// path is `TUTTI_DATA_PATH_P2P` when the drives' DMA reaches it with every
/// byte right, `TUTTI_DATA_PATH_STAGED` otherwise (`p2p_missing` says what
/// the probe saw; needs a gio executor then). The environment variable
/// `TUTTI_P2P` = `auto` (default), `require` (fail instead of staging) or
/// `off` (staged) is read at registration.
pub const TUTTI_MEMORY_DEVICE_P2P: u32 = 4;

/// Most SGL descriptors one registration's table may hold:
/// `num_blocks × layers × 2 × chunks` (`tutti_runtime_info_t::chunks`) must
/// not exceed it, or `tutti_kv_register` refuses `num_blocks`.
pub const TUTTI_MAX_TABLE_DESCRIPTORS: u64 = 1 << 27;
const _: () = assert!(TUTTI_MAX_TABLE_DESCRIPTORS == tutti_objstore::registration::MAX_TABLE_DESCRIPTORS);

/// Most bytes of SGL tables one registration may build, every device view of the memory
/// together (`tutti_table_sizes_t::tables × descriptors × 16`; the views are counted before
/// anything is mapped as the drives' distinct DMA spaces). A larger `num_blocks` is refused
/// with `TUTTI_E_INVALID_ARG` naming this bound, before anything is mapped or built.
pub const TUTTI_MAX_TABLE_BYTES: u64 = 1 << 30;
const _: () = assert!(TUTTI_MAX_TABLE_BYTES == tutti_objstore::registration::MAX_TABLE_BYTES);

/// `tutti_kv_lookup` flag: pin the hit prefix against eviction until `tutti_kv_unpin`.
pub const TUTTI_LOOKUP_PIN: u32 = 1;

const MAX_SALT: usize = 4096;

/// A 128-bit chunk key, little endian (see `tutti_hash_chain`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tutti_hash_t {
    pub bytes: [u8; 16],
}

impl tutti_hash_t {
    pub(crate) fn key(self) -> BlockHash {
        BlockHash::from_bytes(self.bytes)
    }
}

/// The engine's KV memory. Set `struct_size = sizeof(tutti_kv_layout_t)`.
/// One object (K or V of one block in one layer) must be contiguous; block
/// `b`'s object sits at `base_of_layer + b * block_stride`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_kv_layout_t {
    pub struct_size: u32,
    /// `TUTTI_LAYOUT_*`.
    pub kind: u32,
    /// Engine blocks, at least 1, and few enough that the registration's SGL
    /// table fits `TUTTI_MAX_TABLE_DESCRIPTORS`.
    pub num_blocks: u32,
    /// Entries of `k_bases` (and `v_bases`): the geometry's layer count (0 for CONTIGUOUS).
    pub num_layers: u32,
    /// VLLM_PER_LAYER: address of layer l's tensor. STRIDED: block 0's K object of layer l. CONTIGUOUS: NULL.
    pub k_bases: *const u64,
    /// STRIDED: block 0's V object of layer l. Otherwise NULL.
    pub v_bases: *const u64,
    /// CONTIGUOUS: address of the region. Otherwise 0.
    pub base: u64,
    /// STRIDED: bytes from block b to block b+1. Otherwise 0.
    pub block_stride: u64,
    /// `TUTTI_MEMORY_*`.
    pub memory: u32,
    /// Model name and revision (non-empty), part of the cache identity.
    pub model: *const c_char,
    /// Per-tenant salt (nullable when `tenant_salt_len` is 0); tenants with different salts never share KV.
    pub tenant_salt: *const u8,
    pub tenant_salt_len: usize,
}

// SAFETY: repr(C) with `struct_size: u32` first.
unsafe impl SizePrefixed for tutti_kv_layout_t {
    const NAME: &'static str = "tutti_kv_layout_t";
}

/// Sizes of the P2P SGL tables built at registration, next to what PRP lists would take.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_table_sizes_t {
    pub struct_size: u32,
    /// Distinct device views (tables) of the registered memory.
    pub tables: u32,
    /// Descriptors per table: blocks × layers × 2 × chunks.
    pub descriptors: u64,
    pub sgl_bytes: u64,
    pub prp_entry_bytes: u64,
    pub prp_page_bytes: u64,
    pub prp_lists: u64,
}

// SAFETY: repr(C) with `struct_size: u32` first.
unsafe impl SizePrefixed for tutti_table_sizes_t {
    const NAME: &'static str = "tutti_table_sizes_t";
}

/// # Safety
/// The pointers in `c` follow the field docs of [`tutti_kv_layout_t`].
unsafe fn layout_of(rt: &Runtime, c: &tutti_kv_layout_t) -> Result<KvLayout> {
    let g = rt.geometry;
    let layers = g.layers as u64;
    let nonzero = |v: u64, what: &'static str| {
        if v != 0 {
            return Err(CapiError::invalid(what, format!("must be 0 for this layout kind, is {v:#x}")));
        }
        Ok(())
    };
    let null = |p: *const u64, what: &'static str| {
        if !p.is_null() {
            return Err(CapiError::invalid(what, "must be NULL for this layout kind"));
        }
        Ok(())
    };
    let bases = |p: *const u64, what: &'static str| {
        if c.num_layers as u64 != layers {
            return Err(CapiError::invalid(
                "num_layers",
                format!("{} bases given, the geometry has {layers} layers", c.num_layers),
            ));
        }
        // SAFETY: forwarded from the caller: `num_layers` readable entries.
        unsafe { ptr::slice_in(p, c.num_layers as usize, what, layers) }
    };
    let layout = match c.kind {
        TUTTI_LAYOUT_VLLM_PER_LAYER => {
            null(c.v_bases, "v_bases")?;
            nonzero(c.base, "base")?;
            nonzero(c.block_stride, "block_stride")?;
            KvLayout::vllm_per_layer(g, c.num_blocks, bases(c.k_bases, "k_bases")?)?
        }
        TUTTI_LAYOUT_CONTIGUOUS => {
            null(c.k_bases, "k_bases")?;
            null(c.v_bases, "v_bases")?;
            nonzero(c.block_stride, "block_stride")?;
            if c.num_layers != 0 {
                return Err(CapiError::invalid("num_layers", "must be 0 for TUTTI_LAYOUT_CONTIGUOUS"));
            }
            KvLayout::contiguous(g, c.num_blocks, c.base)?
        }
        TUTTI_LAYOUT_STRIDED => {
            nonzero(c.base, "base")?;
            let k = bases(c.k_bases, "k_bases")?;
            let v = bases(c.v_bases, "v_bases")?;
            let layers = k.iter().zip(v).map(|(&k, &v)| LayerBases { k, v }).collect();
            KvLayout::strided(g, c.num_blocks, c.block_stride, layers)?
        }
        n => return Err(CapiError::invalid("kind", format!("{n} is not a TUTTI_LAYOUT_* value (1..=3)"))),
    };
    Ok(layout)
}

/// Registers the engine's KV memory with the runtime under a cache identity
/// (model, tenant salt, geometry, dtype, layout kind). The SGL tables are
/// built here, once. Refused with `TUTTI_E_INVALID_ARG` before anything is mapped or built:
/// tables past `TUTTI_MAX_TABLE_DESCRIPTORS` or `TUTTI_MAX_TABLE_BYTES` (naming the bound),
/// and host memory (`TUTTI_MEMORY_HOST`, `_HOST_STAGED`) that is not all mapped readable and
/// writable in this process. Replaces an earlier registration when no job or store
/// is in flight (`TUTTI_E_BUSY` otherwise). `sizes` (nullable) gets the table sizes.
///
/// # Safety
/// `rt` is a runtime handle (checked); `layout` points to a
/// `tutti_kv_layout_t` whose pointers follow their docs; every byte the
/// layout describes is memory of this process that stays allocated, and is
/// not used for anything the drives must not overwrite, until
/// `tutti_kv_unregister`, a new registration, or the runtime is released.
#[no_mangle]
pub unsafe extern "C" fn tutti_kv_register(
    rt: *mut tutti_runtime_t,
    layout: *const tutti_kv_layout_t,
    sizes: *mut tutti_table_sizes_t,
) -> i32 {
    guard("tutti_kv_register", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let c = unsafe { ptr::sized_in(layout)? };
        if rt.executor == TUTTI_EXECUTOR_CONTROL {
            return Err(CapiError::Unsupported(
                "this runtime is a TUTTI_EXECUTOR_CONTROL client of tuttid: it moves no bytes, so it \
                 registers no KV memory (connect with TUTTI_EXECUTOR_GIO_HOST or TUTTI_EXECUTOR_GIO_CUDA)"
                    .into(),
            ));
        }
        // SAFETY: forwarded from the caller.
        let sizes = unsafe {
            if sizes.is_null() {
                None
            } else {
                Some(ptr::sized_out(sizes)?)
            }
        };
        let memory = match c.memory {
            TUTTI_MEMORY_HOST => KvMemoryKind::Host,
            TUTTI_MEMORY_CUDA => {
                if rt.executor != TUTTI_EXECUTOR_GIO_CUDA {
                    return Err(CapiError::Unsupported(format!(
                        "memory: CUDA device memory needs TUTTI_EXECUTOR_GIO_CUDA (3); this runtime runs {}",
                        executor_name(rt.executor)
                    )));
                }
                KvMemoryKind::Cuda
            }
            TUTTI_MEMORY_HOST_STAGED => KvMemoryKind::HostUnmapped,
            TUTTI_MEMORY_DEVICE_P2P => KvMemoryKind::DeviceP2p,
            n => {
                return Err(CapiError::invalid(
                    "memory",
                    format!("{n} is not a TUTTI_MEMORY_* value (1..=4)"),
                ))
            }
        };
        // SAFETY: forwarded from the caller.
        let model = unsafe { ptr::str_in(c.model, "model", 1024)? };
        // SAFETY: forwarded from the caller.
        let salt =
            unsafe { ptr::slice_in(c.tenant_salt, c.tenant_salt_len, "tenant_salt", MAX_SALT as u64)? };
        // SAFETY: forwarded from the caller.
        let kv = unsafe { layout_of(&rt, c)? };
        let store = rt.store()?;
        // SAFETY: the caller keeps the memory alive and dedicated (this function's contract);
        // CUDA memory is refused above unless the executor is the GPU's.
        let t: TableSizes = if memory == KvMemoryKind::DeviceP2p {
            let dev = caller_device_memory(&kv)?;
            // SAFETY: as above: the caller keeps the device memory mapped at the layout's addresses.
            unsafe { store.register_device(kv.clone(), model, salt, dev)? }
        } else if memory == KvMemoryKind::Cuda {
            let provider = cuda_provider(&kv)?;
            // SAFETY: as above; the GDRCopy pins are held by the registration and released
            // before it drops, so before the caller may free the memory.
            unsafe { store.register_cuda(kv.clone(), model, salt, provider)? }
        } else {
            // SAFETY: as above.
            unsafe { store.register_as(kv.clone(), model, salt, memory)? }
        };
        *lock(&rt.registered, "registration")? = Some(Registered {
            model: model.to_string(),
            num_blocks: c.num_blocks,
            layout: kv,
            salt: salt.to_vec(),
            memory,
        });
        if let Some(s) = sizes {
            *s = tutti_table_sizes_t {
                struct_size: s.struct_size,
                tables: t.tables,
                descriptors: t.descriptors,
                sgl_bytes: t.sgl_bytes,
                prp_entry_bytes: t.prp_entry_bytes,
                prp_page_bytes: t.prp_page_bytes,
                prp_lists: t.prp_lists,
            };
        }
        Ok(TUTTI_OK)
    })
}

/// Drops the registration (and its DMA mappings); `TUTTI_E_BUSY` while jobs or stores are in flight.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_kv_unregister(rt: *mut tutti_runtime_t) -> i32 {
    guard("tutti_kv_unregister", || {
        let rt = Runtime::get(rt)?;
        // The current store only: a disconnected client's registration goes with it, and
        // nothing is registered again when it reconnects.
        rt.current().store.unregister()?;
        *lock(&rt.registered, "registration")? = None;
        Ok(TUTTI_OK)
    })
}

/// Chained hashes of the full chunks of `tokens` (a partial last chunk gets
/// none): `*out_count` = `num_tokens / tokens_per_block`. If `out_capacity`
/// is smaller, nothing is written, `*out_count` is the number needed and the
/// result is `TUTTI_E_BUFFER_TOO_SMALL` (`out` may be NULL to ask).
///
/// Scheme (v1, stable; the object store's `chain_hashes`):
///
/// ```text
/// h(-1) = parent, or ROOT = u128 0x74757474692d6b762d726f6f742d7631 ("tutti-kv-root-v1")
/// h(i)  = H128( h(i-1) as 16 LE bytes || n as u32 LE || token_0 .. token_n-1 as u32 LE )
/// ```
///
/// so a hit on chunk i means chunks 0..=i all matched. `H128(m)` over bytes
/// m of length len is two 64-bit lanes, `hash = A << 64 | B`, stored
/// little endian in `tutti_hash_t.bytes`:
///
/// ```text
/// fmix64(k): k ^= k>>33; k *= 0xff51afd7ed558ccd; k ^= k>>33; k *= 0xc4ceb9fe1a85ec53; k ^= k>>33
/// A: a = 0xcbf29ce484222325 ^ 0x243f6a8885a308d3; per byte: a = (a ^ byte) * 0x100000001b3;
///    A = fmix64(a ^ rotl64(len, 32))
/// B: b = 0x13198a2e03707344; per 8-byte LE word w of m (last one zero-padded), then w = len:
///    b = rotl64(b ^ (w * 0x9e3779b97f4a7c15), 29) * 0xc2b2ae3d27d4eb4f + 0x9e3779b97f4a7c15
///    B = fmix64(b)
/// ```
///
/// (all arithmetic mod 2^64). Not cryptographic: where tenants do not trust
/// each other, pass the engine's own hashes (e.g. SHA-256 truncated to 16 bytes).
///
/// # Safety
/// `tokens` points to `num_tokens` readable u32 (NULL if 0); `parent` is NULL
/// or readable; `out` points to `out_capacity` writable hashes (NULL if 0);
/// `out_count` is writable.
#[no_mangle]
pub unsafe extern "C" fn tutti_hash_chain(
    tokens: *const u32,
    num_tokens: usize,
    tokens_per_block: u32,
    parent: *const tutti_hash_t,
    out: *mut tutti_hash_t,
    out_capacity: usize,
    out_count: *mut usize,
) -> i32 {
    guard("tutti_hash_chain", || {
        // SAFETY: forwarded from the caller.
        let count = unsafe { ptr::out(out_count, "out_count")? };
        if tokens_per_block == 0 {
            return Err(CapiError::invalid("tokens_per_block", "must be at least 1"));
        }
        // SAFETY: forwarded from the caller.
        let tokens = unsafe { ptr::slice_in(tokens, num_tokens, "tokens", TUTTI_MAX_TOKENS_PER_CALL)? };
        // SAFETY: forwarded from the caller.
        let parent = unsafe { ptr::in_opt(parent, "parent")? };
        let n = tokens.len() / tokens_per_block as usize;
        *count = n;
        if out_capacity < n {
            return Err(CapiError::BufferTooSmall {
                what: "out (hashes)",
                needed: n,
                capacity: out_capacity,
            });
        }
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr::slice_out(out, n, "out")? };
        let mut prev = parent.map_or(hash::ROOT, |p| p.key());
        for (o, chunk) in out.iter_mut().zip(tokens.chunks_exact(tokens_per_block as usize)) {
            prev = BlockHash::chain(prev, chunk);
            o.bytes = prev.to_bytes();
        }
        Ok(TUTTI_OK)
    })
}

/// Decodes `count` hashes from C.
///
/// # Safety
/// `hashes` points to `count` readable hashes (NULL if 0).
pub(crate) unsafe fn hashes_in(hashes: *const tutti_hash_t, count: usize) -> Result<Vec<BlockHash>> {
    // SAFETY: forwarded from the caller.
    let h = unsafe { ptr::slice_in(hashes, count, "hashes", TUTTI_MAX_BLOCKS_PER_CALL as u64)? };
    Ok(h.iter().map(|h| h.key()).collect())
}

/// How many leading chunks of `hashes` are stored under the registered
/// identity (`*out_hits`). With `TUTTI_LOOKUP_PIN` in `flags`, those chunks
/// are pinned against eviction and `*out_pin` gets the pin to pass to
/// `tutti_kv_unpin` (0 when nothing was pinned); without it nothing is pinned,
/// the LRU order is untouched and `out_pin` (nullable) gets 0.
///
/// # Safety
/// `rt` is a runtime handle (checked); `hashes` points to `count` readable
/// hashes; `out_hits` is writable; `out_pin` is writable (or NULL without the pin flag).
#[no_mangle]
pub unsafe extern "C" fn tutti_kv_lookup(
    rt: *mut tutti_runtime_t,
    hashes: *const tutti_hash_t,
    count: usize,
    flags: u32,
    out_hits: *mut usize,
    out_pin: *mut u64,
) -> i32 {
    guard("tutti_kv_lookup", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let hits = unsafe { ptr::out(out_hits, "out_hits")? };
        if flags & !TUTTI_LOOKUP_PIN != 0 {
            return Err(CapiError::invalid(
                "flags",
                format!("{flags:#x} has bits other than TUTTI_LOOKUP_PIN"),
            ));
        }
        let pin = flags & TUTTI_LOOKUP_PIN != 0;
        // SAFETY: forwarded from the caller.
        let pin_out = unsafe {
            if pin {
                Some(ptr::out(out_pin, "out_pin")?)
            } else {
                ptr::out_opt(out_pin, "out_pin")?
            }
        };
        // SAFETY: forwarded from the caller.
        let keys = unsafe { hashes_in(hashes, count)? };
        let cur = rt.live()?;
        let (n, id) = if pin {
            let l = cur.store.lookup(&keys)?;
            (l.hits(), pin_of(cur.epoch, l.pin)?)
        } else {
            (cur.store.contains(&keys)?, 0)
        };
        *hits = n;
        if let Some(p) = pin_out {
            *p = id;
        }
        Ok(TUTTI_OK)
    })
}

/// How many leading chunks of `hashes` are stored under the cache identity
/// given here (`*out_hits`) instead of under the runtime's registration: the
/// model name, tenant salt and layout kind (`TUTTI_LAYOUT_*`) with the
/// runtime's geometry, exactly as `tutti_kv_register` would form it. For a
/// process that holds no KV memory of its own (an engine's scheduler asking
/// for its workers' identities). A query only: nothing is pinned, the LRU
/// order is untouched, and no registration is needed. Added in ABI 1.3.
///
/// # Safety
/// `rt` is a runtime handle (checked); `model` is a NUL-terminated string;
/// `tenant_salt` points to `tenant_salt_len` readable bytes (NULL if 0);
/// `hashes` points to `count` readable hashes; `out_hits` is writable.
#[no_mangle]
pub unsafe extern "C" fn tutti_kv_contains_identity(
    rt: *mut tutti_runtime_t,
    model: *const c_char,
    tenant_salt: *const u8,
    tenant_salt_len: usize,
    layout_kind: u32,
    hashes: *const tutti_hash_t,
    count: usize,
    out_hits: *mut usize,
) -> i32 {
    guard("tutti_kv_contains_identity", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let hits = unsafe { ptr::out(out_hits, "out_hits")? };
        // SAFETY: forwarded from the caller.
        let model = unsafe { ptr::str_in(model, "model", 1024)? };
        if model.is_empty() {
            return Err(CapiError::invalid("model", "the cache identity needs a model name"));
        }
        // SAFETY: forwarded from the caller.
        let salt = unsafe { ptr::slice_in(tenant_salt, tenant_salt_len, "tenant_salt", MAX_SALT as u64)? };
        let kind = match layout_kind {
            TUTTI_LAYOUT_VLLM_PER_LAYER => LayoutKind::VllmPerLayer,
            TUTTI_LAYOUT_CONTIGUOUS => LayoutKind::Contiguous,
            TUTTI_LAYOUT_STRIDED => LayoutKind::Strided,
            n => {
                return Err(CapiError::invalid(
                    "layout_kind",
                    format!("{n} is not a TUTTI_LAYOUT_* value (1..=3)"),
                ))
            }
        };
        // SAFETY: forwarded from the caller.
        let keys = unsafe { hashes_in(hashes, count)? };
        let id = CacheIdentity::new(model, rt.geometry, kind, salt).id();
        *hits = rt.store()?.control().contains(id, &keys)?;
        Ok(TUTTI_OK)
    })
}

/// Where a pin carries the connection it was made on (a client that reconnected, ABI 1.11):
/// the daemon's own pin ids start again in each daemon, so a pin of the old one could name a
/// pin of the new one.
const PIN_EPOCH_SHIFT: u32 = 48;
const PIN_MASK: u64 = (1 << PIN_EPOCH_SHIFT) - 1;

/// The pin a caller gets for the daemon's (or the in-process pool's) `pin` on connection `epoch`.
fn pin_of(epoch: u64, pin: u64) -> Result<u64> {
    if pin == 0 || epoch == 0 {
        return Ok(pin);
    }
    if pin > PIN_MASK || epoch >= 1 << (64 - PIN_EPOCH_SHIFT) {
        return Err(CapiError::Io(format!("pin {pin:#x} of connection {epoch} does not fit a pin handle")));
    }
    Ok(epoch << PIN_EPOCH_SHIFT | pin)
}

/// Releases the pins of a `tutti_kv_lookup` (0 is a no-op; an unknown or
/// already released pin is `TUTTI_E_NOT_FOUND`). A pin made before a client of tuttid
/// reconnected (ABI 1.11) is a no-op too: the daemon that held it is gone, and the new one
/// holds nothing of it.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_kv_unpin(rt: *mut tutti_runtime_t, pin: u64) -> i32 {
    guard("tutti_kv_unpin", || {
        let rt = Runtime::get(rt)?;
        if pin == 0 {
            return Ok(TUTTI_OK);
        }
        let cur = rt.current();
        if rt.link.is_none() {
            cur.store.unpin(pin)?;
            return Ok(TUTTI_OK);
        }
        if pin >> PIN_EPOCH_SHIFT != cur.epoch {
            // A pin of an earlier connection: its daemon is gone, and its pins with it.
            return Ok(TUTTI_OK);
        }
        cur.store.unpin(pin & PIN_MASK)?;
        Ok(TUTTI_OK)
    })
}

/// Device memory the caller mapped at `kv`'s addresses, reached through that
/// mapping, under the `TUTTI_P2P` setting.
fn p2p_policy() -> Result<tutti_objstore::P2pPolicy> {
    match std::env::var("TUTTI_P2P") {
        Ok(v) => Ok(tutti_objstore::P2pPolicy::parse(&v)?),
        Err(_) => Ok(tutti_objstore::P2pPolicy::Auto),
    }
}

/// CUDA KV memory's way to the drives: its GPU pages pinned and mapped through GDRCopy
/// (`TUTTI_GDRAPI`, else libgdrapi.so.2), unless `TUTTI_P2P=off`. `Ok(Err(why))` when there
/// is none and staging will do; an error when `TUTTI_P2P=require` and there is none.
fn cuda_provider(
    kv: &tutti_objstore::KvLayout,
) -> Result<std::result::Result<tutti_objstore::DeviceKvMemory, String>> {
    use tutti_objstore::{gdr::GdrMapped, P2pPolicy};
    let policy = p2p_policy()?;
    let obstacle = KvMemoryKind::Cuda.p2p_obstacle().unwrap_or_default();
    if policy == P2pPolicy::Off {
        return Ok(Err(format!(
            "CUDA memory: P2P is off (TUTTI_P2P=off), so no GDRCopy mapping is made; {obstacle}"
        )));
    }
    let regions: Vec<(u64, u64)> = kv.regions().iter().map(|r| (r.addr, r.len)).collect();
    let library = GdrMapped::library_from_env();
    match GdrMapped::pin(&library, &regions) {
        Ok(m) => Ok(Ok(tutti_objstore::DeviceKvMemory {
            provider: "gdrcopy".into(),
            policy,
            access: std::sync::Arc::new(m),
            unreachable: false,
        })),
        Err(e) if policy == P2pPolicy::Require => {
            Err(CapiError::invalid("memory", format!("{e} (TUTTI_P2P=require needs a GDRCopy mapping)")))
        }
        Err(e) => Ok(Err(format!("CUDA memory: no GDRCopy mapping for the drives ({e}); {obstacle}"))),
    }
}

fn caller_device_memory(kv: &tutti_objstore::KvLayout) -> Result<tutti_objstore::DeviceKvMemory> {
    let regions = kv.regions();
    let base = regions.iter().map(|r| r.addr).min().unwrap_or(0);
    let end = regions.iter().map(|r| r.addr + r.len).max().unwrap_or(0);
    let policy = p2p_policy()?;
    Ok(tutti_objstore::DeviceKvMemory {
        provider: "caller-mapped device memory".into(),
        policy,
        access: std::sync::Arc::new(tutti_objstore::CpuMapped { base, len: end - base }),
        unreachable: false,
    })
}
