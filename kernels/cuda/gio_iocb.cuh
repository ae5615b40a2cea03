/*
 * gio_iocb.cuh — turning IOCTXs into NVMe commands, and running one part of an IOCB.
 *
 * An IOCB is split into `nparts` parts run by different blocks: part p takes
 * IOCTXs in runs of blockDim, every nparts-th run. A lane builds the command
 * for its IOCTX — from the IOCTX itself, or for a layer IOCB by expanding a
 * (file, block) pair through the device-resident layer table — takes a ticket
 * (tt_warp_enter), submits, and after its last submission waits for each of
 * its IOCTXs to finish. The last part to finish posts the IOCB's completion.
 */
#ifndef TUTTI_GIO_IOCB_CUH
#define TUTTI_GIO_IOCB_CUH

#include "gio_queue.cuh"
#include "gio_ring.cuh"
#include "portable.cuh"

#define TT_OPC_WRITE 0x01u
#define TT_OPC_READ 0x02u
#define TT_SGL_TYPE_DATA_BLOCK 0x0u

TT_DEVICE uint32_t tt_invalid(uint32_t detail) { return TT_STATUS(TT_KIND_INVALID, detail); }
TT_DEVICE uint32_t tt_xlate(uint32_t detail) { return TT_STATUS(TT_KIND_TRANSLATION, detail); }

/* Read/Write (§6.9, §6.15): CDW10-11 SLBA, CDW12[15:0] NLB (0's based), CDW12[31:16] flags. */
TT_DEVICE void tt_sqe_rw(struct tt_sqe* s, uint32_t opcode, bool sgl, uint32_t nsid, uint64_t d0, uint64_t d1,
                         uint64_t slba, uint32_t nlb, uint32_t cdw12_hi) {
    /* CDW0: opcode [7:0], PSDT [15:14] (01b: SGL, 00b: PRP), CID [31:16] set at submission. */
    s->w[0] = (uint64_t)(opcode | ((sgl ? 1u : 0u) << 14)) | ((uint64_t)nsid << 32);
    s->w[1] = 0; /* CDW2-3 */
    s->w[2] = 0; /* MPTR */
    s->w[3] = d0;
    s->w[4] = d1;
    s->w[5] = slba;
    s->w[6] = (uint64_t)((nlb - 1u) | (cdw12_hi << 16)); /* CDW13 = 0 */
    s->w[7] = 0;                                        /* CDW14-15 */
}

/* What the controller would reject anyway, caught here so the status names our
 * mistake instead of the device's. */
TT_DEVICE uint32_t tt_check_rw(const struct tt_drive* d, uint32_t opcode, uint32_t nlb, bool sgl, uint64_t d0,
                               uint64_t d1) {
    if (opcode != TT_OPC_READ && opcode != TT_OPC_WRITE) return tt_invalid(TT_INVALID_OPCODE);
    if (nlb == 0 || nlb > 65536u || nlb > d->max_lbas) return tt_invalid(TT_INVALID_LENGTH);
    if (sgl) {
        if (!(d->flags & TT_DRIVE_SGL)) return tt_invalid(TT_INVALID_NO_SGL);
        const uint32_t len = (uint32_t)d1;
        /* §4.4: descriptor byte 15 is type [7:4] | subtype [3:0]. */
        if ((uint32_t)(d1 >> 60) == TT_SGL_TYPE_DATA_BLOCK && (uint64_t)len != ((uint64_t)nlb << d->lba_shift))
            return tt_invalid(TT_INVALID_SGL_LENGTH);
        if ((d->flags & TT_DRIVE_SGL_DWORD) && ((d0 | len) & 3u)) return tt_invalid(TT_INVALID_SGL_ALIGN);
    }
    return TT_STATUS_SUCCESS;
}

/* Spreads work over a drive's queues by what it is, not by which block runs
 * it, so the split is even however parts are scheduled. The 32 IOCTXs of a
 * warp's round (aligned to 32) pick the same queue for a drive, so they share
 * one ticket atomic. */
TT_DEVICE uint32_t tt_pick_queue(const struct tt_drive* d, uint32_t iocb, uint32_t i) {
    return d->first_queue + (iocb + i / TT_WARP_SIZE) % d->nqueues;
}

