/*
 * tutti_gio.h — the memory layout shared by the host (Rust, tutti_kernels::abi)
 * and the I/O executor (CUDA kernels, or the same source compiled for host lanes).
 *
 * Kept by hand. kernels/tests/layout.rs compiles a program against this header
 * and checks the size and offset of every field against the Rust definitions.
 * Change both sides together and bump TT_ABI_VERSION.
 *
 * Who writes what:
 *   host only, before issue .......... tt_ioctx request fields, tt_iocb_hdr request fields,
 *                                      tt_pair, tt_exec_ctx, tt_drive, tt_layer_table, tt_pair_list,
 *                                      tt_nvmeq config
 *   executor only ..................... tt_ioctx.status/ticket/queue/latency_us, tt_iocb_hdr counters,
 *                                      tt_nvmeq state and slot arrays
 *   both, one side per word ........... tt_qgate (host stores `recovering`, the executor adds to `users`),
 *                                      tt_ring (host produces the submission ring and consumes the
 *                                      completion ring; the executor does the opposite; no word is
 *                                      read-modify-written by both sides)
 */
#ifndef TUTTI_GIO_H
#define TUTTI_GIO_H

#if defined(__CUDACC_RTC__)
/* NVRTC has no <stdint.h>; these match the LP64 host widths. */
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;
#else
#include <stdint.h>
#endif

#define TT_ABI_VERSION 5u

/* One IOCB carries at most this many IOCTXs: one per thread of two 1024-thread blocks. */
#define TT_IOCB_MAX_IOCTX 2048u
#define TT_IOCTX_INDEX_BITS 11u
/* A layer IOCB names at most this many (file, block) pairs; each expands to >= 2 IOCTXs. */
#define TT_IOCB_MAX_PAIRS 1024u
/* Drives in one layer table's pool. */
#define TT_TABLE_MAX_DRIVES 32u
#define TT_WARP_SIZE 32u

/* tt_ioctx.flags: where the command's data pointer comes from (exactly one). */
#define TT_IOCTX_SGL 0x01u   /* dptr is one 16-byte SGL descriptor (PSDT 01b) */
#define TT_IOCTX_PRP 0x02u   /* dptr is PRP1, PRP2 (PSDT 00b) */
#define TT_IOCTX_TABLE 0x04u /* dptr is entry table_index of layer table `table` */

/*
 * tt_ioctx.status: 0 = success, 0xFFFFFFFF = not finished; otherwise a kind in
 * bits 31:24 and a detail in bits 23:0.
 */
#define TT_STATUS_SUCCESS 0x00000000u
#define TT_STATUS_PENDING 0xFFFFFFFFu
#define TT_STATUS_KIND_SHIFT 24u
#define TT_KIND_NVME 0x01u        /* detail: the 15-bit NVMe status field (SC, SCT, CRD, M, DNR) */
#define TT_KIND_TIMEOUT 0x02u     /* detail: TT_TIMEOUT_* */
#define TT_KIND_TRANSLATION 0x03u /* detail: TT_XLATE_* */
#define TT_KIND_INVALID 0x04u     /* detail: TT_INVALID_* */
#define TT_KIND_QUEUE_DEAD 0x05u  /* the queue failed earlier; detail: queue index */
#define TT_KIND_QUEUE_RECOVERING 0x06u /* the host is recovering the queue; never sent; detail: queue index */

#define TT_TIMEOUT_COMPLETION 1u /* submitted, no completion before the command deadline */
#define TT_TIMEOUT_SUBMIT 2u     /* no submission slot before the submit deadline */
#define TT_TIMEOUT_STAGING 3u    /* no free staging slot before the submit deadline */

