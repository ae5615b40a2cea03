/*
 * gio_queue.cuh — many executor threads driving one NVMe queue pair.
 *
 * Submission (see struct tt_nvmeq in tutti_gio.h):
 *   1. tickets: a warp takes one ticket per lane with a single atomic add per
 *      queue it targets, once the queue's gate admits it (tt_warp_enter);
 *   2. ordered laps: ticket t owns slot t % depth on lap t / depth and waits
 *      until slot_turn says the previous lap's command finished (its CID is
 *      free) and the last SQHD says the SQ has room;
 *   3. the lane writes the 64-byte entry, marks the slot ready, and whoever
 *      holds the tail lock publishes every contiguous ready slot with one
 *      doorbell write (tt_sq_publish).
 * Completion: whoever holds the head lock consumes every completion entry
 * whose phase tag matches (§4.6), matches it to its slot by CID — never by
 * position, completions arrive in any order — finishes the IOCTX, frees the
 * slot for the next lap, learns SQHD, and writes the CQ head doorbell once per
 * batch. Every wait has a deadline: a command with no completion
 * command_timeout_ns after it was published is expired (TT_TIMEOUT_COMPLETION)
 * and its slot reused under a new CID generation — only right after the CQ
 * was drained under the head lock, so a posted completion is never mistaken
 * for a lost one. A submitter that cannot get its slot within
 * submit_timeout_ns marks the queue dead and records its ticket as the hole
 * no doorbell can pass; commands behind the hole fail with TT_KIND_QUEUE_DEAD.
 */
#ifndef TUTTI_GIO_QUEUE_CUH
#define TUTTI_GIO_QUEUE_CUH

#include "portable.cuh"

struct tt_sqe {
    uint64_t w[8];
};

TT_DEVICE uint32_t tt_ioctx_ref(uint32_t iocb, uint32_t index) { return (iocb << TT_IOCTX_INDEX_BITS) | index; }

/* Records the final status of an IOCTX. The status store comes last: once it
 * is visible, the part waiting for this IOCTX may complete the IOCB, after
 * which the host may reuse it. */
TT_DEVICE void tt_finish_ioctx(const struct tt_exec_ctx* ctx, uint32_t ref, uint32_t status, uint64_t latency_ns) {
    const uint32_t b = ref >> TT_IOCTX_INDEX_BITS;
    const uint32_t i = ref & (TT_IOCB_MAX_IOCTX - 1u);
    if (b >= ctx->niocbs) return;
    struct tt_iocb* iocb = &ctx->iocbs[b];
    if (status != TT_STATUS_SUCCESS) {
        tt_atomic_add_u32(&iocb->hdr.failed, 1);
        tt_atomic_cas_u64(&iocb->hdr.first_error, TT_NO_ERROR, ((uint64_t)i << 32) | status);
    }
    tt_atomic_add_u32(&iocb->hdr.completed, 1);
    tt_st_relaxed_u32(&iocb->ioctx[i].latency_us, (uint32_t)tt_min_u64(latency_ns / 1000u, 0xFFFFFFFFull));
    tt_st_release_u32(&iocb->ioctx[i].status, status);
}

/* The CID carries the slot in its low cid_shift bits and the lap's low bits above. */
TT_DEVICE uint32_t tt_cid_gen_mask(const struct tt_nvmeq* q) {
    return q->cid_shift >= 16u ? 0u : (1u << (16u - q->cid_shift)) - 1u;
}
TT_DEVICE uint32_t tt_cid(const struct tt_nvmeq* q, uint32_t slot, uint32_t lap) {
    return slot | ((lap & tt_cid_gen_mask(q)) << q->cid_shift);
}

/* Learns how far the controller has fetched from an SQHD value (§4.6 DW2). */
TT_DEVICE void tt_sq_head_advance(struct tt_nvmeq* q, uint32_t sqhd) {
    const uint32_t depth = q->depth;
    if (sqhd >= depth) return;
    const uint64_t head = tt_ld_relaxed_u64(&q->sq_head);
    const uint64_t tail = tt_ld_acquire_u64(&q->sq_tail);
    const uint64_t delta = (uint64_t)((sqhd + depth - (uint32_t)(head % depth)) % depth);
    /* The controller cannot fetch past the published tail; a larger step is an older SQHD. */
    if (delta != 0 && delta <= tail - head) tt_st_release_u64(&q->sq_head, head + delta);
}