/* A command from an IOCTX the host filled. */
TT_DEVICE uint32_t tt_build_explicit(const struct tt_exec_ctx* ctx, uint32_t b, uint32_t i, struct tt_ioctx* io,
                                     struct tt_sqe* sqe, uint32_t* queue) {
    const uint32_t drive = tt_ld_relaxed_u16(&io->drive);
    if (drive >= ctx->ndrives) return tt_xlate(TT_XLATE_DRIVE);
    const struct tt_drive* d = &ctx->drives[drive];
    const uint32_t flags = tt_ld_relaxed_u8(&io->flags);
    uint64_t d0, d1;
    bool sgl;
    if (flags == TT_IOCTX_SGL || flags == TT_IOCTX_PRP) {
        d0 = tt_ld_relaxed_u64(&io->dptr[0]);
        d1 = tt_ld_relaxed_u64(&io->dptr[1]);
        sgl = flags == TT_IOCTX_SGL;
    } else if (flags == TT_IOCTX_TABLE) {
        const uint32_t t = tt_ld_relaxed_u8(&io->table);
        if (t >= ctx->ntables || ctx->tables[t].kind == TT_TABLE_UNUSED) return tt_xlate(TT_XLATE_TABLE);
        const struct tt_layer_table* tb = &ctx->tables[t];
        /* A staged table's entries are KV addresses, not data pointers: only layer IOCBs use them. */
        if (tb->kind == TT_TABLE_STAGED) return tt_xlate(TT_XLATE_TABLE);
        const uint32_t idx = tt_ld_relaxed_u32(&io->table_index);
        if (idx >= tb->entry_count) return tt_xlate(TT_XLATE_INDEX);
        d0 = tb->entries[2 * (uint64_t)idx];
        d1 = tb->entries[2 * (uint64_t)idx + 1];
        sgl = tb->kind == TT_TABLE_SGL;
        if (sgl ? (uint32_t)d1 == 0 : d0 == 0) return tt_xlate(TT_XLATE_EMPTY);
    } else {
        return tt_invalid(TT_INVALID_DPTR);
    }
    const uint32_t opcode = tt_ld_relaxed_u8(&io->opcode);
    const uint32_t nlb = tt_ld_relaxed_u32(&io->nlb);
    const uint32_t st = tt_check_rw(d, opcode, nlb, sgl, d0, d1);
    if (st != TT_STATUS_SUCCESS) return st;
    uint32_t nsid = tt_ld_relaxed_u32(&io->nsid);
    if (nsid == 0) nsid = d->nsid;
    tt_sqe_rw(sqe, opcode, sgl, nsid, d0, d1, tt_ld_relaxed_u64(&io->slba), nlb, tt_ld_relaxed_u16(&io->cdw12_hi));
    *queue = tt_pick_queue(d, b, i);
    return TT_STATUS_SUCCESS;
}

/* What a layer IOCB asks for, read once per part. */
struct tt_layer_req {
    const struct tt_layer_table* tb; /* NULL: no such table */
    const struct tt_pair* pairs;     /* the IOCB's pairs[], or its slice of a registered pair list */
    uint32_t npairs;                 /* pairs readable at `pairs` */
    uint32_t pairs_error;            /* TT_XLATE_* when the pair list reference is bad, else 0 */
    uint32_t table;
    uint32_t layer;
    uint32_t opcode;
};

/* Where the pairs of a layer IOCB are: its own pairs[] (TT_IOCB_LAYER) or
 * pairs[pair_first .. pair_first + npairs) of registered list pair_list
 * (TT_IOCB_LAYER_LIST). The list id and the range are checked against the
 * list descriptor here, so a bad reference fails every IOCTX with a
 * translation status and nothing outside the list is ever read. */