#define TT_XLATE_DRIVE 1u  /* drive index not configured */
#define TT_XLATE_TABLE 2u  /* no such layer table */
#define TT_XLATE_LAYER 3u  /* layer >= table layers */
#define TT_XLATE_FILE 4u   /* file id >= table files */
#define TT_XLATE_BLOCK 5u  /* block id >= table blocks */
#define TT_XLATE_INDEX 6u  /* table entry index out of range */
#define TT_XLATE_EMPTY 7u  /* table entry never filled */
#define TT_XLATE_LENGTH 8u /* table entry length differs from the chunk's length */
#define TT_XLATE_PAIR_LIST 9u   /* no such registered pair list */
#define TT_XLATE_PAIR_RANGE 10u /* pair_first + npairs beyond the pair list (or the IOCB's pairs) */
#define TT_XLATE_UNIT 11u       /* a drive's LBA size does not fit the layer table's units */

#define TT_INVALID_OPCODE 1u     /* only Read (02h) and Write (01h) are issued */
#define TT_INVALID_LENGTH 2u     /* nlb is 0 or above the drive's per-command limit (MDTS) */
#define TT_INVALID_DPTR 3u       /* flags name no data pointer, or several */
#define TT_INVALID_SGL_LENGTH 4u /* a Data Block's length is not nlb logical blocks */
#define TT_INVALID_NO_SGL 5u     /* SGL requested for a drive without SGL support */
#define TT_INVALID_SGL_ALIGN 6u  /* SGLS=10b requires dword-aligned address and length */

#define TT_STATUS(kind, detail) (((uint32_t)(kind) << TT_STATUS_KIND_SHIFT) | ((uint32_t)(detail) & 0xFFFFFFu))

/* tt_iocb_hdr.kind */
#define TT_IOCB_EXPLICIT 0u /* the host filled `count` IOCTXs */
#define TT_IOCB_LAYER 1u    /* the executor expands `npairs` pairs through layer table `table` */
/* ... the same, but the pairs are pairs[pair_first .. pair_first + npairs) of registered
 * pair list `pair_list` (tt_exec_ctx.pair_lists), not the IOCB's inline pairs[]. */
#define TT_IOCB_LAYER_LIST 2u

/* tt_layer_table.kind */
#define TT_TABLE_UNUSED 0u
#define TT_TABLE_SGL 1u
#define TT_TABLE_PRP 2u
/* Entries are { executor address of the chunk's KV memory, its length in bytes }: the
 * drives cannot reach that memory, so each command moves through a staging slot
 * (tt_layer_table.staging) that the lane copies to (write) or from (read). */
#define TT_TABLE_STAGED 3u

/* tt_drive.flags */
#define TT_DRIVE_SGL 0x1u       /* the controller accepts SGLs (Identify SGLS != 0) */
#define TT_DRIVE_SGL_DWORD 0x2u /* ... with dword alignment (SGLS = 10b) */

/* tt_nvmeq.slot_late: the slot's last expired command (low 16 bits: its CID) ... */
#define TT_LATE_EXPIRED 0x80000000u
/* ... whose completion came after all. */
#define TT_LATE_ARRIVED 0x40000000u

/* tt_staging.held[2 * slot]: 0, or the withheld slot's command (see tt_staging). */
#define TT_HELD_VALID 0x8000000000000000ull
#define TT_HELD_TICKET_BITS 40u

/* tt_nvmeq.slot_owner value of a slot with no command in flight. */
#define TT_SLOT_FREE 0xFFFFFFFFFFFFFFFFull
/* tt_iocb_hdr.first_error when no IOCTX failed. */
#define TT_NO_ERROR 0xFFFFFFFFFFFFFFFFull

/* Submission-ring entry: IOCB index | part << 32 | parts << 48. */
#define TT_ENTRY(iocb, part, parts) \
    ((uint64_t)(iocb) | ((uint64_t)(part) << 32) | ((uint64_t)(parts) << 48))