/* True if a command published at `t0` is past the command timeout at `now`.
 * t0 = 0: not published yet — the controller has not seen it, so it cannot be late. */
TT_DEVICE bool tt_slot_overdue(const struct tt_exec_ctx* ctx, uint64_t t0, uint64_t now) {
    return t0 != 0 && t0 <= now && now - t0 >= ctx->command_timeout_ns;
}

/* Frees `slot` and finishes its IOCTX as timed out, if it still holds `expect`
 * (or, with expect == TT_SLOT_FREE, whatever command it holds) and that command
 * was published longer than the command timeout ago, or `force`. True if this
 * call expired it. A forced slot is safe to reuse: the next lap cannot write
 * it before SQHD shows the controller fetched it. */
TT_DEVICE bool tt_slot_expire(const struct tt_exec_ctx* ctx, struct tt_nvmeq* q, uint32_t slot, uint64_t expect,
                              uint64_t now, bool force = false) {
    uint64_t owner = expect;
    if (owner == TT_SLOT_FREE) {
        owner = tt_ld_acquire_u64(&q->slot_owner[slot]);
        if (owner == TT_SLOT_FREE) return false;
    }
    const uint64_t t0 = tt_ld_relaxed_u64(&q->slot_time[slot]);
    if (!force && !tt_slot_overdue(ctx, t0, now)) return false;
    if (tt_atomic_cas_u64(&q->slot_owner[slot], owner, TT_SLOT_FREE) != owner) return false;
    const uint64_t waited = (t0 && now > t0) ? now - t0 : 0;
    /* Before the status (its store releases this): whoever learns of the timeout from it
     * finds the expiry recorded, and a completion arriving later can say so (tt_cq_complete). */
    tt_atomic_exch_u32(&q->slot_late[slot], TT_LATE_EXPIRED | tt_cid(q, slot, (uint32_t)owner));
    tt_finish_ioctx(ctx, (uint32_t)(owner >> 32), TT_STATUS(TT_KIND_TIMEOUT, TT_TIMEOUT_COMPLETION), waited);
    tt_st_release_u32(&q->slot_turn[slot], (uint32_t)owner + 1u);
    tt_atomic_add_u64(&q->expired, 1);
    return true;
}

/* One completion entry, already known to be valid (phase matched). */
TT_DEVICE void tt_cq_complete(const struct tt_exec_ctx* ctx, struct tt_nvmeq* q, uint32_t dw3, uint64_t now) {
    const uint32_t cid = dw3 & 0xFFFFu;
    const uint32_t slot = cid & ((1u << q->cid_shift) - 1u);
    const uint32_t gen = q->cid_shift >= 16u ? 0u : cid >> q->cid_shift;
    if (slot >= q->depth) {
        tt_atomic_add_u64(&q->stale, 1);
        return;
    }
    const uint64_t owner = tt_ld_acquire_u64(&q->slot_owner[slot]);
    /* A completion for a command we already expired carries an older generation. */
    if (owner == TT_SLOT_FREE || ((uint32_t)owner & tt_cid_gen_mask(q)) != gen ||
        tt_atomic_cas_u64(&q->slot_owner[slot], owner, TT_SLOT_FREE) != owner) {
        tt_atomic_add_u64(&q->stale, 1);
        /* The command expired in this slot has completed after all: the drive is done with
         * its data (a staging slot withheld for it may come back, gio_stage.cuh). */
        tt_atomic_cas_u32(&q->slot_late[slot], TT_LATE_EXPIRED | cid, TT_LATE_ARRIVED | cid);
        return;
    }
    const uint32_t field = (dw3 >> 17) & 0x7FFFu;
    /* §4.6.1: success is SCT 0 / SC 0; the M and DNR bits do not make it a failure. */
    const uint32_t status = (field & 0x7FFu) == 0 ? TT_STATUS_SUCCESS : TT_STATUS(TT_KIND_NVME, field);
    const uint64_t t0 = tt_ld_relaxed_u64(&q->slot_time[slot]);
    tt_finish_ioctx(ctx, (uint32_t)(owner >> 32), status, (t0 && now > t0) ? now - t0 : 0);
    tt_st_release_u32(&q->slot_turn[slot], (uint32_t)owner + 1u);
    tt_atomic_add_u64(&q->completed, 1);
    if (status != TT_STATUS_SUCCESS) tt_atomic_add_u64(&q->errors, 1);
}

