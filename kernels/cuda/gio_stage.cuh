/*
 * gio_stage.cuh — layer IOCBs through a staged table: every command moves its
 * chunk through a pinned host staging slot, and the warp copies each chunk
 * between the slot and KV memory (tutti_gio.h, struct tt_staging).
 *
 * The lanes of a warp each run one IOCTX of a round, as a small state machine
 * the whole warp steps together:
 *
 *   NEED    wants a free slot (pops the ring; waits, bounded by the submit deadline)
 *   COPYIN  (write) has a slot; the warp copies the KV chunk into it
 *   SUBMIT  slot ready: the warp takes tickets and submits (one doorbell per queue)
 *   FLIGHT  submitted: polled (reap, expire, publish) without blocking the warp
 *
 * and when a command finishes the warp copies its slot out to KV memory (read)
 * while the other lanes' commands are still in flight, then gives the slot back,
 * or withholds it when the drive may still move data through it. Every copy is
 * one chunk copied by all 32 lanes (tt_warp_copy: coalesced 128-bit words,
 * several loads in flight per lane). A lane never holds a slot while it waits
 * for another, so a staging pool smaller than the work only slows it down.
 */
#ifndef TUTTI_GIO_STAGE_CUH
#define TUTTI_GIO_STAGE_CUH

#include "gio_build.cuh"
#include "gio_queue.cuh"
#include "gio_ring.cuh"
#include "portable.cuh"

#define TT_ST_IDLE 0u
#define TT_ST_NEED 1u
#define TT_ST_COPYIN 2u
#define TT_ST_SUBMIT 3u
#define TT_ST_FLIGHT 4u

/* The warp's first sleep when nothing moved. Host lanes sleeping less than the runtime's
 * slack (5 us) do not sleep at all, and each pass costs the host a vote (a switch through
 * every lane): there it starts where a sleep is one. */
#if defined(__CUDACC__)
#define TT_STAGE_MIN_SLEEP_NS 32u
#else
#define TT_STAGE_MIN_SLEEP_NS 4096u
#endif

/* How long a lane keeps looking at its command in flight before the warp meets again (and
 * copies out what finished meanwhile). The GPU's votes cost nothing: it looks once per
 * pass. Host lanes are fibers of one thread and a vote switches through all of them, so
 * they wait on their own (as they did before the warp copied together) and meet every
 * 50 us: voting after every look made the host's staged retrieve 2-4x slower than the
 * per-lane copy it replaces (docs/perf/staged-copy.md). */
#if defined(__CUDACC__)
#define TT_STAGE_PASS_NS 0ull
#else
#define TT_STAGE_PASS_NS 50000ull
#endif

/* Whether `now` is before `until` (0: no time at all). */
TT_DEVICE bool tt_before(uint64_t now, uint64_t until) { return until != 0 && now < until; }

/* A write copies at most this many chunks into slots per pass before submitting them,
 * so the warp's first commands reach the drives after a few copies rather than 32. */
#define TT_STAGE_WRITE_BATCH 8u

/* Points `sqe` at staging slot `slot` as pool drive `pd` sees it, for `bytes` bytes. */
TT_DEVICE void tt_stage_dptr(const struct tt_staging* sg, uint32_t pd, uint32_t slot, uint64_t bytes,
                             struct tt_sqe* sqe) {
    const uint64_t* w = &sg->dptr[((uint64_t)pd * sg->nslots + slot) * 4u];
    if ((sg->sgl_drives >> pd) & 1u) {
        /* SGL Data Block (§4.4): address, then length in bits 31:0 of word 1. */
        sqe->w[0] |= (uint64_t)1u << 14;
        sqe->w[3] = w[0];
        sqe->w[4] = (w[1] & ~0xFFFFFFFFull) | (uint32_t)bytes;
    } else {
        /* §4.3: PRP2 is the second page when the transfer ends there, else the list. */
        const uint64_t pages = (bytes + ((uint64_t)1 << sg->page_shift) - 1u) >> sg->page_shift;
        sqe->w[0] &= ~((uint64_t)3u << 14);
        sqe->w[3] = w[0];
        sqe->w[4] = pages <= 1u ? 0 : (pages == 2u ? w[2] : w[3]);
    }
}

