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

#endif /* TUTTI_GIO_RING_CUH */