TT_DEVICE void tt_layer_pairs(const struct tt_exec_ctx* ctx, struct tt_iocb* iocb, uint32_t kind,
                              struct tt_layer_req* req) {
    const uint32_t npairs = tt_ld_relaxed_u32(&iocb->hdr.npairs);
    req->pairs_error = 0;
    if (kind != TT_IOCB_LAYER_LIST) {
        req->pairs = iocb->pairs;
        req->npairs = tt_min_u32(npairs, TT_IOCB_MAX_PAIRS);
        return;
    }
    req->pairs = 0;
    req->npairs = 0;
    const uint32_t list = tt_ld_relaxed_u32(&iocb->hdr.pair_list);
    if (list >= ctx->npair_lists) {
        req->pairs_error = TT_XLATE_PAIR_LIST;
        return;
    }
    /* Slots are reused as jobs come and go: read the descriptor through the
     * device-visible accessors, never from a cached copy. */
    const struct tt_pair_list* pl = &ctx->pair_lists[list];
    const uint64_t addr = tt_ld_relaxed_u64((const uint64_t*)&pl->pairs);
    const uint64_t len = tt_ld_relaxed_u64(&pl->npairs);
    if (addr == 0) {
        req->pairs_error = TT_XLATE_PAIR_LIST;
        return;
    }
    const uint64_t first = tt_ld_relaxed_u32(&iocb->hdr.pair_first);
    if (first + npairs > len) {
        req->pairs_error = TT_XLATE_PAIR_RANGE;
        return;
    }
    req->pairs = (const struct tt_pair*)addr + first;
    req->npairs = npairs;
}

/* IOCTX `i` of a layer IOCB: pair i / (2 chunks) of req->pairs, then K or V, then the chunk.
 * The tutti_gio.h comment on tt_layer_table gives the placement formula. The
 * IOCTX is filled in too, so the host can see what each command was. */
TT_DEVICE uint32_t tt_build_layer(const struct tt_exec_ctx* ctx, const struct tt_layer_req* req, uint32_t bi,
                                  uint32_t i, struct tt_ioctx* io, struct tt_sqe* sqe, uint32_t* queue,
                                  uint32_t* pool_drive_out) {
    tt_st_relaxed_u32(&io->status, TT_STATUS_PENDING);
    const struct tt_layer_table* tb = req->tb;
    if (!tb) return tt_xlate(TT_XLATE_TABLE);
    if (req->layer >= tb->layers) return tt_xlate(TT_XLATE_LAYER);
    const uint32_t chunks = tb->chunks;
    const uint32_t p = i / (2u * chunks);
    const uint32_t kv = (i / chunks) & 1u;
    const uint32_t c = i % chunks;
    if (req->pairs_error) return tt_xlate(req->pairs_error);
    /* count is the host's npairs * 2 * chunks; a header that disagrees must not read past the pairs. */
    if (p >= req->npairs) return tt_xlate(TT_XLATE_PAIR_RANGE);
    const uint32_t file = tt_ld_relaxed_u32(&req->pairs[p].file);
    const uint32_t block = tt_ld_relaxed_u32(&req->pairs[p].block);
    if (file >= tb->files) return tt_xlate(TT_XLATE_FILE);
    if (block >= tb->blocks) return tt_xlate(TT_XLATE_BLOCK);
    const uint32_t j = 2u * req->layer + kv;
    const uint32_t pool_drive = (uint32_t)(((uint64_t)file + j) % tb->ndrives);
    *pool_drive_out = pool_drive;
    const uint32_t drive = tb->drive[pool_drive];
    if (drive >= ctx->ndrives) return tt_xlate(TT_XLATE_DRIVE);
    const struct tt_drive* d = &ctx->drives[drive];
    /* Sizes are in table units (the pool's smallest LBA); this drive's LBAs are 2^r units,
     * and the host made every object and chunk a whole number of them. */
    if (d->lba_shift < tb->unit_shift || d->lba_shift - tb->unit_shift >= 32u) return tt_xlate(TT_XLATE_UNIT);
    const uint32_t r = d->lba_shift - tb->unit_shift;
    const uint64_t lba_units = (uint64_t)1 << r;
    const uint64_t chunk_off = (uint64_t)c * tb->chunk_units;
    const uint64_t chunk_len = tt_min_u64(tb->chunk_units, tb->object_units - chunk_off);
    if ((tb->object_units | chunk_off | chunk_len) & (lba_units - 1u)) return tt_xlate(TT_XLATE_UNIT);
    const uint64_t slba = tb->data_start_lba[pool_drive] +
                          ((((uint64_t)file * tb->slots_per_file + j / tb->ndrives) * tb->object_units) >> r) +
                          (chunk_off >> r);
    const uint32_t nlb = (uint32_t)(chunk_len >> r);
    const uint64_t idx = (((uint64_t)block * tb->layers + req->layer) * 2u + kv) * chunks + c;
    if (idx >= tb->entry_count) return tt_xlate(TT_XLATE_INDEX);
    const uint64_t d0 = tb->entries[2 * idx];
    const uint64_t d1 = tb->entries[2 * idx + 1];
    const bool sgl = tb->kind == TT_TABLE_SGL;
    const bool staged = tb->kind == TT_TABLE_STAGED;
    tt_st_relaxed_u64(&io->dptr[0], d0);
    tt_st_relaxed_u64(&io->dptr[1], d1);
    tt_st_relaxed_u64(&io->slba, slba);
    tt_st_relaxed_u32(&io->nlb, nlb);
    tt_st_relaxed_u32(&io->nsid, d->nsid);
    tt_st_relaxed_u32(&io->table_index, (uint32_t)idx);
    tt_st_relaxed_u16(&io->drive, (uint16_t)drive);
    tt_st_relaxed_u8(&io->opcode, (uint8_t)req->opcode);
    tt_st_relaxed_u8(&io->flags, (uint8_t)TT_IOCTX_TABLE);
    tt_st_relaxed_u8(&io->table, (uint8_t)req->table);
    if (sgl ? (uint32_t)d1 == 0 : d0 == 0) return tt_xlate(TT_XLATE_EMPTY);
    if (sgl && (uint32_t)(d1 >> 60) == TT_SGL_TYPE_DATA_BLOCK && (uint64_t)(uint32_t)d1 != ((uint64_t)nlb << d->lba_shift))
        return tt_xlate(TT_XLATE_LENGTH);
    /* Staged: { KV address, length }; the data pointer is the staging slot's, set once one is taken. */
    if (staged && d1 != ((uint64_t)nlb << d->lba_shift)) return tt_xlate(TT_XLATE_LENGTH);
    const uint32_t st = tt_check_rw(d, req->opcode, nlb, sgl, d0, d1);
    if (st != TT_STATUS_SUCCESS) return st;
    tt_sqe_rw(sqe, req->opcode, sgl, d->nsid, d0, d1, slba, nlb, 0);
    *queue = tt_pick_queue(d, bi, i);
    return TT_STATUS_SUCCESS;
}

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

