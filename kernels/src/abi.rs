//! The Rust side of `include/tutti_gio.h`: the memory the host and the executor share.
//!
//! Field names are the header's; C pointers are `u64` addresses in the
//! executor's address space. `tests/layout.rs` compiles a program against the
//! header and checks every size and offset here against it.

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

pub const ABI_VERSION: u32 = 5;
pub const IOCB_MAX_IOCTX: usize = 2048;
pub const IOCTX_INDEX_BITS: u32 = 11;
pub const IOCB_MAX_PAIRS: usize = 1024;
pub const TABLE_MAX_DRIVES: usize = 32;
pub const WARP_SIZE: u32 = 32;

pub const IOCTX_SGL: u8 = 0x01;
pub const IOCTX_PRP: u8 = 0x02;
pub const IOCTX_TABLE: u8 = 0x04;

pub const STATUS_SUCCESS: u32 = 0;
pub const STATUS_PENDING: u32 = 0xFFFF_FFFF;
pub const STATUS_KIND_SHIFT: u32 = 24;
pub const KIND_NVME: u32 = 0x01;
pub const KIND_TIMEOUT: u32 = 0x02;
pub const KIND_TRANSLATION: u32 = 0x03;
pub const KIND_INVALID: u32 = 0x04;
pub const KIND_QUEUE_DEAD: u32 = 0x05;
pub const KIND_QUEUE_RECOVERING: u32 = 0x06;

pub const TIMEOUT_COMPLETION: u32 = 1;
pub const TIMEOUT_SUBMIT: u32 = 2;
pub const TIMEOUT_STAGING: u32 = 3;

pub const XLATE_DRIVE: u32 = 1;
pub const XLATE_TABLE: u32 = 2;
pub const XLATE_LAYER: u32 = 3;
pub const XLATE_FILE: u32 = 4;
pub const XLATE_BLOCK: u32 = 5;
pub const XLATE_INDEX: u32 = 6;
pub const XLATE_EMPTY: u32 = 7;
pub const XLATE_LENGTH: u32 = 8;
pub const XLATE_PAIR_LIST: u32 = 9;
pub const XLATE_PAIR_RANGE: u32 = 10;
pub const XLATE_UNIT: u32 = 11;

pub const INVALID_OPCODE: u32 = 1;
pub const INVALID_LENGTH: u32 = 2;
pub const INVALID_DPTR: u32 = 3;
pub const INVALID_SGL_LENGTH: u32 = 4;
pub const INVALID_NO_SGL: u32 = 5;
pub const INVALID_SGL_ALIGN: u32 = 6;

pub const IOCB_EXPLICIT: u32 = 0;
pub const IOCB_LAYER: u32 = 1;
pub const IOCB_LAYER_LIST: u32 = 2;

pub const TABLE_UNUSED: u32 = 0;
pub const TABLE_SGL: u32 = 1;
pub const TABLE_PRP: u32 = 2;
pub const TABLE_STAGED: u32 = 3;

pub const DRIVE_SGL: u32 = 0x1;
pub const DRIVE_SGL_DWORD: u32 = 0x2;

pub const SLOT_FREE: u64 = u64::MAX;
pub const NO_ERROR: u64 = u64::MAX;
/// `tt_nvmeq.slot_late`: the slot's last expired command (low 16 bits: its CID) ...
pub const LATE_EXPIRED: u32 = 0x8000_0000;
/// ... whose completion came after all.
pub const LATE_ARRIVED: u32 = 0x4000_0000;
/// `tt_staging.held[2 * slot]` of a withheld slot has this bit set.
pub const HELD_VALID: u64 = 1 << 63;
/// Low bits of a withheld slot's command ticket kept in `held[2 * slot]`.
pub const HELD_TICKET_BITS: u32 = 40;

/// `TT_STATUS(kind, detail)`.
pub const fn status(kind: u32, detail: u32) -> u32 {
    kind << STATUS_KIND_SHIFT | (detail & 0xFF_FFFF)
}

/// A submission-ring entry (`TT_ENTRY`): part `part` of `parts` of IOCB `iocb`.
pub const fn ring_entry(iocb: u32, part: u16, parts: u16) -> u64 {
    iocb as u64 | (part as u64) << 32 | (parts as u64) << 48
}