/* One I/O context: one NVMe command. 64 bytes. */
struct tt_ioctx {
    uint64_t dptr[2];     /* SGL descriptor (TT_IOCTX_SGL) or PRP1, PRP2 (TT_IOCTX_PRP) */
    uint64_t slba;        /* starting LBA */
    uint32_t nlb;         /* logical blocks, 1..=65536 */
    uint32_t nsid;        /* 0 = the drive's namespace */
    uint32_t table_index; /* TT_IOCTX_TABLE: entry of layer table `table` */
    uint16_t drive;       /* executor drive index */
    uint8_t opcode;       /* 01h Write, 02h Read */
    uint8_t flags;        /* TT_IOCTX_* */
    uint32_t status;      /* executor: TT_STATUS_* (host sets PENDING before issue) */
    uint16_t cdw12_hi;    /* CDW12[31:16]: FUA (bit 30), Limited Retry (bit 31), ... */
    uint8_t table;        /* TT_IOCTX_TABLE: layer table id */
    uint8_t rsvd0;
    uint64_t ticket;     /* executor: the command's ticket on its queue */
    uint32_t queue;      /* executor: index of the queue the command went to */
    uint32_t latency_us; /* executor: submission to completion, microseconds */
};

/* A (file, engine block) pair of a layer IOCB. */
struct tt_pair {
    uint32_t file;
    uint32_t block;
};

/* IOCB header. 128 bytes. */
struct tt_iocb_hdr {
    uint32_t id;          /* index in the pool */
    uint32_t seq;         /* host: issue sequence number (never 0) */
    uint32_t count;       /* IOCTXs (TT_IOCB_LAYER: npairs * 2 * chunks, computed by the host) */
    uint32_t kind;        /* TT_IOCB_* */
    uint32_t nparts;      /* host: parts this IOCB was split into */
    uint32_t parts_left;  /* executor: counts down; the last part posts the completion */
    uint32_t completed;   /* executor: IOCTXs finished (any status) */
    uint32_t failed;      /* executor: IOCTXs finished with a non-success status */
    uint64_t first_error; /* executor: index << 32 | status of the first IOCTX to fail */
    uint32_t done_seq;    /* executor: `seq` once this issue completed (release) */
    uint32_t table;       /* TT_IOCB_LAYER: layer table id */
    uint32_t layer;       /* TT_IOCB_LAYER */
    uint32_t npairs;      /* TT_IOCB_LAYER */
    uint8_t opcode;       /* TT_IOCB_LAYER: 01h Write or 02h Read */
    uint8_t rsvd0[3];
    uint32_t pair_list;  /* TT_IOCB_LAYER_LIST: index into tt_exec_ctx.pair_lists */
    uint64_t start_ns;   /* executor: when the first part started */
    uint64_t done_ns;    /* executor: when the completion was posted */
    uint32_t pair_first; /* TT_IOCB_LAYER_LIST: first pair of the list this IOCB expands */
    uint32_t rsvd1;
    uint64_t rsvd2[5];
};

/* One IOCB: header, layer pairs, IOCTXs. */
struct tt_iocb {
    struct tt_iocb_hdr hdr;
    struct tt_pair pairs[TT_IOCB_MAX_PAIRS];
    struct tt_ioctx ioctx[TT_IOCB_MAX_IOCTX];
};

/*
 * Bounded multi-producer multi-consumer ring of 64-bit values (Vyukov's
 * sequence-numbered cells). `capacity` cells follow the header in memory.
 * Cell i starts with seq = i; a producer of position p waits for seq == p and
 * publishes seq = p + 1; a consumer of p waits for seq == p + 1 and frees the
 * cell with seq = p + capacity. head/tail are CASed by one side only.
 *
 * A host-built consumer that finds the ring empty may block instead of polling:
 * it reads wake_seq, counts itself in `sleepers`, looks at the ring once more and
 * waits (futex) for wake_seq to change. A producer that published a value and
 * then sees sleepers != 0 bumps wake_seq and wakes them. GPU consumers never
 * sleep this way, so `sleepers` stays 0 and producers never make the call.
 * The host blocks the same way on the completion ring; a host-built executor
 * wakes it, a GPU cannot (its producer side is a no-op), so the host's wait
 * there is always bounded by a short timeout.
 */
struct tt_ring_cell {
    uint64_t seq;
    uint64_t value;
};

struct tt_ring {
    uint64_t head; /* consumers' position */
    uint64_t pad0[7];
    uint64_t tail; /* producers' position */
    uint32_t sleepers; /* host consumers blocked (or about to) on wake_seq */
    uint32_t wake_seq; /* bumped by a producer that wakes them */
    uint64_t pad1[6];
    uint32_t capacity; /* power of two */
    uint32_t mask;
    uint64_t pad2[7];
};