/* Consumes every completion entry present; the caller holds the head lock. */
TT_NOINLINE uint32_t tt_cq_drain(const struct tt_exec_ctx* ctx, struct tt_nvmeq* q) {
    const uint32_t depth = q->depth;
    /* Read once an entry is there: most polls find none, and on the host the clock
     * read is what a poll of an empty queue costs most. */
    uint64_t now = 0;
    uint64_t head = tt_ld_relaxed_u64(&q->cq_head);
    uint32_t n = 0;
    uint32_t sqhd = 0xFFFFFFFFu;
    while (n < depth) {
        const uint32_t* e = (const uint32_t*)(q->cq + (size_t)(head % depth) * 16u);
        /* §4.6: the phase tag is 1 on the first pass through the queue and flips every wrap. */
        const uint32_t phase = ((head / depth) & 1u) ? 0u : 1u;
        const uint32_t dw3 = tt_ld_acquire_u32(e + 3);
        if (((dw3 >> 16) & 1u) != phase) break;
        sqhd = tt_ld_relaxed_u32(e + 2) & 0xFFFFu;
        if (n == 0) now = tt_now_ns();
        tt_cq_complete(ctx, q, dw3, now);
        head++;
        n++;
    }
    if (n) {
        tt_sq_head_advance(q, sqhd);
        tt_st_relaxed_u64(&q->cq_head, head);
        /* The entries were read before the controller may overwrite them. */
        tt_fence_system();
        tt_st_mmio_u32(q->cq_db, (uint32_t)(head % depth));
        /* ... and this doorbell before the next holder's (as after the SQ doorbell). */
        tt_fence_system();
        tt_doorbell_wake(q->wake);
        tt_atomic_add_u64(&q->cq_doorbells, 1);
    }
    return n;
}

/* True if the completion entry at the head looks posted (its phase tag matches),
 * read without the head lock: a stale head only makes this true for an entry
 * already consumed, and the caller then takes the lock for nothing. A poll of an
 * empty queue costs this load rather than a lock. */
TT_DEVICE bool tt_cq_ready(const struct tt_nvmeq* q) {
    const uint32_t depth = q->depth;
    const uint64_t head = tt_ld_relaxed_u64(&q->cq_head);
    const uint32_t* e = (const uint32_t*)(q->cq + (size_t)(head % depth) * 16u);
    const uint32_t phase = ((head / depth) & 1u) ? 0u : 1u;
    return ((tt_ld_relaxed_u32(e + 3) >> 16) & 1u) == phase;
}

/* Consumes every completion entry present, if no other thread is doing so.
 * Returns how many were consumed. */
TT_DEVICE uint32_t tt_cq_reap(const struct tt_exec_ctx* ctx, struct tt_nvmeq* q) {
    if (!tt_cq_ready(q)) return 0;
    if (!tt_lock_try(&q->head_lock)) return 0;
    const uint32_t n = tt_cq_drain(ctx, q);
    tt_lock_release(&q->head_lock);
    return n;
}

/* Reaps, then expires the command in `slot` (`expect`, or any with
 * TT_SLOT_FREE) if it was overdue at `now` (the caller's clock reading, taken
 * before the call: an earlier time can only make an expiry later). Sets
 * *expired if this call expired it. */
TT_DEVICE uint32_t tt_cq_reap_expire(const struct tt_exec_ctx* ctx, struct tt_nvmeq* q, uint32_t slot,
                                     uint64_t expect, uint64_t now, bool* expired) {
    *expired = false;
    /* Nothing to reap: the lock is needed only if the slot's command may be due to expire. */
    if (!tt_cq_ready(q) && !tt_slot_overdue(ctx, tt_ld_relaxed_u64(&q->slot_time[slot]), now)) return 0;
    if (!tt_lock_try(&q->head_lock)) return 0;
    const uint32_t n = tt_cq_drain(ctx, q);
    *expired = tt_slot_expire(ctx, q, slot, expect, now);
    tt_lock_release(&q->head_lock);
    return n;
}

