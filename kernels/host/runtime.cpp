// runtime.cpp — runs CUDA-style kernels on host threads.
//
// A launch of grid x block lanes creates one pthread per lane (or a launch of
// some consecutive blocks of a grid: the CUDA stand-in starts each block as an
// SM has room for it). Lanes of a warp
// (32 consecutive threads of a block) meet at a barrier for every collective;
// lanes of a block meet at another for __syncthreads. A lane that returns
// drops out of both barriers, so lanes still running never wait for it.
// Threads are created behind a gate: if any creation fails, no lane runs
// kernel code and the launch reports the error.

#include "runtime.h"

#include <atomic>
#include <barrier>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <vector>

thread_local tt_host_lane_ctx tt_host_lane;

namespace {

constexpr size_t kSharedBytes = 16384;
constexpr size_t kLaneStack = 512 * 1024;
constexpr uint32_t kMaxLanes = 4096;

struct Warp {
    explicit Warp(ptrdiff_t lanes) : bar(lanes) {}
    std::barrier<> bar;
    uint64_t slots[32] = {};
};

struct Block {
    explicit Block(uint32_t lanes) : bar(lanes) {
        for (uint32_t w = 0; w < lanes / 32; w++) warps.push_back(std::make_unique<Warp>(32));
    }
    std::barrier<> bar;
    std::vector<std::unique_ptr<Warp>> warps;
    alignas(64) unsigned char shared[kSharedBytes] = {};
};

enum Gate : int { kWait = 0, kGo = 1, kAbort = 2 };

struct Launch;

struct Lane {
    Launch* launch;
    uint32_t block;
    uint32_t thread;
    pthread_t tid;
};

struct Launch {
    tt_host_kernel_fn fn;
    tt_host_args args;
    uint32_t grid;
    uint32_t first; /* block index of blocks[0] within the grid */
    uint32_t block_dim;
    std::vector<std::unique_ptr<Block>> blocks;
    std::vector<Lane> lanes;
    std::atomic<int> gate{kWait};
    std::atomic<uint32_t> finished{0};
};

void* lane_main(void* p) {
    Lane* lane = static_cast<Lane*>(p);
    Launch* l = lane->launch;
    // Blocks (futex) rather than yield-spins: a spinning lane takes CPU from the thread still
    // creating the others, which on a loaded or emulated CPU made a launch's start-up
    // quadratic in its lanes (seconds for 96 lanes on two TCG vCPUs).
    l->gate.wait(kWait, std::memory_order_acquire);
    if (l->gate.load(std::memory_order_acquire) == kGo) {
        Block* b = l->blocks[lane->block].get();
        Warp* w = b->warps[lane->thread / 32].get();
        tt_host_lane = tt_host_lane_ctx{lane->thread, l->first + lane->block, l->block_dim, l->grid, b, w, 0};
        l->fn(&l->args);
        w->bar.arrive_and_drop();
        b->bar.arrive_and_drop();
    }
    l->finished.fetch_add(1, std::memory_order_acq_rel);
    return nullptr;
}

void set_err(char* err, size_t len, const char* msg, int code) {
    if (err && len) snprintf(err, len, "%s%s%s", msg, code ? ": " : "", code ? strerror(code) : "");
}

}  // namespace

void tt_host_warp_exchange(uint64_t v, uint64_t* all) {
    Warp* w = static_cast<Warp*>(tt_host_lane.warp);
    w->slots[tt_host_lane.thread_idx & 31] = v;
    w->bar.arrive_and_wait();
    for (int i = 0; i < 32; i++) all[i] = w->slots[i];
    w->bar.arrive_and_wait();
}

void tt_host_block_sync(void) { static_cast<Block*>(tt_host_lane.block)->bar.arrive_and_wait(); }

void* tt_host_block_shared(size_t bytes) {
    size_t off = tt_host_lane.shared_offset;
    size_t next = off + ((bytes + 15) & ~size_t{15});
    if (next > kSharedBytes) {
        fprintf(stderr, "tutti host runtime: kernel asked for more than %zu bytes of shared memory\n",
                kSharedBytes);
        abort();
    }
    tt_host_lane.shared_offset = next;
    return static_cast<Block*>(tt_host_lane.block)->shared + off;
}

void tt_host_nanosleep(uint32_t ns) {
    // Short waits yield the core: there are far more lanes than cores.
    if (ns < 2000) {
        sched_yield();
        return;
    }
    timespec ts{0, (long)ns};
    nanosleep(&ts, nullptr);
}

uint64_t tt_host_now_ns(void) {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

extern "C" void* tt_host_launch_fn(tt_host_kernel_fn fn, uint32_t grid, uint32_t block, const tt_host_args* args,
                                   char* err, size_t errlen) {
    return tt_host_launch_blocks_fn(fn, grid, 0, grid, block, args, err, errlen);
}

extern "C" void* tt_host_launch_blocks_fn(tt_host_kernel_fn fn, uint32_t grid, uint32_t first, uint32_t count,
                                          uint32_t block, const tt_host_args* args, char* err, size_t errlen) {
    if (!fn || !args) {
        set_err(err, errlen, "no kernel or no arguments", 0);
        return nullptr;
    }
    if (grid == 0 || count == 0 || first >= grid || count > grid - first || block == 0 || block % 32 != 0 ||
        (uint64_t)count * block > kMaxLanes) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "invalid launch shape: blocks %u..%u of a grid of %u, %u threads each (block a multiple of 32, "
                 "at most %u lanes)",
                 first, first + count, grid, block, kMaxLanes);
        set_err(err, errlen, msg, 0);
        return nullptr;
    }
    Launch* l = new (std::nothrow) Launch();
    if (!l) {
        set_err(err, errlen, "out of memory", 0);
        return nullptr;
    }
    try {
        l->fn = fn;
        l->args = *args;
        l->grid = grid;
        l->first = first;
        l->block_dim = block;
        for (uint32_t b = 0; b < count; b++) l->blocks.push_back(std::make_unique<Block>(block));
        l->lanes.resize((size_t)count * block);
    } catch (...) {
        delete l;
        set_err(err, errlen, "out of memory", 0);
        return nullptr;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, kLaneStack);
    size_t started = 0;
    int rc = 0;
    for (uint32_t b = 0; b < count && rc == 0; b++) {
        for (uint32_t t = 0; t < block; t++) {
            Lane& lane = l->lanes[(size_t)b * block + t];
            lane = Lane{l, b, t, {}};
            rc = pthread_create(&lane.tid, &attr, lane_main, &lane);
            if (rc != 0) break;
            started++;
        }
    }
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        l->gate.store(kAbort, std::memory_order_release);
        l->gate.notify_all();
        for (size_t i = 0; i < started; i++) pthread_join(l->lanes[i].tid, nullptr);
        delete l;
        set_err(err, errlen, "cannot create lane threads", rc);
        return nullptr;
    }
    l->gate.store(kGo, std::memory_order_release);
    l->gate.notify_all();
    return l;
}

extern "C" int tt_host_launch_finished(void* launch) {
    Launch* l = static_cast<Launch*>(launch);
    return l->finished.load(std::memory_order_acquire) == l->lanes.size();
}

extern "C" void tt_host_launch_join(void* launch) {
    Launch* l = static_cast<Launch*>(launch);
    for (Lane& lane : l->lanes) pthread_join(lane.tid, nullptr);
    delete l;
}