/* Host-visible control block of one executor. 64 bytes. */
struct tt_control {
    uint32_t stop;          /* host: persistent kernels return when set */
    uint32_t running;       /* executor: blocks inside a persistent kernel */
    uint64_t parts_done;    /* executor: IOCB parts processed */
    uint64_t iocbs_done;    /* executor: completions posted */
    uint64_t lost_posts;    /* executor: completions that found the completion ring full */
    uint32_t active_blocks; /* host: persistent blocks >= this take no new work (0: every block) */
    uint32_t rsvd0;
    uint64_t rsvd[3];
};

/* One drive (namespace) as the executor sees it. 32 bytes. */
struct tt_drive {
    uint32_t first_queue; /* its queues are first_queue .. first_queue + nqueues - 1 */
    uint32_t nqueues;
    uint32_t nsid;
    uint32_t lba_shift;
    uint32_t max_lbas; /* per command: MDTS in logical blocks */
    uint32_t flags;    /* TT_DRIVE_* */
    uint64_t rsvd;
};

/*
 * The host's hold on one queue pair, in shared memory. 64 bytes. Before a
 * lane touches a queue for a command it adds itself to `users`, then reads
 * `recovering` (a full fence between: the host stores `recovering`, fences,
 * then reads `users`, so one side always sees the other); if set it leaves
 * again and the command fails with TT_KIND_QUEUE_RECOVERING. A lane leaves
 * once its command has finished. With `recovering` set and `users` at 0 no
 * lane is inside the queue, and the host may delete, recreate and reset it;
 * it bumps `epoch` once the new pair exists (before it opens the gate), so
 * whatever waited on a command of the old pair (a withheld staging slot) knows
 * the drive can no longer touch it.
 */
struct tt_qgate {
    uint32_t recovering; /* host: 1 while the queue is being recovered (or failed to recover) */
    uint32_t users;      /* executor: commands between admission and their finish */
    uint32_t epoch;      /* host: bumped each time the queue pair was deleted and created again */
    uint32_t rsvd0;
    uint64_t rsvd[6];
};

/*
 * One NVMe I/O queue pair driven by many executor threads. 384 bytes.
 *
 * A submitter takes ticket t (one atomic per warp); its slot is t % depth and
 * its lap t / depth. It may write the slot when slot_turn[slot] == lap (the
 * previous lap's command has finished, so its CID is free) and the SQ has room
 * by the last SQHD (t < sq_head + depth - 1, §4.1: full = tail + 1 == head).
 * It writes the entry, then slot_ready[slot] = t + 1; the holder of tail_lock
 * publishes every contiguous ready slot with one doorbell write and stamps
 * their slot_time (a command's timeout runs from publication). The CID is
 * the slot in the low cid_shift bits and the lap's low bits above them, so a
 * completion that arrives after its command was expired is recognised: the
 * expiry records TT_LATE_EXPIRED | CID in slot_late[slot], and such a late
 * completion turns it into TT_LATE_ARRIVED | CID (the drive is then done
 * with the command's data). A CID names one command within a window of
 * depth << (16 - cid_shift) tickets; a completion later than that is
 * indistinguishable from a newer command's, here as everywhere in the queue.
 */