/* Publishes every contiguous ready entry with one tail doorbell write, if no
 * other thread holds the tail lock. After dropping the lock it looks once more:
 * a submitter that marked its slot while we held the lock failed to take it,
 * and relies on this second look (the fences on both sides make one of the
 * two see the other). */
TT_DEVICE void tt_sq_publish(struct tt_nvmeq* q) {
    const uint32_t depth = q->depth;
    /* Nothing ready at the tail: nothing can be published (an entry behind it waits
     * for the one at the tail, whose writer publishes both). A stale tail only sends
     * us on to the lock. */
    const uint64_t at = tt_ld_relaxed_u64(&q->sq_tail);
    if (tt_ld_acquire_u64(&q->slot_ready[at % depth]) != at + 1) return;
    for (;;) {
        if (!tt_lock_try(&q->tail_lock)) return;
        const uint64_t start = tt_ld_relaxed_u64(&q->sq_tail);
        uint64_t tail = start;
        while (tail - start < depth && tt_ld_acquire_u64(&q->slot_ready[tail % depth]) == tail + 1) tail++;
        if (tail != start) {
            /* Timeouts run from here: before this the controller cannot see the entries. */
            const uint64_t now = tt_now_ns();
            for (uint64_t t = start; t != tail; t++) tt_st_relaxed_u64(&q->slot_time[t % depth], now);
            tt_st_release_u64(&q->sq_tail, tail);
            /* Entries (released by their writers at system scope) before the doorbell. */
            tt_fence_system();
            tt_st_mmio_u32(q->sq_db, (uint32_t)(tail % depth));
            /* ... and this doorbell before the next holder's. */
            tt_fence_system();
            tt_doorbell_wake(q->wake);
            tt_atomic_add_u64(&q->sq_doorbells, 1);
        }
        tt_lock_release(&q->tail_lock);
        tt_fence_device();
        if (tt_ld_acquire_u64(&q->slot_ready[tail % depth]) != tail + 1) return;
    }
}

/* Each lane names the queue it is about to submit to (-1: none). Per distinct
 * queue in the warp, one lane adds the lanes to the queue's users, reads whether
 * the host is recovering it (tt_qgate), and only if not takes one ticket per lane
 * with a single atomic add. True if the lane was admitted, with its ticket in
 * *ticket: it must tt_queue_leave once its command has finished. Refused lanes
 * have not touched the queue (and took no ticket: tickets have no holes). Every
 * lane of the warp must call this. */
TT_DEVICE bool tt_warp_enter(const struct tt_exec_ctx* ctx, int32_t queue, uint64_t* ticket) {
    const uint32_t peers = tt_warp_match((uint32_t)queue);
    const uint32_t lane = tt_lane_id();
    const uint32_t leader = tt_ffs(peers) - 1u;
    /* 0: refused; else the first ticket of the group, plus one. */
    uint64_t first = 0;
    if (queue >= 0 && lane == leader) {
        struct tt_qgate* g = ctx->queues[queue].gate;
        const uint32_t n = tt_popc(peers);
        tt_atomic_add_sys_u32(&g->users, n);
        /* Pairs with the host's fence between storing `recovering` and reading `users`. */
        tt_fence_system();
        if (tt_ld_acquire_u32(&g->recovering))
            tt_atomic_add_sys_u32(&g->users, 0u - n);
        else
            first = tt_atomic_add_u64(&ctx->queues[queue].ticket, n) + 1u;
    }
    first = tt_warp_shfl_u64(first, leader);
    *ticket = first - 1u + tt_popc(peers & ((1u << lane) - 1u));
    return queue >= 0 && first != 0;
}

/* The end of an admitted command's use of queue `qidx`: everything this lane
 * did to the queue is visible before the host can see it gone. */
TT_DEVICE void tt_queue_leave(const struct tt_exec_ctx* ctx, uint32_t qidx) {
    tt_fence_system();
    tt_atomic_add_sys_u32(&ctx->queues[qidx].gate->users, 0xFFFFFFFFu);
}

