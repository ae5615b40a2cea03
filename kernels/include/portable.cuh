/*
 * portable.cuh — the one place where kernel code meets the machine.
 *
 * The I/O kernels are compiled twice from the same text: by NVRTC for the GPU,
 * and by the system C++ compiler for the host executor (one host thread per
 * block, its lanes as fibers; see kernels/host/runtime.cpp). Every load or store that another
 * agent (a controller, the host, another thread) may observe goes through the
 * functions below, so the memory ordering is written down once per target:
 *
 *   GPU                                   host
 *   ld.acquire.sys / st.release.sys       __atomic acquire / release
 *   volatile loads and stores             __atomic relaxed (ThreadSanitizer sees atomics)
 *   st.mmio.relaxed.sys (doorbells)       release store (MMIO is uncached; memory doorbells are atomics)
 *   __threadfence_system / __threadfence  seq_cst fence
 *
 * x86 orders far more than the GPU does, so a fence missing here would never
 * show on the host executor: the GPU column is the one to review.
 *
 * Warp collectives are only ever called by all 32 lanes of a warp (kernels keep
 * every lane in their loops until the whole warp is done), which is what the
 * host emulation relies on.
 */
#ifndef TUTTI_PORTABLE_CUH
#define TUTTI_PORTABLE_CUH

#include "tutti_gio.h"

#if defined(__CUDACC__)
/* ------------------------------------------------------------------ GPU */

#define TT_DEVICE __device__ __forceinline__
#define TT_NOINLINE __device__ __noinline__
#define TT_KERNEL extern "C" __global__
/* At most `threads` per block and at least `blocks` resident per SM: caps registers. */
#define TT_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
#define TT_SHARED(type, name) \
    __shared__ type name##_storage; \
    type& name = name##_storage

TT_DEVICE uint32_t tt_thread_idx() { return threadIdx.x; }
TT_DEVICE uint32_t tt_block_idx() { return blockIdx.x; }
TT_DEVICE uint32_t tt_block_dim() { return blockDim.x; }
TT_DEVICE uint32_t tt_grid_dim() { return gridDim.x; }