TT_DEVICE uint8_t* tt_stage_slot(const struct tt_staging* sg, uint32_t slot) {
    return sg->base + (uint64_t)slot * sg->slot_bytes;
}

/* Whether a staging slot may be handed out again after its command ended with
 * `status`: not when the drive may still move data through it. */
TT_DEVICE bool tt_stage_reusable(uint32_t status) {
    const uint32_t kind = status >> TT_STATUS_KIND_SHIFT;
    return status != TT_STATUS_PENDING && kind != TT_KIND_TIMEOUT && kind != TT_KIND_QUEUE_DEAD;
}

/* Withholds `slot`: its command (ticket `ticket` on queue `qidx`) ended without a known
 * outcome. Call before the lane leaves the queue (tt_queue_leave): the queue cannot be
 * recovered before that, so the epoch read here is the one the command was submitted in. */
TT_DEVICE void tt_stage_hold(const struct tt_exec_ctx* ctx, struct tt_staging* sg, uint32_t slot, uint32_t qidx,
                             uint64_t ticket) {
    const uint64_t no = tt_atomic_add_u64(&sg->withheld, 1);
    if (qidx >= ctx->nqueues || qidx > 0xFFFFu) return; /* no queue to wait on: withheld for good */
    const struct tt_nvmeq* q = &ctx->queues[qidx];
    const uint32_t cid = tt_cid(q, (uint32_t)(ticket % q->depth), (uint32_t)(ticket / q->depth));
    const uint32_t epoch = tt_ld_acquire_u32(&q->gate->epoch);
    tt_st_relaxed_u64(&sg->held[2u * slot + 1u], ((uint64_t)qidx << 48) | ((uint64_t)cid << 32) | epoch);
    tt_st_release_u64(&sg->held[2u * slot], TT_HELD_VALID | ((no & 0x7FFFFFull) << TT_HELD_TICKET_BITS) |
                                                (ticket & ((1ull << TT_HELD_TICKET_BITS) - 1u)));
    tt_atomic_add_u64(&sg->held_now, 1);
}

/* Gives `slot` back after its command ended with `status`, or withholds it. */
TT_DEVICE void tt_stage_release(const struct tt_exec_ctx* ctx, struct tt_staging* sg, uint32_t slot,
                                uint32_t status, uint32_t qidx, uint64_t ticket) {
    if (!tt_stage_reusable(status))
        tt_stage_hold(ctx, sg, slot, qidx, ticket);
    else if (!tt_ring_push(sg->free, slot))
        tt_atomic_add_u64(&sg->withheld, 1); /* a full ring cannot happen (capacity >= nslots): counted */
}

/* Hands back every withheld slot the drives can no longer touch: its queue was deleted and
 * created again since (the gate's epoch moved on), or its command's late completion has
 * arrived (the queue's slot_late, within the CID window; a command more than a window of
 * tickets old waits for the queue's recovery instead). Costs one load while nothing is
 * withheld. Only lanes running an IOCB of this table call it, so the staging is alive. */
TT_NOINLINE void tt_stage_scan(const struct tt_exec_ctx* ctx, struct tt_staging* sg);
TT_DEVICE void tt_stage_reclaim(const struct tt_exec_ctx* ctx, struct tt_staging* sg) {
    if (tt_ld_relaxed_u64(&sg->held_now) != 0) tt_stage_scan(ctx, sg);
}
TT_NOINLINE void tt_stage_scan(const struct tt_exec_ctx* ctx, struct tt_staging* sg) {
    const uint64_t tmask = (1ull << TT_HELD_TICKET_BITS) - 1u;
    for (uint32_t s = 0; s < sg->nslots; s++) {
        uint64_t* h = &sg->held[2u * s];
        const uint64_t w0 = tt_ld_acquire_u64(h);
        if (!(w0 & TT_HELD_VALID)) continue;
        const uint64_t w1 = tt_ld_relaxed_u64(h + 1);
        const uint32_t qidx = (uint32_t)(w1 >> 48);
        const uint32_t cid = (uint32_t)(w1 >> 32) & 0xFFFFu;
        if (qidx >= ctx->nqueues) continue;
        struct tt_nvmeq* q = &ctx->queues[qidx];
        const bool reset = tt_ld_acquire_u32(&q->gate->epoch) != (uint32_t)w1;
        bool late = false;
        if (!reset) {
            const uint32_t qslot = cid & ((1u << tt_min_u32(q->cid_shift, 16u)) - 1u);
            const uint64_t window = (uint64_t)q->depth << (16u - tt_min_u32(q->cid_shift, 16u));
            const uint64_t since = (tt_ld_relaxed_u64(&q->ticket) - (w0 & tmask)) & tmask;
            late = qslot < q->depth && since < window &&
                   tt_ld_relaxed_u32(&q->slot_late[qslot]) == (TT_LATE_ARRIVED | cid);
        }
        if (!reset && !late) continue;
        /* One reclaimer per hold: the hold number in w0 makes a later hold of the slot differ. */
        if (tt_atomic_cas_u64(h, w0, 0) != w0) continue;
        if (!tt_ring_push(sg->free, s)) {
            tt_st_release_u64(h, w0); /* cannot happen (capacity >= nslots); looked at again later */
            continue;
        }
        tt_atomic_add_u64(&sg->held_now, 0xFFFFFFFFFFFFFFFFull);
        tt_atomic_add_u64(reset ? &sg->reclaimed_reset : &sg->reclaimed_late, 1);
    }
}