/* Puts `cmd` into slot ticket % depth of queue `qidx` and, if `publish`, publishes it.
 * A caller passing false must publish the queue itself (tt_warp_publish), or leave it
 * to the wait (tt_wait_ioctx publishes while its command is unreaped).
 * Returns TT_STATUS_PENDING once submitted, or the status the IOCTX fails with. */
TT_NOINLINE uint32_t tt_sq_submit(const struct tt_exec_ctx* ctx, uint32_t qidx, uint64_t ticket, struct tt_sqe* cmd,
                                  uint32_t ref, struct tt_ioctx* io, bool publish) {
    struct tt_nvmeq* q = &ctx->queues[qidx];
    const uint32_t depth = q->depth;
    const uint32_t slot = (uint32_t)(ticket % depth);
    const uint32_t lap = (uint32_t)(ticket / depth);
    /* Set at the first wait: a slot that is free at once costs no clock reading. */
    uint64_t deadline = 0;
    uint32_t sleep = 32;
    for (;;) {
        if (tt_ld_relaxed_u32(&q->dead)) return TT_STATUS(TT_KIND_QUEUE_DEAD, qidx);
        const bool turn = tt_ld_acquire_u32(&q->slot_turn[slot]) == lap;
        /* §4.1: the SQ is full when tail + 1 == head, so at most depth - 1 entries. */
        if (turn && ticket < tt_ld_acquire_u64(&q->sq_head) + depth - 1u) break;
        /* The previous lap's command may never complete: expire it when it is due. */
        bool expired = false;
        const uint64_t now = tt_now_ns();
        if (deadline == 0) deadline = now + ctx->submit_timeout_ns;
        const uint32_t reaped =
            turn ? tt_cq_reap(ctx, q) : tt_cq_reap_expire(ctx, q, slot, TT_SLOT_FREE, now, &expired);
        tt_sq_publish(q);
        if (now > deadline) {
            /* This ticket will never be written: nothing at or after it can be published. */
            tt_atomic_min_u64(&q->hole, ticket);
            tt_st_release_u32(&q->dead, 1);
            return TT_STATUS(TT_KIND_TIMEOUT, TT_TIMEOUT_SUBMIT);
        }
        if (!reaped) tt_backoff(&sleep, ctx->max_backoff_ns);
    }
    tt_st_relaxed_u32(&io->queue, qidx);
    tt_st_relaxed_u64(&io->ticket, ticket);
    tt_st_relaxed_u64(&q->slot_time[slot], 0);
    tt_st_release_u64(&q->slot_owner[slot], ((uint64_t)ref << 32) | lap);
    const uint32_t cid = tt_cid(q, slot, lap);
    cmd->w[0] = (cmd->w[0] & ~0xFFFF0000ull) | ((uint64_t)cid << 16);
    uint64_t* entry = (uint64_t*)(q->sq + (size_t)slot * 64u);
    for (int k = 0; k < 8; k++) tt_st_relaxed_u64(&entry[k], cmd->w[k]);
    /* System-scope release: the entry reaches the controller before any doorbell that covers it. */
    tt_st_release_u64(&q->slot_ready[slot], ticket + 1);
    if (publish) {
        /* Pairs with the fence in tt_sq_publish after the lock is dropped. */
        tt_fence_device();
        tt_sq_publish(q);
    }
    return TT_STATUS_PENDING;
}

/* Each lane names the queue it just wrote an entry to (-1: none); the lowest
 * lane per distinct queue publishes it, so a warp's entries reach the drive
 * with one doorbell per queue rather than one per lane. An entry this look
 * misses (its writer's release not yet visible here) is published by its own
 * lane's tt_wait_ioctx. Every lane of the warp must call this. */
TT_DEVICE void tt_warp_publish(const struct tt_exec_ctx* ctx, int32_t queue) {
    const uint32_t peers = tt_warp_match((uint32_t)queue);
    if (queue < 0 || tt_lane_id() != tt_ffs(peers) - 1u) return;
    tt_fence_device();
    tt_sq_publish(&ctx->queues[queue]);
}

/* A lane's wait for one command it submitted: what tt_wait_poll needs, read once. */
struct tt_waiter {
    uint64_t owner;  /* the slot owner word of the command */
    uint64_t ticket;
    uint64_t hard;   /* the hard deadline */
    uint64_t now;    /* the last clock reading */
    uint32_t qidx;
    uint32_t polls;
};