TT_DEVICE uint32_t tt_ld_acquire_u32(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
TT_DEVICE uint64_t tt_ld_acquire_u64(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
TT_DEVICE void tt_st_release_u32(uint32_t* p, uint32_t v) {
    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
TT_DEVICE void tt_st_release_u64(uint64_t* p, uint64_t v) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
TT_DEVICE uint32_t tt_ld_relaxed_u32(const uint32_t* p) { return *(const volatile uint32_t*)p; }
TT_DEVICE uint64_t tt_ld_relaxed_u64(const uint64_t* p) { return *(const volatile uint64_t*)p; }
TT_DEVICE uint16_t tt_ld_relaxed_u16(const uint16_t* p) { return *(const volatile uint16_t*)p; }
TT_DEVICE uint8_t tt_ld_relaxed_u8(const uint8_t* p) { return *(const volatile uint8_t*)p; }
TT_DEVICE void tt_st_relaxed_u8(uint8_t* p, uint8_t v) { *(volatile uint8_t*)p = v; }
TT_DEVICE void tt_st_relaxed_u16(uint16_t* p, uint16_t v) { *(volatile uint16_t*)p = v; }
TT_DEVICE void tt_st_relaxed_u32(uint32_t* p, uint32_t v) { *(volatile uint32_t*)p = v; }
TT_DEVICE void tt_st_relaxed_u64(uint64_t* p, uint64_t v) { *(volatile uint64_t*)p = v; }

/* A doorbell: an MMIO store the GPU must neither merge nor elide (PTX ISA 8.2+, sm_70+). */
TT_DEVICE void tt_st_mmio_u32(uint32_t* p, uint32_t v) {
    asm volatile("st.mmio.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/* Host lanes only (below): a GPU never wakes an emulated controller itself. */
TT_DEVICE void tt_doorbell_wake(uint32_t* wake) { (void)wake; }
/* Orders everything before it with everything after it, for the whole system (host, drives). */
TT_DEVICE void tt_fence_system() { __threadfence_system(); }
/* The same among this GPU's threads (state that only the executor touches). */
TT_DEVICE void tt_fence_device() { __threadfence(); }

TT_DEVICE uint32_t tt_atomic_add_u32(uint32_t* p, uint32_t v) { return atomicAdd(p, v); }
/* An add the host observes too (memory the CPU reads while the kernel runs, e.g. a
 * queue gate's user count): system scope, not just this GPU's. */
TT_DEVICE uint32_t tt_atomic_add_sys_u32(uint32_t* p, uint32_t v) { return atomicAdd_system(p, v); }
TT_DEVICE uint64_t tt_atomic_add_u64(uint64_t* p, uint64_t v) {
    return atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
TT_DEVICE uint32_t tt_atomic_cas_u32(uint32_t* p, uint32_t cmp, uint32_t v) { return atomicCAS(p, cmp, v); }
TT_DEVICE uint64_t tt_atomic_cas_u64(uint64_t* p, uint64_t cmp, uint64_t v) {
    return atomicCAS((unsigned long long*)p, (unsigned long long)cmp, (unsigned long long)v);
}
TT_DEVICE uint32_t tt_atomic_exch_u32(uint32_t* p, uint32_t v) { return atomicExch(p, v); }
TT_DEVICE uint64_t tt_atomic_min_u64(uint64_t* p, uint64_t v) {
    return atomicMin((unsigned long long*)p, (unsigned long long)v);
}

TT_DEVICE uint32_t tt_lane_id() { return threadIdx.x & (TT_WARP_SIZE - 1); }
TT_DEVICE bool tt_warp_any(bool pred) { return __any_sync(0xFFFFFFFFu, pred); }
TT_DEVICE uint32_t tt_warp_ballot(bool pred) { return __ballot_sync(0xFFFFFFFFu, pred); }
TT_DEVICE uint32_t tt_warp_match(uint32_t v) { return __match_any_sync(0xFFFFFFFFu, v); }
TT_DEVICE uint64_t tt_warp_shfl_u64(uint64_t v, uint32_t src) {
    return __shfl_sync(0xFFFFFFFFu, (unsigned long long)v, (int)src);
}
/* Ballots of bits 0 .. n-1 of every lane's `flags`: masks[k] has bit l set when lane l set bit k. */
TT_DEVICE void tt_warp_vote(uint32_t flags, uint32_t* masks, uint32_t n) {
    for (uint32_t k = 0; k < n; k++) masks[k] = __ballot_sync(0xFFFFFFFFu, (flags >> k) & 1u);
}
/* Every lane's value, read lane by lane: at(l) is lane l's `v`. On the GPU each at() is a
 * shuffle (all lanes call it with the same l); on the host one exchange made them all readable. */
struct tt_warp_view {
    uint64_t mine;
    __device__ uint64_t at(uint32_t lane) const { return tt_warp_shfl_u64(mine, lane); }
};
TT_DEVICE struct tt_warp_view tt_warp_gather(uint64_t v) { return tt_warp_view{v}; }
TT_DEVICE void tt_syncthreads() { __syncthreads(); }
/* The warp meets; memory operations before it are ordered before those after it. */
TT_DEVICE void tt_warp_sync() { __syncwarp(); }
TT_DEVICE uint32_t tt_popc(uint32_t v) { return (uint32_t)__popc(v); }
TT_DEVICE uint32_t tt_ffs(uint32_t v) { return (uint32_t)__ffs((int)v); }

/* 128-bit words of the staged copy (tt_warp_copy below). */
struct __align__(16) tt_u128 {
    uint32_t x, y, z, w;
};
/* A strong, system-scope 128-bit load: never served from a stale L1 line, never merged or
 * elided (see tt_warp_copy for why this flavour). */
TT_DEVICE struct tt_u128 tt_ld_sys_u128(const struct tt_u128* p) {
    struct tt_u128 v;
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
/* A plain 128-bit store: ordered for others by the caller's fence. */
TT_DEVICE void tt_st_u128(struct tt_u128* p, struct tt_u128 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
TT_DEVICE uint64_t tt_ld_sys_u64(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

TT_DEVICE void tt_nanosleep(uint32_t ns) { __nanosleep(ns); }
TT_DEVICE uint64_t tt_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#else
/* ----------------------------------------------------------------- host */

#include "../host/runtime.h"
#include <string.h>

#define TT_DEVICE static inline
#define TT_NOINLINE static
#define TT_KERNEL extern "C"
#define TT_LAUNCH_BOUNDS(threads, blocks)
#define TT_SHARED(type, name) type& name = *(type*)tt_host_block_shared(sizeof(type))

TT_DEVICE uint32_t tt_thread_idx() { return tt_host_lane->thread_idx; }
TT_DEVICE uint32_t tt_block_idx() { return tt_host_lane->block_idx; }
TT_DEVICE uint32_t tt_block_dim() { return tt_host_lane->block_dim; }
TT_DEVICE uint32_t tt_grid_dim() { return tt_host_lane->grid_dim; }

TT_DEVICE uint32_t tt_ld_acquire_u32(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
TT_DEVICE uint64_t tt_ld_acquire_u64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
TT_DEVICE void tt_st_release_u32(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
TT_DEVICE void tt_st_release_u64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
TT_DEVICE uint32_t tt_ld_relaxed_u32(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
TT_DEVICE uint64_t tt_ld_relaxed_u64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
TT_DEVICE uint16_t tt_ld_relaxed_u16(const uint16_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
TT_DEVICE uint8_t tt_ld_relaxed_u8(const uint8_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
TT_DEVICE void tt_st_relaxed_u8(uint8_t* p, uint8_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
TT_DEVICE void tt_st_relaxed_u16(uint16_t* p, uint16_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
TT_DEVICE void tt_st_relaxed_u32(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
TT_DEVICE void tt_st_relaxed_u64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

/* Emulated doorbells are atomics the controller thread loads; a real BAR mapped
 * uncached is written by the same single aligned store, after the release fence. */
TT_DEVICE void tt_st_mmio_u32(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
TT_DEVICE void tt_fence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
/* After a doorbell store and a system fence: wakes an emulated controller
 * parked on its wake word (1 while parked; the writer that swaps it to 0
 * makes the futex call). `wake` is NULL for a real drive. */
TT_DEVICE void tt_doorbell_wake(uint32_t* wake) {
    if (wake && __atomic_load_n(wake, __ATOMIC_RELAXED) != 0 && __atomic_exchange_n(wake, 0u, __ATOMIC_SEQ_CST) != 0)
        tt_host_wake(wake);
}
TT_DEVICE void tt_fence_device() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

TT_DEVICE uint32_t tt_atomic_add_u32(uint32_t* p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
TT_DEVICE uint32_t tt_atomic_add_sys_u32(uint32_t* p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
TT_DEVICE uint64_t tt_atomic_add_u64(uint64_t* p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
TT_DEVICE uint32_t tt_atomic_cas_u32(uint32_t* p, uint32_t cmp, uint32_t v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
TT_DEVICE uint64_t tt_atomic_cas_u64(uint64_t* p, uint64_t cmp, uint64_t v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
TT_DEVICE uint32_t tt_atomic_exch_u32(uint32_t* p, uint32_t v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
TT_DEVICE uint64_t tt_atomic_min_u64(uint64_t* p, uint64_t v) {
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < cur && !__atomic_compare_exchange_n(p, &cur, v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
    return cur;
}

TT_DEVICE uint32_t tt_lane_id() { return tt_host_lane->thread_idx & (TT_WARP_SIZE - 1); }
/* Host collectives: every lane posts a value, then reads the warp's values, or
 * a result computed once for the warp, in place (runtime.cpp). */
TT_DEVICE bool tt_warp_any(bool pred) { return tt_host_warp_any(pred); }
TT_DEVICE uint32_t tt_warp_ballot(bool pred) { return tt_host_warp_ballot(pred); }
TT_DEVICE uint32_t tt_warp_match(uint32_t v) { return tt_host_warp_match(v); }
TT_DEVICE uint64_t tt_warp_shfl_u64(uint64_t v, uint32_t src) {
    return tt_host_warp_exchange(v)[src & (TT_WARP_SIZE - 1)];
}
/* One exchange for all the ballots (n <= 8): the host's collectives cost lane switches. */
TT_DEVICE void tt_warp_vote(uint32_t flags, uint32_t* masks, uint32_t n) { tt_host_warp_vote(flags, masks, n); }
/* The warp's values from one exchange, copied: another lane's next exchange may reuse the
 * exchange's buffer before this lane has read it (the last lane to arrive runs on first). */
struct tt_warp_view {
    uint64_t all[TT_WARP_SIZE];
    uint64_t at(uint32_t lane) const { return all[lane & (TT_WARP_SIZE - 1)]; }
};
TT_DEVICE struct tt_warp_view tt_warp_gather(uint64_t v) {
    struct tt_warp_view view;
    memcpy(view.all, tt_host_warp_exchange(v), sizeof view.all);
    return view;
}
TT_DEVICE void tt_syncthreads() { tt_host_block_sync(); }
/* Host lanes of a warp share an OS thread: meeting is all it takes. */
TT_DEVICE void tt_warp_sync() { (void)tt_host_warp_exchange(0); }
TT_DEVICE uint32_t tt_popc(uint32_t v) { return (uint32_t)__builtin_popcount(v); }
TT_DEVICE uint32_t tt_ffs(uint32_t v) { return (uint32_t)__builtin_ffs((int)v); }

TT_DEVICE void tt_nanosleep(uint32_t ns) { tt_host_nanosleep(ns); }
TT_DEVICE uint64_t tt_now_ns() { return tt_host_now_ns(); }

#endif

TT_DEVICE uint32_t tt_min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }
TT_DEVICE uint64_t tt_min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Exponential backoff for poll loops: sleeps, then doubles up to `max_ns`.
 * Host lanes grow by an eighth above 4 us instead: every sleep of the OS thread
 * is a timer wake-up that costs more than the poll, and doubling would overshoot
 * a command that takes ten microseconds by as much again. They still reach
 * max_ns after a couple of hundred microseconds of waiting. */
TT_DEVICE void tt_backoff(uint32_t* ns, uint32_t max_ns) {
    tt_nanosleep(*ns);
#if defined(__CUDACC__)
    *ns = tt_min_u32(*ns * 2, max_ns);
#else
    *ns = tt_min_u32(*ns < 4096u ? *ns * 2 : *ns + *ns / 8u, max_ns);
#endif
}

/* Spin lock word: 0 free, 1 held. The fences make the protected data written by
 * the previous holder visible to the next. */
TT_DEVICE bool tt_lock_try(uint32_t* l) {
    if (tt_ld_relaxed_u32(l) != 0) return false;
    if (tt_atomic_cas_u32(l, 0, 1) != 0) return false;
    tt_fence_device();
    return true;
}
TT_DEVICE void tt_lock_release(uint32_t* l) {
    tt_fence_device();
    tt_atomic_exch_u32(l, 0);
}

/*
 * tt_warp_copy: the 32 lanes of a warp copy one chunk (`bytes` from `src` to `dst`)
 * together. Every lane of the warp calls it with the same arguments; it has no
 * collective inside. The staged path copies each chunk between its staging slot and KV
 * memory with it (gio_iocb.cuh), and the copy benchmark times it alone (tt_gio_copy).
 *
 * GPU: consecutive lanes take consecutive 16-byte words, so every load and every store
 * instruction of the warp covers 512 contiguous bytes (coalesced), and each lane issues
 * TT_COPY_DEPTH 128-bit loads before the first store that uses them: a warp has 4 KiB
 * of loads in flight, which across PCIe (a slot is host memory) is what hides the
 * round trip that the old one-word-at-a-time copy paid per 8 bytes.
 *
 * The loads are ld.relaxed.sys (strong, system scope), chosen over the alternatives:
 *   - plain ld.global is weak and may be served from the SM's L1, which is not coherent:
 *     a slot is reused, and a line cached from its previous use would be read back;
 *   - ld.global.cv is a cache operator, which the PTX ISA calls a performance hint on
 *     a weak load: no ordering or coherence guarantee;
 *   - ld.volatile behaves as relaxed.sys on sm_70+, but that is the spelled-out form.
 * A strong system-scope load is performed at the point of coherence for the whole
 * system, so it sees what the drive wrote once the caller has observed the completion
 * (acquire load of the IOCTX status, then tt_fence_system). The writer is a DMA engine,
 * not a PTX thread, so the memory model alone does not promise that; reading past the
 * L1 (and, for host memory, past the GPU's L2) is what makes it hold in practice.
 * The stores are plain; callers fence (tt_fence_system) before anything may depend on
 * the copied bytes. kernels/tests/sass.rs checks the machine code: 128-bit loads and
 * stores, several loads in flight before the first dependent store.
 *
 * Host: lanes are fibers of one OS thread that run one after another between
 * collectives, so splitting the chunk among them buys nothing: lane 0 copies it with
 * memcpy. (Each lane copying its 1/32, tried first, made every lane walk all the chunks
 * a warp copies between two collectives: 0.47-0.63x memcpy at 32-128 KiB chunks in tutti
 * bench staged, against 0.78-1.01x this way; docs/perf/staged-copy.md.) The caller's
 * acquire of the completion precedes this on the same OS thread.
 */
#define TT_COPY_DEPTH 8
#if defined(__CUDACC__)
__device__ __noinline__ void tt_warp_copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
    const uint32_t lane = tt_lane_id();
    if ((((uint64_t)dst | (uint64_t)src | bytes) & 15u) == 0) {
        const uint64_t n = bytes >> 4;
        struct tt_u128* d = (struct tt_u128*)dst;
        const struct tt_u128* s = (const struct tt_u128*)src;
        uint64_t k = lane;
        for (; k + (TT_COPY_DEPTH - 1) * TT_WARP_SIZE < n; k += TT_COPY_DEPTH * TT_WARP_SIZE) {
            struct tt_u128 v[TT_COPY_DEPTH];
#pragma unroll
            for (uint32_t j = 0; j < TT_COPY_DEPTH; j++) v[j] = tt_ld_sys_u128(s + k + j * TT_WARP_SIZE);
#pragma unroll
            for (uint32_t j = 0; j < TT_COPY_DEPTH; j++) tt_st_u128(d + k + j * TT_WARP_SIZE, v[j]);
        }
        for (; k < n; k += TT_WARP_SIZE) tt_st_u128(d + k, tt_ld_sys_u128(s + k));
    } else if ((((uint64_t)dst | (uint64_t)src | bytes) & 7u) == 0) {
        /* KV memory that is only 8-byte aligned: the same pattern in 8-byte words. */
        for (uint64_t k = lane; k < bytes / 8u; k += TT_WARP_SIZE)
            ((uint64_t*)dst)[k] = tt_ld_sys_u64((const uint64_t*)src + k);
    } else {
        for (uint64_t k = lane; k < bytes; k += TT_WARP_SIZE) tt_st_relaxed_u8(dst + k, tt_ld_relaxed_u8(src + k));
    }
}
#else
TT_DEVICE void tt_warp_copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
    if (tt_lane_id() == 0) memcpy(dst, src, bytes);
}
#endif

#endif /* TUTTI_PORTABLE_CUH */