/* The warp copies, for each lane in `lanes`, that lane's chunk (`bytes` bytes) between its
 * staging slot `slot` and `kv`: into the slot when `to_slot` (a write), else out of it.
 * Then every lane fences its part for the system and the warp meets, so the owner may ring
 * a doorbell (the slot's bytes are visible first) or give the slot back (every lane is done
 * reading it). Every lane of the warp calls it with its own arguments. */
TT_NOINLINE void tt_stage_copy(const struct tt_staging* sg, uint32_t lanes, uint32_t slot, uint8_t* kv,
                               uint64_t bytes, bool to_slot) {
    /* Slot and length in one word: bytes < 2^32 (nlb <= 65536 blocks of <= 4 KiB). */
    const struct tt_warp_view whats = tt_warp_gather(((uint64_t)slot << 32) | (uint32_t)bytes);
    const struct tt_warp_view kvs = tt_warp_gather((uint64_t)kv);
    for (uint32_t m = lanes; m; m &= m - 1u) {
        const uint32_t owner = tt_ffs(m) - 1u;
        const uint64_t what = whats.at(owner);
        uint8_t* k = (uint8_t*)kvs.at(owner);
        uint8_t* mem = tt_stage_slot(sg, (uint32_t)(what >> 32));
        if (to_slot)
            tt_warp_copy(mem, k, (uint32_t)what);
        else
            tt_warp_copy(k, mem, (uint32_t)what);
    }
    tt_fence_system();
    tt_warp_sync();
}

/* The lane states and events one vote of the warp carries (tt_warp_vote). */
#define TT_VOTE_NEED 0u     /* wants a slot */
#define TT_VOTE_COPYIN 1u   /* has a slot to copy its chunk into (a write) */
#define TT_VOTE_SUBMIT 2u   /* ready to submit (a copied-in write, or a read with a slot) */
#define TT_VOTE_DONE 3u     /* its command finished at this look */
#define TT_VOTE_OUT 4u      /* ... a read that succeeded: its slot is copied out */
#define TT_VOTE_BUSY 5u     /* anything left to do */
#define TT_VOTES 6u

/*
 * A part of a layer IOCB through a staged table (see the top of this file). Each pass of
 * the warp: lanes take slots and poll their commands on their own, then one vote tells
 * every lane what the warp does next: copy finished reads out and give their slots back,
 * copy new writes in, submit. Lanes whose IOCTX cannot be built, or that find no slot
 * before the submit deadline, finish it with the status that says why; every lane stays in
 * the loop until its whole warp is done (the steps are warp collectives).
 */