/* Starts waiting for IOCTX `index` of IOCB `b`, which this lane submitted (tt_sq_submit
 * returned TT_STATUS_PENDING). */
TT_DEVICE void tt_wait_begin(const struct tt_exec_ctx* ctx, uint32_t b, uint32_t index, struct tt_waiter* w) {
    const struct tt_ioctx* io = &ctx->iocbs[b].ioctx[index];
    w->qidx = tt_ld_relaxed_u32(&io->queue);
    w->ticket = tt_ld_relaxed_u64(&io->ticket);
    w->owner = ((uint64_t)tt_ioctx_ref(b, index) << 32) | (uint32_t)(w->ticket / ctx->queues[w->qidx].depth);
    w->hard = tt_now_ns() + ctx->submit_timeout_ns + 2 * ctx->command_timeout_ns;
    w->now = 0;
    w->polls = 0;
}

/* One look at the command of `w`: reaps its queue, expires it once it is past the command
 * timeout, publishes what is ready. True once the IOCTX is finished (any status); else
 * *reaped says whether this look consumed completions (a caller backs off when it did not).
 * Its publication is bounded by the commands ahead of it (each bounded the same way)
 * unless it lies behind a dead queue's hole; the hard deadline of submit + 2 x command
 * timeout backs both arguments up. */
#if defined(__CUDACC__)
#define TT_WAIT_CLOCK_POLLS 1u /* the GPU's clock is a register read */
#else
#define TT_WAIT_CLOCK_POLLS 8u
#endif
TT_NOINLINE bool tt_wait_poll(const struct tt_exec_ctx* ctx, uint32_t b, uint32_t index, struct tt_waiter* w,
                              bool* reaped) {
    *reaped = false;
    struct tt_ioctx* io = &ctx->iocbs[b].ioctx[index];
    if (tt_ld_acquire_u32(&io->status) != TT_STATUS_PENDING) return true;
    struct tt_nvmeq* q = &ctx->queues[w->qidx];
    const uint32_t slot = (uint32_t)(w->ticket % q->depth);
    /* One clock reading every TT_WAIT_CLOCK_POLLS polls: on the host it costs more
     * than the poll itself. An older reading only makes an expiry later, by at
     * most that many backoff sleeps (each <= max_backoff). */
    if (w->polls++ % TT_WAIT_CLOCK_POLLS == 0) w->now = tt_now_ns();
    if (w->now > w->hard && tt_slot_expire(ctx, q, slot, w->owner, w->now, true)) return true;
    bool expired = false;
    const uint32_t n = tt_cq_reap_expire(ctx, q, slot, w->owner, w->now, &expired);
    if (expired) return true;
    if (!n) tt_sq_publish(q);
    if (tt_ld_acquire_u32(&q->dead) && w->ticket > tt_ld_acquire_u64(&q->hole) &&
        tt_atomic_cas_u64(&q->slot_owner[slot], w->owner, TT_SLOT_FREE) == w->owner) {
        /* Behind the hole: never published, never seen by the controller. */
        tt_finish_ioctx(ctx, tt_ioctx_ref(b, index), TT_STATUS(TT_KIND_QUEUE_DEAD, w->qidx), 0);
        tt_st_release_u32(&q->slot_turn[slot], (uint32_t)w->owner + 1u);
        return true;
    }
    *reaped = n != 0;
    return false;
}

/* Waits until IOCTX `index` of IOCB `b` (submitted by this lane) is finished. */
TT_DEVICE void tt_wait_ioctx(const struct tt_exec_ctx* ctx, uint32_t b, uint32_t index) {
    if (tt_ld_acquire_u32(&ctx->iocbs[b].ioctx[index].status) != TT_STATUS_PENDING) return;
    struct tt_waiter w;
    tt_wait_begin(ctx, b, index, &w);
    uint32_t sleep = 32;
    for (;;) {
        bool reaped = false;
        if (tt_wait_poll(ctx, b, index, &w, &reaped)) return;
        if (!reaped) tt_backoff(&sleep, ctx->max_backoff_ns);
    }
}

#endif /* TUTTI_GIO_QUEUE_CUH */