/* Copies `bytes` (a multiple of 8, both ends 8-byte aligned) word by word through the
 * device-visible accessors: one side is memory a drive DMAs (the staging slot). */
TT_DEVICE void tt_copy_words(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
    uint64_t* d = (uint64_t*)dst;
    const uint64_t* s = (const uint64_t*)src;
    for (uint64_t k = 0; k < bytes / 8u; k++) tt_st_relaxed_u64(&d[k], tt_ld_relaxed_u64(&s[k]));
}

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

/* Whether a staging slot may be handed out again after its command ended with
 * `status`: not when the drive may still move data through it. */
TT_DEVICE bool tt_stage_reusable(uint32_t status) {
    const uint32_t kind = status >> TT_STATUS_KIND_SHIFT;
    return status != TT_STATUS_PENDING && kind != TT_KIND_TIMEOUT && kind != TT_KIND_QUEUE_DEAD;
}

TT_DEVICE void tt_stage_release(struct tt_staging* sg, uint32_t slot, uint32_t status) {
    if (!tt_stage_reusable(status) || !tt_ring_push(sg->free, slot)) tt_atomic_add_u64(&sg->withheld, 1);
}

/*
 * A part of a layer IOCB through a staged table. Each lane runs its IOCTX of a
 * round to the end before the next round — take a slot, (write) copy the KV
 * chunk into it and fence, submit, wait, (read) copy the slot out to KV memory
 * and fence, give the slot back — so a lane never holds a slot while it waits
 * for another, and a staging pool smaller than the work only slows it down.
 * Lanes that found no free slot try again in the next pass of the warp
 * (submission is a warp collective), until the submit deadline.
 */
