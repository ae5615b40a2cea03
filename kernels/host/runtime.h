/*
 * runtime.h — what kernel code compiled for the host needs from the lane runtime
 * (runtime.cpp): thread indices, warp collectives, block barriers, per-block
 * shared memory, time and sleep. One OS thread runs one block; its lanes (CUDA
 * threads) are fibers that it switches between at every collective, barrier and
 * sleep.
 */
#ifndef TUTTI_HOST_RUNTIME_H
#define TUTTI_HOST_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

struct tt_host_lane_ctx {
    uint32_t thread_idx;
    uint32_t block_idx;
    uint32_t block_dim;
    uint32_t grid_dim;
    size_t shared_offset; /* bytes of block shared memory handed out so far */
};

/* The lane running on this OS thread now (switched with the fiber). */
extern thread_local struct tt_host_lane_ctx* tt_host_lane;

/* Warp collective: every lane of the warp passes `v`; returns the warp's 32 values (lane i's
 * at [i]), readable until the calling lane's next exchange (double-buffered: no lane can
 * write this buffer again before every lane has passed that next exchange). */
const uint64_t* tt_host_warp_exchange(uint64_t v);
/* Warp collectives with one result per lane, computed once per warp rather than by
 * every lane: the lanes whose `v` equals the caller's (bit i: lane i), and whether
 * any lane passed true. */
uint32_t tt_host_warp_match(uint32_t v);
bool tt_host_warp_any(bool pred);
/* Bit i: lane i passed true (__ballot_sync), computed once per warp like `any`. */
uint32_t tt_host_warp_ballot(bool pred);
/* Ballots of bits 0 .. n-1 (n <= 8) of every lane's `flags` from one exchange: masks[k] bit i
 * is lane i's bit k. */
void tt_host_warp_vote(uint32_t flags, uint32_t* masks, uint32_t n);
/* __syncthreads. */
void tt_host_block_sync(void);
/* Storage shared by the lanes of this block; successive calls get successive chunks. */
void* tt_host_block_shared(size_t bytes);
/* Lets the block's other lanes run for about `ns`; the OS thread sleeps only when
 * no lane of the block can run. */
void tt_host_nanosleep(uint32_t ns);
/* Like tt_host_nanosleep, but the OS thread may block (futex) until `*word` no
 * longer holds `seen`, or `timeout_ns` passes: whoever changes the word wakes it
 * with FUTEX_WAKE. Spurious returns are allowed; callers re-check their condition. */
void tt_host_park(const uint32_t* word, uint32_t seen, uint64_t timeout_ns);
uint64_t tt_host_now_ns(void);
/* Gives the core to another OS thread (sched_yield); the calling lane keeps running after. */
void tt_host_yield(void);

/* Arguments of every host-launched kernel (the kernel picks what it uses). */
struct tt_host_args {
    struct tt_exec_ctx* ctx;
    const uint32_t* ids;
    const uint32_t* seqs;
    uint32_t n;
    uint32_t rsvd;
    uint64_t timeout_ns;
    uint32_t* result;
    const uint64_t* pairs; /* tt_gio_copy */
    uint64_t bytes;        /* tt_gio_copy */
};

typedef void (*tt_host_kernel_fn)(const struct tt_host_args*);

#ifdef __cplusplus
extern "C" {
#endif
/* Starts grid blocks of `block` lanes running `fn`: one OS thread per block. Returns NULL
 * and writes a message to `err` when the shape is invalid or threads or lane stacks cannot
 * be created (no lane runs then). */
void* tt_host_launch_fn(tt_host_kernel_fn fn, uint32_t grid, uint32_t block, const struct tt_host_args* args,
                        char* err, size_t errlen);
/* Starts blocks first .. first+count-1 of a grid of `grid` blocks (block x count lanes): the
 * kernel sees its block index within the whole grid and grid_dim = grid. Same errors as above. */
void* tt_host_launch_blocks_fn(tt_host_kernel_fn fn, uint32_t grid, uint32_t first, uint32_t count, uint32_t block,
                               const struct tt_host_args* args, char* err, size_t errlen);
/* 1 once every lane of the launch has returned. */
int tt_host_launch_finished(void* launch);
/* Waits for every lane, then frees the launch. */
void tt_host_launch_join(void* launch);
/* A block of `block` lanes running `fn` on its callers' threads instead of its own: see
 * tt_host_inline_run (runtime.cpp). NULL with a message in err on failure. */
void* tt_host_inline_new(tt_host_kernel_fn fn, uint32_t block, const struct tt_host_args* args, char* err,
                         size_t errlen);
int tt_host_inline_run(void* h, int start, uint64_t wait_ns);
void tt_host_inline_free(void* h);
/* Wakes every OS thread parked (tt_host_park) on `word`; the caller changed it first. */
void tt_host_wake(uint32_t* word);
#ifdef __cplusplus
}
#endif

#endif /* TUTTI_HOST_RUNTIME_H */
