/*
 * gio_build.cuh — turning IOCTXs into NVMe commands: from an IOCTX the host
 * filled, or for a layer IOCB by expanding a (file, block) pair through the
 * device-resident layer table.
 */
#ifndef TUTTI_GIO_BUILD_CUH
#define TUTTI_GIO_BUILD_CUH

#include "gio_queue.cuh"
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
 * IOCTX is filled in too, so the host can see what each command was. A call of its own on
 * the GPU (as are tt_sq_submit, tt_cq_drain and tt_wait_poll): inlined into both issue
 * loops under the 64-register cap, they spilled ~730 B (kernels/tests/sass.rs). */
TT_NOINLINE uint32_t tt_build_layer(const struct tt_exec_ctx* ctx, const struct tt_layer_req* req, uint32_t bi,
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

#endif /* TUTTI_GIO_BUILD_CUH */