/// One I/O context: one NVMe command (`struct tt_ioctx`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IoCtx {
    /// SGL descriptor (`IOCTX_SGL`) or PRP1, PRP2 (`IOCTX_PRP`).
    pub dptr: [u64; 2],
    pub slba: u64,
    /// Logical blocks, 1..=65536.
    pub nlb: u32,
    /// 0 = the drive's namespace.
    pub nsid: u32,
    pub table_index: u32,
    pub drive: u16,
    pub opcode: u8,
    pub flags: u8,
    /// Written by the executor.
    pub status: u32,
    /// CDW12[31:16].
    pub cdw12_hi: u16,
    pub table: u8,
    pub rsvd0: u8,
    pub ticket: u64,
    pub queue: u32,
    pub latency_us: u32,
}

/// A (file, engine block) pair of a layer IOCB (`struct tt_pair`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LayerPair {
    pub file: u32,
    pub block: u32,
}

/// `struct tt_iocb_hdr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IocbHeader {
    pub id: u32,
    pub seq: u32,
    pub count: u32,
    pub kind: u32,
    pub nparts: u32,
    pub parts_left: u32,
    pub completed: u32,
    pub failed: u32,
    pub first_error: u64,
    pub done_seq: u32,
    pub table: u32,
    pub layer: u32,
    pub npairs: u32,
    pub opcode: u8,
    pub rsvd0: [u8; 3],
    /// `IOCB_LAYER_LIST`: index into `ExecCtx::pair_lists`.
    pub pair_list: u32,
    pub start_ns: u64,
    pub done_ns: u64,
    /// `IOCB_LAYER_LIST`: first pair of the list this IOCB expands.
    pub pair_first: u32,
    pub rsvd1: u32,
    pub rsvd2: [u64; 5],
}

/// `struct tt_iocb`: never built on the stack (139 KiB); lives in shared memory.
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Iocb {
    pub hdr: IocbHeader,
    pub pairs: [LayerPair; IOCB_MAX_PAIRS],
    pub ioctx: [IoCtx; IOCB_MAX_IOCTX],
}

/// `struct tt_ring_cell`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RingCell {
    pub seq: u64,
    pub value: u64,
}

/// `struct tt_ring`; `capacity` cells follow it in memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RingHeader {
    pub head: u64,
    pub pad0: [u64; 7],
    pub tail: u64,
    /// Host-built consumers blocked on `wake_seq` (see `tutti_gio.h`).
    pub sleepers: u32,
    /// Bumped by a producer that wakes them.
    pub wake_seq: u32,
    pub pad1: [u64; 6],
    pub capacity: u32,
    pub mask: u32,
    pub pad2: [u64; 7],
}

/// `struct tt_control`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Control {
    pub stop: u32,
    pub running: u32,
    pub parts_done: u64,
    pub iocbs_done: u64,
    pub lost_posts: u64,
    /// Persistent blocks with an index at or above this take no new work (0: every block).
    pub active_blocks: u32,
    pub rsvd0: u32,
    pub rsvd: [u64; 3],
}

/// `struct tt_drive`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DriveDesc {
    pub first_queue: u32,
    pub nqueues: u32,
    pub nsid: u32,
    pub lba_shift: u32,
    pub max_lbas: u32,
    pub flags: u32,
    pub rsvd: u64,
}

/// `struct tt_qgate`: the host's hold on one queue pair (shared memory). The
/// host stores `recovering`; the executor adds to `users`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct QueueGate {
    pub recovering: u32,
    pub users: u32,
    /// Host: bumped each time the queue pair was deleted and created again.
    pub epoch: u32,
    pub rsvd0: u32,
    pub rsvd: [u64; 6],
}

/// `struct tt_nvmeq`: configuration, then state only the executor touches.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NvmeQueue {
    pub sq: u64,
    pub cq: u64,
    pub sq_db: u64,
    pub cq_db: u64,
    pub slot_owner: u64,
    pub slot_time: u64,
    pub slot_ready: u64,
    pub slot_turn: u64,
    pub depth: u32,
    pub qid: u32,
    pub drive: u32,
    pub cid_shift: u32,
    /// Executor address of this queue's [`QueueGate`] (shared memory).
    pub gate: u64,
    /// Host lanes only: executor address of an emulated controller's wake
    /// word, woken after each doorbell store (0: none; a GPU leaves it alone).
    pub wake: u64,
    /// Executor address of `[depth]` u32: `LATE_*` | CID of the last command expired in each slot.
    pub slot_late: u64,
    pub pad0: [u64; 3],
    pub ticket: u64,
    pub hole: u64,
    pub pad1: [u64; 6],
    pub sq_tail: u64,
    pub tail_lock: u32,
    pub dead: u32,
    pub pad2: [u64; 6],
    pub cq_head: u64,
    pub sq_head: u64,
    pub head_lock: u32,
    pub rsvd0: u32,
    pub pad3: [u64; 5],
    pub completed: u64,
    pub errors: u64,
    pub expired: u64,
    pub stale: u64,
    pub sq_doorbells: u64,
    pub cq_doorbells: u64,
    pub pad4: [u64; 2],
}

