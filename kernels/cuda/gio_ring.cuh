/*
 * gio_ring.cuh — the executor's side of the host/executor rings (tt_ring):
 * it consumes the submission ring (IOCB parts) and produces the completion
 * ring (finished IOCB indices). The host side is gio_uring/src/shared_ring.rs; both
 * implement the same sequence-numbered cells described in tutti_gio.h.
 */
#ifndef TUTTI_GIO_RING_CUH
#define TUTTI_GIO_RING_CUH

#include "portable.cuh"

TT_DEVICE struct tt_ring_cell* tt_ring_cells(struct tt_ring* r) {
    return (struct tt_ring_cell*)((uint8_t*)r + sizeof(struct tt_ring));
}

/* Takes the oldest value if there is one. Never waits: an empty ring, or a cell
 * a producer has reserved but not yet published, reads as empty. */
TT_DEVICE bool tt_ring_pop(struct tt_ring* r, uint64_t* out) {
    struct tt_ring_cell* cells = tt_ring_cells(r);
    const uint64_t cap = r->capacity;
    const uint64_t mask = r->mask;
    uint64_t pos = tt_ld_relaxed_u64(&r->head);
    /* Every failed round means another consumer took `pos`; bounded so a caller
     * under heavy contention returns and polls again instead of spinning here. */
    for (uint32_t round = 0; round < 4096; round++) {
        struct tt_ring_cell* c = &cells[pos & mask];
        const uint64_t seq = tt_ld_acquire_u64(&c->seq);
        const int64_t dif = (int64_t)(seq - (pos + 1));
        if (dif == 0) {
            const uint64_t seen = tt_atomic_cas_u64(&r->head, pos, pos + 1);
            if (seen == pos) {
                *out = tt_ld_relaxed_u64(&c->value);
                tt_st_release_u64(&c->seq, pos + cap);
                return true;
            }
            pos = seen;
        } else if (dif < 0) {
            return false;
        } else {
            pos = tt_ld_relaxed_u64(&r->head);
        }
    }
    return false;
}

/* Appends `v`; false if the ring stays full. The completion ring has a cell for
 * every IOCB of the pool, so it cannot fill unless the host misbehaves. */
TT_DEVICE bool tt_ring_push(struct tt_ring* r, uint64_t v) {
    struct tt_ring_cell* cells = tt_ring_cells(r);
    const uint64_t mask = r->mask;
    uint64_t pos = tt_ld_relaxed_u64(&r->tail);
    for (uint32_t round = 0; round < 4096; round++) {
        struct tt_ring_cell* c = &cells[pos & mask];
        const uint64_t seq = tt_ld_acquire_u64(&c->seq);
        const int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            const uint64_t seen = tt_atomic_cas_u64(&r->tail, pos, pos + 1);
            if (seen == pos) {
                tt_st_relaxed_u64(&c->value, v);
                tt_st_release_u64(&c->seq, pos + 1);
                return true;
            }
            pos = seen;
        } else if (dif < 0) {
            return false;
        } else {
            pos = tt_ld_relaxed_u64(&r->tail);
        }
    }
    return false;
}

/* True if the oldest value is published (a pop would find it). */
TT_DEVICE bool tt_ring_ready(struct tt_ring* r) {
    const uint64_t pos = tt_ld_relaxed_u64(&r->head);
    const uint64_t seq = tt_ld_acquire_u64(&tt_ring_cells(r)[pos & r->mask].seq);
    return seq == pos + 1;
}

/* After publishing: wakes host threads blocked on the ring (the protocol in
 * tutti_gio.h). On the GPU nothing can be woken; host waiters there time out. */
TT_DEVICE void tt_ring_wake(struct tt_ring* r) {
#if defined(__CUDACC__)
    (void)r;
#else
    /* Pairs with the consumer's fence between counting itself and looking again. */
    tt_fence_system();
    if (tt_ld_acquire_u32(&r->sleepers) != 0u) {
        tt_atomic_add_u32(&r->wake_seq, 1u);
        tt_host_wake(&r->wake_seq);
    }
#endif
}

/* Idle rounds a host consumer spends yielding the core before it blocks: work that
 * comes back soon (the next IOCB of a stream) is taken without a futex wake on
 * either side; an idle executor still blocks after them. */
#define TT_HOST_IDLE_SPINS 64u

/* A consumer that found the ring empty waits a while for a producer. On the GPU
 * it backs off (*ns, doubling up to max_ns). On the host it blocks until a producer
 * publishes (the protocol in tutti_gio.h), or park_ns passes, so an idle executor
 * costs no CPU; a ring that is not empty (the caller was told to stay out) backs off.
 * Before blocking, a host consumer yields for TT_HOST_IDLE_SPINS rounds (counted in
 * *ns from the 256 the caller resets it to after work). */
TT_DEVICE void tt_ring_idle(struct tt_ring* r, uint32_t* ns, uint32_t max_ns, uint64_t park_ns) {
#if defined(__CUDACC__)
    (void)r;
    (void)park_ns;
    tt_backoff(ns, max_ns);
#else
    if (*ns < 256u + TT_HOST_IDLE_SPINS) {
        *ns += 1u;
        /* One lane of the block gives the core away; the others are idle with it. */
        if (tt_thread_idx() == 0u) tt_host_yield();
        return;
    }
    const uint32_t seen = tt_ld_acquire_u32(&r->wake_seq);
    tt_atomic_add_u32(&r->sleepers, 1);
    /* Pairs with the producer's fence between publishing and reading `sleepers`:
     * either it sees us and bumps wake_seq, or we see its value here. */
    tt_fence_system();
    if (tt_ring_ready(r))
        tt_backoff(ns, max_ns);
    else
        tt_host_park(&r->wake_seq, seen, park_ns);
    tt_atomic_add_u32(&r->sleepers, 0xFFFFFFFFu);
#endif
}

#endif /* TUTTI_GIO_RING_CUH */
