/*
 * gio.cu — the I/O executor's kernels.
 *
 *   tt_gio_issue       launch mode: each block takes IOCB parts from the
 *                      submission ring until it is empty, then returns.
 *   tt_gio_persistent  SQPOLL mode: the same, but an empty ring is polled
 *                      until the host sets control->stop; blocks at or above
 *                      control->active_blocks (when non-zero) take no work.
 *   tt_gio_wait        waits (on the engine's stream) until IOCBs have
 *                      completed a given issue, or a timeout passes;
 *                      adds the number completed to *done.
 *   tt_gio_copy        the staged path's warp copy alone, for its benchmark
 *                      (tutti bench staged): n chunks of `bytes`, chunk c
 *                      from pairs[2c] to pairs[2c + 1].
 *
 * Blocks must be a multiple of 32 threads. On the GPU the grid must be
 * co-resident (sized from the occupancy of the SM partition): blocks wait on
 * each other's progress through the NVMe queues. A persistent grid also
 * leaves room in its partition for a block of tt_gio_wait, which would
 * otherwise never become resident.
 */
#include "gio_iocb.cuh"
#include "gio_queue.cuh"
#include "gio_ring.cuh"
#include "portable.cuh"

struct tt_block_shared {
    uint64_t entry;
    uint32_t what;
    uint32_t pad;
};

/* Largest block the issue kernels are built for (the GPU executor launches this size). */
#define TT_GIO_BLOCK_THREADS 512

/* Longest a host lane of an idle persistent kernel blocks before it looks again. */
#define TT_IDLE_PARK_NS 10000000ull

#define TT_RUN_EXIT 0u
#define TT_RUN_WORK 1u
#define TT_RUN_IDLE 2u

TT_DEVICE void tt_gio_run(const struct tt_exec_ctx* ctx, bool persistent) {
    TT_SHARED(struct tt_block_shared, sh);
    const uint32_t tid = tt_thread_idx();
    uint32_t idle = 256;
    if (persistent && tid == 0) tt_atomic_add_u32(&ctx->control->running, 1);
    for (;;) {
        if (tid == 0) {
            uint64_t v = 0;
            /* The host's SM budget in persistent mode: blocks at or above it idle (but still stop). */
            const uint32_t active = persistent ? tt_ld_relaxed_u32(&ctx->control->active_blocks) : 0u;
            const bool benched = active != 0u && tt_block_idx() >= active;
            if (!benched && tt_ring_pop(ctx->sq_ring, &v)) {
                sh.what = TT_RUN_WORK;
                sh.entry = v;
            } else {
                sh.what = (persistent && !tt_ld_acquire_u32(&ctx->control->stop)) ? TT_RUN_IDLE : TT_RUN_EXIT;
            }
        }
        tt_syncthreads();
        const uint32_t what = sh.what;
        const uint64_t entry = sh.entry;
        tt_syncthreads();
        if (what == TT_RUN_EXIT) break;
        if (what == TT_RUN_IDLE) {
            /* Host lanes block here until the host pushes work (or stops them: it wakes
             * the ring then too); the timeout bounds how long a missed wake-up costs. */
            tt_ring_idle(ctx->sq_ring, &idle, ctx->idle_sleep_ns, TT_IDLE_PARK_NS);
            continue;
        }
        idle = 256;
        const uint32_t b = (uint32_t)entry;
        const uint32_t part = (uint32_t)(entry >> 32) & 0xFFFFu;
        const uint32_t nparts = (uint32_t)(entry >> 48);
        if (b >= ctx->niocbs || nparts == 0 || part >= nparts) continue;
        tt_process_part(ctx, b, part, nparts);
    }
    if (persistent && tid == 0) tt_atomic_add_u32(&ctx->control->running, 0xFFFFFFFFu);
}

/* 2 x 512 threads per SM: one IOCB of 2048 IOCTXs fills an SM pair with one thread per IOCTX. */
TT_KERNEL void TT_LAUNCH_BOUNDS(TT_GIO_BLOCK_THREADS, 2) tt_gio_issue(const struct tt_exec_ctx* ctx) {
    tt_gio_run(ctx, false);
}

TT_KERNEL void TT_LAUNCH_BOUNDS(TT_GIO_BLOCK_THREADS, 2) tt_gio_persistent(const struct tt_exec_ctx* ctx) {
    tt_gio_run(ctx, true);
}

TT_KERNEL void tt_gio_wait(const struct tt_exec_ctx* ctx, const uint32_t* ids, const uint32_t* seqs, uint32_t n,
                           uint64_t timeout_ns, uint32_t* done) {
    const uint64_t deadline = tt_now_ns() + timeout_ns;
    const uint32_t stride = tt_grid_dim() * tt_block_dim();
    for (uint32_t k = tt_block_idx() * tt_block_dim() + tt_thread_idx(); k < n; k += stride) {
        if (ids[k] >= ctx->niocbs) continue;
        const uint32_t* done_seq = &ctx->iocbs[ids[k]].hdr.done_seq;
        uint32_t sleep = 64;
        for (;;) {
            /* Sequence numbers wrap; "at or after this issue" is a signed difference. */
            if ((int32_t)(tt_ld_acquire_u32(done_seq) - seqs[k]) >= 0) {
                tt_atomic_add_u32(done, 1);
                break;
            }
            if (tt_now_ns() > deadline) break;
            tt_backoff(&sleep, ctx->max_backoff_ns);
        }
    }
}

/* Warp w of the grid copies chunks w, w + warps, ...: each chunk by one warp, as the staged
 * loop copies it (tt_warp_copy), with nothing else around it. */
TT_KERNEL void TT_LAUNCH_BOUNDS(TT_GIO_BLOCK_THREADS, 2)
    tt_gio_copy(const uint64_t* pairs, uint32_t n, uint64_t bytes) {
    const uint32_t per_block = tt_block_dim() / TT_WARP_SIZE;
    const uint32_t warps = tt_grid_dim() * per_block;
    for (uint32_t c = tt_block_idx() * per_block + tt_thread_idx() / TT_WARP_SIZE; c < n; c += warps)
        tt_warp_copy((uint8_t*)pairs[2u * c + 1u], (const uint8_t*)pairs[2u * c], bytes);
}
