/*
 * gio_iocb.cuh — running one part of an IOCB.
 *
 * An IOCB is split into `nparts` parts run by different blocks: part p takes
 * IOCTXs in runs of blockDim, every nparts-th run. A lane builds the command
 * for its IOCTX (gio_build.cuh), takes a ticket (tt_warp_enter), submits, and
 * after its last submission waits for each of its IOCTXs to finish; a staged
 * layer IOCB runs its own loop (gio_stage.cuh). The last part to finish posts
 * the IOCB's completion.
 */
#ifndef TUTTI_GIO_IOCB_CUH
#define TUTTI_GIO_IOCB_CUH

#include "gio_build.cuh"
#include "gio_queue.cuh"
#include "gio_ring.cuh"
#include "gio_stage.cuh"
#include "portable.cuh"

/* Marks the IOCB done and hands its index to the host. */
TT_DEVICE void tt_post_iocb(const struct tt_exec_ctx* ctx, uint32_t b) {
    struct tt_iocb_hdr* h = &ctx->iocbs[b].hdr;
    tt_st_relaxed_u64(&h->done_ns, tt_now_ns());
    tt_st_release_u32(&h->done_seq, tt_ld_relaxed_u32(&h->seq));
    if (tt_ring_push(ctx->cq_ring, b)) {
        tt_ring_wake(ctx->cq_ring);
        tt_atomic_add_u64(&ctx->control->iocbs_done, 1);
    } else
        tt_atomic_add_u64(&ctx->control->lost_posts, 1);
}

/* Runs part `part` of `nparts` of IOCB `b` with every thread of the block. */
TT_NOINLINE void tt_process_part(const struct tt_exec_ctx* ctx, uint32_t b, uint32_t part, uint32_t nparts) {
    struct tt_iocb* iocb = &ctx->iocbs[b];
    const uint32_t count = tt_min_u32(tt_ld_relaxed_u32(&iocb->hdr.count), TT_IOCB_MAX_IOCTX);
    const uint32_t kind = tt_ld_relaxed_u32(&iocb->hdr.kind);
    const bool layer = kind == TT_IOCB_LAYER || kind == TT_IOCB_LAYER_LIST;
    struct tt_layer_req req;
    tt_layer_pairs(ctx, iocb, kind, &req);
    req.table = tt_ld_relaxed_u32(&iocb->hdr.table);
    req.layer = tt_ld_relaxed_u32(&iocb->hdr.layer);
    req.opcode = tt_ld_relaxed_u8(&iocb->hdr.opcode);
    req.tb = (req.table < ctx->ntables && ctx->tables[req.table].kind != TT_TABLE_UNUSED) ? &ctx->tables[req.table]
                                                                                          : 0;
    const uint32_t tid = tt_thread_idx();
    const uint32_t bdim = tt_block_dim();
    const uint32_t stride = nparts * bdim;
    if (tid == 0) tt_atomic_cas_u64(&iocb->hdr.start_ns, 0, tt_now_ns());
    /* A staged table runs its own loop; the loops below then have nothing to do. */
    const bool staged = layer && req.tb && req.tb->kind == TT_TABLE_STAGED;
    if (staged) tt_process_staged(ctx, b, &req, part, nparts, count);
    const uint32_t direct = staged ? 0u : count;

    /* Bit r: the IOCTX of this lane's round r was admitted to its queue
     * (tt_warp_enter) and must leave it once finished. count <= 2048 and
     * stride >= 32, so there are at most 64 rounds. */
    uint64_t admitted = 0;
    uint32_t round = 0;
    /* Every lane of a warp stays in this loop until no lane of the warp has work:
     * the ticket reservation is a warp collective. */
    for (uint32_t base = part * bdim;; base += stride, round++) {
        const uint32_t i = base + tid;
        const bool have = i < direct;
        if (!tt_warp_any(have)) break;
        struct tt_sqe sqe;
        uint32_t queue = 0;
        int32_t target = -1;
        const uint32_t ref = tt_ioctx_ref(b, have ? i : 0);
        if (have) {
            struct tt_ioctx* io = &iocb->ioctx[i];
            uint32_t pd = 0;
            uint32_t st = layer ? tt_build_layer(ctx, &req, b, i, io, &sqe, &queue, &pd)
                                : tt_build_explicit(ctx, b, i, io, &sqe, &queue);
            if (st == TT_STATUS_SUCCESS && tt_ld_relaxed_u32(&ctx->queues[queue].dead))
                st = TT_STATUS(TT_KIND_QUEUE_DEAD, queue);
            if (st == TT_STATUS_SUCCESS)
                target = (int32_t)queue;
            else
                tt_finish_ioctx(ctx, ref, st, 0);
        }
        uint64_t ticket = 0;
        if (!tt_warp_enter(ctx, target, &ticket) && target >= 0) {
            tt_finish_ioctx(ctx, ref, TT_STATUS(TT_KIND_QUEUE_RECOVERING, queue), 0);
            target = -1;
        }
        int32_t written = -1;
        if (target >= 0) {
            const uint32_t st = tt_sq_submit(ctx, queue, ticket, &sqe, ref, &iocb->ioctx[i], false);
            if (st != TT_STATUS_PENDING) {
                tt_finish_ioctx(ctx, ref, st, 0);
                tt_queue_leave(ctx, queue);
            } else {
                written = target;
                if (round < 64u) admitted |= 1ull << round;
            }
        }
        /* One doorbell per queue for the warp's entries (the lane's entry stays
         * admitted, so the queue cannot be recovered under it meanwhile). */
        tt_warp_publish(ctx, written);
    }

    round = 0;
    for (uint32_t base = part * bdim; base < direct; base += stride, round++) {
        if (base + tid < direct) {
            tt_wait_ioctx(ctx, b, base + tid);
            /* tt_sq_submit recorded the queue of every IOCTX it submitted. */
            if (round < 64u && ((admitted >> round) & 1u))
                tt_queue_leave(ctx, tt_ld_relaxed_u32(&iocb->ioctx[base + tid].queue));
        }
    }

    tt_syncthreads();
    if (tid == 0) {
        tt_atomic_add_u64(&ctx->control->parts_done, 1);
        /* Release: the statuses this part's lanes observed (acquire loads, then the barrier)
         * are ordered before the decrement; atomics alone are relaxed on the GPU. */
        tt_fence_system();
        if (tt_atomic_add_u32(&iocb->hdr.parts_left, 0xFFFFFFFFu) == 1u) {
            /* Acquire: the last part sees every other part's statuses before it posts. */
            tt_fence_system();
            tt_post_iocb(ctx, b);
        }
    }
}

#endif /* TUTTI_GIO_IOCB_CUH */