struct tt_nvmeq {
    uint8_t* sq;           /* depth x 64-byte submission entries */
    uint8_t* cq;           /* depth x 16-byte completion entries */
    uint32_t* sq_db;       /* SQ tail doorbell */
    uint32_t* cq_db;       /* CQ head doorbell */
    uint64_t* slot_owner;  /* [depth] IOCB index << 43 | IOCTX << 32 | lap, or TT_SLOT_FREE */
    uint64_t* slot_time;   /* [depth] when the entry was published, ns (0: not yet) */
    uint64_t* slot_ready;  /* [depth] ticket + 1 once the entry is written */
    uint32_t* slot_turn;   /* [depth] the lap (low 32 bits) allowed to use the slot */
    uint32_t depth;
    uint32_t qid;
    uint32_t drive;
    uint32_t cid_shift; /* bits of the CID that hold the slot */
    struct tt_qgate* gate; /* shared memory: the host's hold on this queue */
    uint32_t* wake;        /* host lanes: emulated controller's wake word, or NULL */
    uint32_t* slot_late;   /* [depth] TT_LATE_* | CID of the last command expired in the slot */
    uint64_t pad0[3];
    /* submission */
    uint64_t ticket;
    uint64_t hole; /* lowest ticket whose submitter gave up (never published), or ~0 */
    uint64_t pad1[6];
    uint64_t sq_tail; /* published entries (tail-lock holder) */
    uint32_t tail_lock;
    uint32_t dead; /* set when a submitter gave up; the queue takes no more commands */
    uint64_t pad2[6];
    /* completion (head-lock holder) */
    uint64_t cq_head; /* completion entries consumed */
    uint64_t sq_head; /* SQ entries the controller has fetched, from SQHD */
    uint32_t head_lock;
    uint32_t rsvd0;
    uint64_t pad3[5];
    /* statistics */
    uint64_t completed;
    uint64_t errors;
    uint64_t expired;
    uint64_t stale;
    uint64_t sq_doorbells;
    uint64_t cq_doorbells;
    uint64_t pad4[2];
};

/*
 * Staging for a TT_TABLE_STAGED table: `nslots` slots of `slot_bytes` bytes of
 * pinned host memory, page aligned, mapped for every pool drive (the data
 * pointer of slot s as pool drive d sees it is dptr[(d * nslots + s) * 4 ..]:
 * { SGL address or PRP1, SGL descriptor word 1 (length set per command),
 * PRP: the slot's second page, PRP: its list } — SGL when bit d of sgl_drives
 * is set) and for the executor at `base` (slot s at base + s * slot_bytes).
 * Free slot indices sit in the ring `free` (capacity >= nslots): a lane pops
 * one before it builds a command, waits (bounded by the submit deadline) when
 * none is free, and pushes it back once the command has finished and its data
 * was copied.
 *
 * A slot whose command ended without a known outcome (expired, stranded on a
 * dead queue) may still be written by its drive: it is withheld, recorded in
 * held[2 * s] = TT_HELD_VALID | (withhold number, 23 bits) << 40 | ticket (low
 * 40 bits) and held[2 * s + 1] = queue << 48 | CID << 32 | the queue gate's
 * epoch then. It goes back to `free` once the drive can no longer touch it:
 * the queue's epoch moved on (the pair was deleted and created again), or the
 * command's late completion arrived (its queue's slot_late says so, within the
 * CID window). Lanes running this table's IOCBs look for such slots
 * (tt_stage_reclaim) whenever held_now is not 0.
 */
struct tt_staging {
    struct tt_ring* free;  /* executor memory: free slot indices */
    uint8_t* base;         /* executor address of slot 0 */
    const uint64_t* dptr;  /* [pool drives][nslots][4], executor memory */
    uint32_t nslots;
    uint32_t slot_bytes;   /* a multiple of 4096, at least one chunk */
    uint32_t sgl_drives;   /* bit d: pool drive d takes SGL descriptors, else PRPs */
    uint32_t page_shift;   /* PRP page size (the controllers' memory page size) */
    /* executor counters */
    uint64_t waits;           /* times a lane found no free slot */
    uint64_t withheld;        /* times a slot was withheld: its command's outcome unknown */
    uint64_t staged_bytes;    /* bytes copied between slots and KV memory */
    uint64_t* held;           /* [nslots][2], executor memory: what each withheld slot waits for */
    uint64_t held_now;        /* slots withheld now */
    uint64_t reclaimed_reset; /* withheld slots given back after their queue was recreated */
    uint64_t reclaimed_late;  /* ... after their command's late completion */
};