/// `struct tt_layer_table`: see `LayerTable` in gio_uring for the placement formula.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LayerTableDesc {
    pub kind: u32,
    pub layers: u32,
    pub ndrives: u32,
    pub chunks: u32,
    pub files: u32,
    pub blocks: u32,
    /// Object size in units of `2^unit_shift` bytes.
    pub object_units: u32,
    /// Bytes per command (all but the last of an object), same units.
    pub chunk_units: u32,
    pub slots_per_file: u32,
    /// log2 of the smallest LBA size of the pool; a drive with larger LBAs
    /// divides unit counts by the ratio.
    pub unit_shift: u32,
    pub entries: u64,
    pub entry_count: u64,
    pub drive: [u32; TABLE_MAX_DRIVES],
    pub data_start_lba: [u64; TABLE_MAX_DRIVES],
    /// `TABLE_STAGED`: executor address of its [`StagingDesc`]; else 0.
    pub staging: u64,
}

impl Default for LayerTableDesc {
    fn default() -> Self {
        LayerTableDesc::new_zeroed()
    }
}

/// `struct tt_staging`: the staging slots of a `TABLE_STAGED` layer table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct StagingDesc {
    /// Executor address of the ring of free slot indices.
    pub free: u64,
    /// Executor address of slot 0.
    pub base: u64,
    /// Executor address of `[pool drives][nslots][4]` data pointer words.
    pub dptr: u64,
    pub nslots: u32,
    pub slot_bytes: u32,
    /// Bit d: pool drive d takes SGL descriptors (else PRPs).
    pub sgl_drives: u32,
    pub page_shift: u32,
    /// Executor: times a lane found no free slot.
    pub waits: u64,
    /// Executor: times a slot was kept out of use after a command of unknown outcome.
    pub withheld: u64,
    /// Executor: bytes copied between slots and KV memory.
    pub staged_bytes: u64,
    /// Executor address of `[nslots][2]` u64: what each withheld slot waits for (see `tutti_gio.h`).
    pub held: u64,
    /// Executor: slots withheld now.
    pub held_now: u64,
    /// Executor: withheld slots given back after their queue pair was deleted and created again.
    pub reclaimed_reset: u64,
    /// Executor: withheld slots given back after their command's late completion.
    pub reclaimed_late: u64,
}

/// `struct tt_pair_list`: a registered (file, block) pair list.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PairListDesc {
    /// Executor address of `npairs` [`LayerPair`]s; 0 for a free slot.
    pub pairs: u64,
    pub npairs: u64,
}

/// `struct tt_exec_ctx`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ExecCtx {
    pub sq_ring: u64,
    pub cq_ring: u64,
    pub control: u64,
    pub iocbs: u64,
    pub queues: u64,
    pub drives: u64,
    pub tables: u64,
    pub niocbs: u32,
    pub nqueues: u32,
    pub ndrives: u32,
    pub ntables: u32,
    pub command_timeout_ns: u64,
    pub submit_timeout_ns: u64,
    pub max_backoff_ns: u32,
    pub idle_sleep_ns: u32,
    /// Executor address of `npair_lists` [`PairListDesc`]s.
    pub pair_lists: u64,
    pub npair_lists: u32,
    pub rsvd0: u32,
}

const _: () = assert!(size_of::<IoCtx>() == 64);
const _: () = assert!(size_of::<IocbHeader>() == 128);
const _: () = assert!(size_of::<RingHeader>() == 192);
const _: () = assert!(size_of::<NvmeQueue>() == 384);
const _: () = assert!(size_of::<QueueGate>() == 64);
const _: () = assert!(size_of::<PairListDesc>() == 16);
const _: () = assert!(size_of::<StagingDesc>() == 96);
const _: () = assert!(IOCB_MAX_IOCTX == 1 << IOCTX_INDEX_BITS);
