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
TT_DEVICE uint32_t tt_warp_match(uint32_t v) { return __match_any_sync(0xFFFFFFFFu, v); }
TT_DEVICE uint64_t tt_warp_shfl_u64(uint64_t v, uint32_t src) {
    return __shfl_sync(0xFFFFFFFFu, (unsigned long long)v, (int)src);
}
TT_DEVICE void tt_syncthreads() { __syncthreads(); }
TT_DEVICE uint32_t tt_popc(uint32_t v) { return (uint32_t)__popc(v); }
TT_DEVICE uint32_t tt_ffs(uint32_t v) { return (uint32_t)__ffs((int)v); }

TT_DEVICE void tt_nanosleep(uint32_t ns) { __nanosleep(ns); }
TT_DEVICE uint64_t tt_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#else
/* ----------------------------------------------------------------- host */

#include "../host/runtime.h"

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
TT_DEVICE uint32_t tt_warp_match(uint32_t v) { return tt_host_warp_match(v); }
TT_DEVICE uint64_t tt_warp_shfl_u64(uint64_t v, uint32_t src) {
    return tt_host_warp_exchange(v)[src & (TT_WARP_SIZE - 1)];
}
TT_DEVICE void tt_syncthreads() { tt_host_block_sync(); }
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

#endif /* TUTTI_PORTABLE_CUH */