/*
 * Device-resident table that turns (layer, file, block) into commands.
 * Pool of `ndrives` drives, L = `layers`; a file holds 2L objects, object
 * j = 2 * layer + kv (kv 0 = K, 1 = V). Sizes are kept in table units of
 * 2^unit_shift bytes (the smallest LBA size of the pool); pool drive d, whose
 * own LBAs are 2^r units (r = its tt_drive.lba_shift - unit_shift), holds file
 * f's object j, for d = (f + j) mod D, at LBA
 * data_start_lba[d] + ((f * S + j / D) * object_units >> r),
 * S = slots_per_file = ceil(2L / D). An object is `chunks` commands of
 * chunk_units units (the last may be shorter), chunk c starting
 * c * chunk_units >> r LBAs into the object; the host guarantees both sizes
 * are whole LBAs of every pool drive. The data pointer of chunk c of engine
 * block b is entries[((b * L + layer) * 2 + kv) * chunks + c].
 * A TT_TABLE_STAGED table's entries name KV memory instead; see tt_staging.
 */
struct tt_layer_table {
    uint32_t kind; /* TT_TABLE_* */
    uint32_t layers;
    uint32_t ndrives;
    uint32_t chunks;
    uint32_t files;
    uint32_t blocks;
    uint32_t object_units;   /* object size in units of 2^unit_shift bytes */
    uint32_t chunk_units;    /* bytes per command (but the last), same units */
    uint32_t slots_per_file;
    uint32_t unit_shift;     /* log2 of the smallest LBA size of the pool */
    uint64_t* entries; /* [entry_count][2]: SGL descriptor or PRP1, PRP2 */
    uint64_t entry_count;
    uint32_t drive[TT_TABLE_MAX_DRIVES]; /* executor drive index of pool drive d */
    uint64_t data_start_lba[TT_TABLE_MAX_DRIVES];
    struct tt_staging* staging; /* TT_TABLE_STAGED: executor memory; else 0 */
};

/*
 * A (file, block) pair list registered once (GioUring::register_pairs) and
 * referenced by any number of TT_IOCB_LAYER_LIST IOCBs, so a layer costs the
 * host a few header words instead of a copy of every pair. 16 bytes. A slot
 * not in use has pairs = 0 and npairs = 0.
 */
struct tt_pair_list {
    const struct tt_pair* pairs; /* [npairs], executor memory */
    uint64_t npairs;
};

/* Everything one executor works on. */
struct tt_exec_ctx {
    struct tt_ring* sq_ring;        /* shared: IOCB parts to run */
    struct tt_ring* cq_ring;        /* shared: finished IOCB indices */
    struct tt_control* control;     /* shared */
    struct tt_iocb* iocbs;          /* shared: the IOCB pool */
    struct tt_nvmeq* queues;        /* executor */
    struct tt_drive* drives;        /* executor */
    struct tt_layer_table* tables;  /* executor */
    uint32_t niocbs;
    uint32_t nqueues;
    uint32_t ndrives;
    uint32_t ntables;
    uint64_t command_timeout_ns; /* submission to completion */
    uint64_t submit_timeout_ns;  /* waiting for a submission slot */
    uint32_t max_backoff_ns;     /* longest sleep in a poll loop */
    uint32_t idle_sleep_ns;      /* persistent kernel with an empty ring */
    struct tt_pair_list* pair_lists; /* executor: [npair_lists] registered pair lists */
    uint32_t npair_lists;
    uint32_t rsvd0;
};

#if defined(__cplusplus)
static_assert(sizeof(struct tt_ioctx) == 64, "tt_ioctx is 64 bytes");
static_assert(sizeof(struct tt_iocb_hdr) == 128, "tt_iocb_hdr is 128 bytes");
static_assert(sizeof(struct tt_ring) == 192, "tt_ring is 192 bytes");
static_assert(sizeof(struct tt_nvmeq) == 384, "tt_nvmeq is 384 bytes");
static_assert(sizeof(struct tt_qgate) == 64, "tt_qgate is 64 bytes");
static_assert(sizeof(struct tt_pair_list) == 16, "tt_pair_list is 16 bytes");
static_assert(sizeof(struct tt_staging) == 96, "tt_staging is 96 bytes");
static_assert(TT_IOCB_MAX_IOCTX == (1u << TT_IOCTX_INDEX_BITS), "IOCTX index bits");
#endif

#endif /* TUTTI_GIO_H */