TT_DEVICE void tt_process_staged(const struct tt_exec_ctx* ctx, uint32_t b, const struct tt_layer_req* req,
                                 uint32_t part, uint32_t nparts, uint32_t count) {
    struct tt_iocb* iocb = &ctx->iocbs[b];
    struct tt_staging* sg = req->tb->staging;
    const bool read = req->opcode == TT_OPC_READ;
    const uint32_t tid = tt_thread_idx();
    const uint32_t bdim = tt_block_dim();
    const uint32_t stride = nparts * bdim;
    for (uint32_t base = part * bdim;; base += stride) {
        const uint32_t i = base + tid;
        const bool have = i < count;
        if (!tt_warp_any(have)) break;
        struct tt_sqe sqe;
        uint32_t queue = 0, pd = 0;
        bool pending = false;
        const uint32_t ref = tt_ioctx_ref(b, have ? i : 0);
        struct tt_ioctx* io = &iocb->ioctx[have ? i : 0];
        if (have) {
            uint32_t st = sg ? tt_build_layer(ctx, req, b, i, io, &sqe, &queue, &pd) : tt_xlate(TT_XLATE_TABLE);
            if (st == TT_STATUS_SUCCESS && tt_ld_relaxed_u32(&ctx->queues[queue].dead))
                st = TT_STATUS(TT_KIND_QUEUE_DEAD, queue);
            if (st == TT_STATUS_SUCCESS)
                pending = true;
            else
                tt_finish_ioctx(ctx, ref, st, 0);
        }
        uint8_t* kv = (uint8_t*)tt_ld_relaxed_u64(&io->dptr[0]);
        const uint64_t bytes = tt_ld_relaxed_u64(&io->dptr[1]);
        const uint64_t deadline = tt_now_ns() + ctx->submit_timeout_ns;
        uint32_t sleep = 32;
        bool waited = false;
        while (tt_warp_any(pending)) {
            int32_t target = -1;
            uint32_t slot = 0;
            if (pending) {
                uint64_t v = 0;
                if (tt_ring_pop(sg->free, &v) && v < sg->nslots) {
                    slot = (uint32_t)v;
                    uint8_t* mem = sg->base + (uint64_t)slot * sg->slot_bytes;
                    if (!read) {
                        tt_copy_words(mem, kv, bytes);
                        /* The slot's bytes reach the system before the SQE and its doorbell. */
                        tt_fence_system();
                        tt_atomic_add_u64(&sg->staged_bytes, bytes);
                    }
                    tt_stage_dptr(sg, pd, slot, bytes, &sqe);
                    target = (int32_t)queue;
                } else if (tt_now_ns() > deadline) {
                    tt_finish_ioctx(ctx, ref, TT_STATUS(TT_KIND_TIMEOUT, TT_TIMEOUT_STAGING), 0);
                    pending = false;
                } else if (!waited) {
                    waited = true;
                    tt_atomic_add_u64(&sg->waits, 1);
                }
            }
            uint64_t ticket = 0;
            if (!tt_warp_enter(ctx, target, &ticket) && target >= 0) {
                tt_finish_ioctx(ctx, ref, TT_STATUS(TT_KIND_QUEUE_RECOVERING, queue), 0);
                tt_stage_release(sg, slot, TT_STATUS_SUCCESS);
                target = -1;
                pending = false;
            }
            if (target >= 0) {
                pending = false;
                const uint32_t st = tt_sq_submit(ctx, queue, ticket, &sqe, ref, io, true);
                if (st != TT_STATUS_PENDING) {
                    /* Never published: the drive never saw the slot. */
                    tt_finish_ioctx(ctx, ref, st, 0);
                    tt_queue_leave(ctx, queue);
                    tt_stage_release(sg, slot, TT_STATUS_SUCCESS);
                } else {
                    tt_wait_ioctx(ctx, b, i);
                    const uint32_t done = tt_ld_acquire_u32(&io->status);
                    if (read && done == TT_STATUS_SUCCESS) {
                        tt_copy_words(kv, sg->base + (uint64_t)slot * sg->slot_bytes, bytes);
                        /* KV bytes land before this part counts as finished (and the IOCB is posted). */
                        tt_fence_system();
                        tt_atomic_add_u64(&sg->staged_bytes, bytes);
                    }
                    tt_queue_leave(ctx, tt_ld_relaxed_u32(&io->queue));
                    tt_stage_release(sg, slot, done);
                }
            } else if (pending) {
                tt_backoff(&sleep, ctx->max_backoff_ns);
            }
        }
    }
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