TT_NOINLINE void tt_process_staged(const struct tt_exec_ctx* ctx, uint32_t b, const struct tt_layer_req* req,
                                   uint32_t part, uint32_t nparts, uint32_t count) {
    struct tt_iocb* iocb = &ctx->iocbs[b];
    struct tt_staging* sg = req->tb->staging;
    const bool read = req->opcode == TT_OPC_READ;
    const uint32_t tid = tt_thread_idx();
    const uint32_t below = (1u << tt_lane_id()) - 1u;
    const uint32_t bdim = tt_block_dim();
    const uint32_t stride = nparts * bdim;
    if (sg && tid == 0) tt_stage_reclaim(ctx, sg);
    for (uint32_t base = part * bdim;; base += stride) {
        const uint32_t i = base + tid;
        const bool have = i < count;
        if (!tt_warp_any(have)) break;
        uint32_t queue = 0, pd = 0;
        uint32_t state = TT_ST_IDLE;
        /* What the command is, kept small (the SQE is made again at submission): its
         * namespace, starting LBA and CDW12. */
        uint32_t nsid = 0, cdw12 = 0;
        uint64_t slba = 0;
        const uint32_t ref = tt_ioctx_ref(b, have ? i : 0);
        struct tt_ioctx* io = &iocb->ioctx[have ? i : 0];
        if (have) {
            struct tt_sqe built;
            uint32_t st = sg ? tt_build_layer(ctx, req, b, i, io, &built, &queue, &pd) : tt_xlate(TT_XLATE_TABLE);
            if (st == TT_STATUS_SUCCESS && tt_ld_relaxed_u32(&ctx->queues[queue].dead))
                st = TT_STATUS(TT_KIND_QUEUE_DEAD, queue);
            if (st == TT_STATUS_SUCCESS) {
                state = TT_ST_NEED;
                nsid = (uint32_t)(built.w[0] >> 32);
                slba = built.w[5];
                cdw12 = (uint32_t)built.w[6];
            } else {
                tt_finish_ioctx(ctx, ref, st, 0);
            }
        }
        /* Staged entries are { KV address, length } (tt_build_layer checked the length). */
        uint8_t* kv = (uint8_t*)tt_ld_relaxed_u64(&io->dptr[0]);
        const uint64_t bytes = tt_ld_relaxed_u64(&io->dptr[1]);
        const uint64_t deadline = tt_now_ns() + ctx->submit_timeout_ns;
        uint32_t slot = 0;
        uint32_t sleep = TT_STAGE_MIN_SLEEP_NS, lane_sleep = 32;
        bool waited = false;
        /* Lanes that wanted a slot at the last vote; before the first, every lane counts (a
         * write's first batch is then lanes 0 .. TT_STAGE_WRITE_BATCH - 1 of those that want one). */
        uint32_t needing = 0xFFFFFFFFu;
        struct tt_waiter w;
        for (;;) {
            /* Slots: a write takes a batch at a time (see TT_STAGE_WRITE_BATCH). */
            if (state == TT_ST_NEED && (read || tt_popc(needing & below) < TT_STAGE_WRITE_BATCH)) {
                uint64_t v = 0;
                if (tt_ring_pop(sg->free, &v) && v < sg->nslots) {
                    slot = (uint32_t)v;
                    state = read ? TT_ST_SUBMIT : TT_ST_COPYIN;
                } else if (tt_now_ns() > deadline) {
                    tt_finish_ioctx(ctx, ref, TT_STATUS(TT_KIND_TIMEOUT, TT_TIMEOUT_STAGING), 0);
                    state = TT_ST_IDLE;
                } else if (!waited) {
                    waited = true;
                    tt_atomic_add_u64(&sg->waits, 1);
                    /* Out of slots: perhaps some withheld ones may come back now. */
                    tt_stage_reclaim(ctx, sg);
                }
            }
            /* Commands in flight: each lane looks at its own until it finishes or the pass is
             * over (TT_STAGE_PASS_NS: on the GPU one look), backing off on its own meanwhile;
             * one look only while other lanes of the warp wait for slots. */
            bool finished = false;
            uint32_t status = TT_STATUS_PENDING;
            if (state == TT_ST_FLIGHT) {
                const uint64_t until = TT_STAGE_PASS_NS && !needing ? tt_now_ns() + TT_STAGE_PASS_NS : 0u;
                for (;;) {
                    bool reaped = false;
                    if (tt_wait_poll(ctx, b, i, &w, &reaped)) {
                        finished = true;
                        status = tt_ld_acquire_u32(&io->status);
                        break;
                    }
                    if (!tt_before(w.now, until)) break;
                    if (!reaped) tt_backoff(&lane_sleep, ctx->max_backoff_ns);
                }
            }
            const bool out = finished && read && status == TT_STATUS_SUCCESS;
            uint32_t votes[TT_VOTES];
            tt_warp_vote(((uint32_t)(state == TT_ST_NEED) << TT_VOTE_NEED) |
                             ((uint32_t)(state == TT_ST_COPYIN) << TT_VOTE_COPYIN) |
                             ((uint32_t)(state == TT_ST_COPYIN || state == TT_ST_SUBMIT) << TT_VOTE_SUBMIT) |
                             ((uint32_t)finished << TT_VOTE_DONE) | ((uint32_t)out << TT_VOTE_OUT) |
                             ((uint32_t)(state != TT_ST_IDLE) << TT_VOTE_BUSY),
                         votes, TT_VOTES);
            if (!votes[TT_VOTE_BUSY]) break;
            needing = votes[TT_VOTE_NEED];
            /* Finished: a successful read's slot is copied out (the acquire of its status above,
             * then a system fence: read after the drive's data), then every slot goes back. */
            if (votes[TT_VOTE_DONE]) {
                tt_fence_system();
                if (votes[TT_VOTE_OUT]) tt_stage_copy(sg, votes[TT_VOTE_OUT], slot, kv, bytes, false);
                if (out) tt_atomic_add_u64(&sg->staged_bytes, bytes);
                if (finished) {
                    tt_stage_release(ctx, sg, slot, status, w.qidx, w.ticket);
                    tt_queue_leave(ctx, w.qidx);
                    state = TT_ST_IDLE;
                }
            }
            /* Write: the warp copies every new slot's chunk in before any of them is submitted. */
            if (votes[TT_VOTE_COPYIN]) {
                tt_stage_copy(sg, votes[TT_VOTE_COPYIN], slot, kv, bytes, true);
                if (state == TT_ST_COPYIN) {
                    tt_atomic_add_u64(&sg->staged_bytes, bytes);
                    state = TT_ST_SUBMIT;
                }
            }
            /* Submit: one ticket atomic and one doorbell per queue for the warp. */
            if (votes[TT_VOTE_SUBMIT]) {
                int32_t target = -1;
                struct tt_sqe sqe;
                if (state == TT_ST_SUBMIT) {
                    tt_sqe_rw(&sqe, req->opcode, false, nsid, 0, 0, slba, (cdw12 & 0xFFFFu) + 1u, cdw12 >> 16);
                    tt_stage_dptr(sg, pd, slot, bytes, &sqe);
                    target = (int32_t)queue;
                }
                uint64_t ticket = 0;
                if (!tt_warp_enter(ctx, target, &ticket) && target >= 0) {
                    tt_finish_ioctx(ctx, ref, TT_STATUS(TT_KIND_QUEUE_RECOVERING, queue), 0);
                    tt_stage_release(ctx, sg, slot, TT_STATUS_SUCCESS, 0, 0);
                    target = -1;
                    state = TT_ST_IDLE;
                }
                int32_t written = -1;
                if (target >= 0) {
                    const uint32_t st = tt_sq_submit(ctx, queue, ticket, &sqe, ref, io, false);
                    if (st != TT_STATUS_PENDING) {
                        /* Never published: the drive never saw the slot. */
                        tt_finish_ioctx(ctx, ref, st, 0);
                        tt_queue_leave(ctx, queue);
                        tt_stage_release(ctx, sg, slot, TT_STATUS_SUCCESS, 0, 0);
                        state = TT_ST_IDLE;
                    } else {
                        tt_wait_begin(ctx, b, i, &w);
                        lane_sleep = 32;
                        written = target;
                        state = TT_ST_FLIGHT;
                    }
                }
                /* An entry this misses is published by its own lane's polls. */
                tt_warp_publish(ctx, written);
            }
            /* Nothing moved: the warp backs off together. */
            if (votes[TT_VOTE_DONE] | votes[TT_VOTE_SUBMIT])
                sleep = TT_STAGE_MIN_SLEEP_NS;
            else
                tt_backoff(&sleep, ctx->max_backoff_ns);
        }
    }
    if (sg && tid == 0) tt_stage_reclaim(ctx, sg);
}

#endif /* TUTTI_GIO_STAGE_CUH */
