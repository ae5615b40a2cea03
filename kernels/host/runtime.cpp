// runtime.cpp — runs CUDA-style kernels on host threads.
//
// One OS thread runs one block. The block's lanes (its CUDA threads) are fibers,
// each with its own stack, that the thread switches between cooperatively: a lane
// runs until it reaches a warp collective, a __syncthreads, a sleep or a park, then
// the next lane that can run takes over. Collectives and barriers are therefore
// plain counters (no atomics, no futexes), and a block costs one OS thread
// whatever its lane count: on a machine with few cores the work, not the OS
// scheduler juggling a hundred threads at barriers, sets the cost.
//
// The OS thread sleeps only when no lane of its block can run: until the earliest
// lane's sleep ends, or, when lanes are parked on a word (tt_host_park), in a
// futex wait on it, so an idle persistent kernel blocks instead of polling.
//
// A lane that returns drops out of its warp's and block's barriers, so lanes still
// running never wait for it. Threads are created behind a gate: if any creation
// fails, no lane runs kernel code and the launch reports the error.
//
// The kernels are C-like code: no exceptions cross a fiber, and nothing they call
// keeps state that depends on the OS thread beyond this file's own.

#include "runtime.h"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <linux/futex.h>
#include <memory>
#include <new>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

/* Under valgrind, lane stacks are registered as stacks: otherwise a switch between two
 * neighbouring lane stacks looks to it like a stack pointer moving within one stack, and
 * it reports the other stack's live frames as invalid accesses. The requests cost a few
 * instructions when not under valgrind. The valgrind package installs the header. */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define TT_HOST_VALGRIND 1
#endif
#endif

thread_local tt_host_lane_ctx* tt_host_lane;

namespace {

constexpr size_t kSharedBytes = 16384;
/* Lane stacks: the kernels use a few KiB; pages are only backed once touched. */
constexpr size_t kLaneStack = 256 * 1024;
constexpr size_t kGuard = 4096;
constexpr uint32_t kMaxLanes = 4096;
/* A sleeping lane this close to its wake-up time may run: host sleeps are back-off
 * hints, and waking a warp's lanes together saves an OS sleep per lane. */
constexpr uint64_t kSlackNs = 5000;
/* Below this the OS thread yields the core instead of sleeping. */
constexpr uint64_t kYieldNs = 2000;
constexpr uint64_t kInlineYieldNs = 50000;

/* ------------------------------------------------------------- contexts */

struct Ctx {
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
};

extern "C" void tt_host_fiber_entry();

#if defined(__x86_64__)
// tt_host_fiber_switch(from, to): saves the callee-saved registers (SysV) on the current
// stack and its stack pointer in *from, then resumes the stack in `to` the same way.
// A fresh stack is laid out (ctx_init) so that the first resume "returns" into the
// trampoline, which calls the address it finds in r12 (tt_host_fiber_entry).
asm(R"(
    .text
    .p2align 4
    .globl tt_host_fiber_switch
    .hidden tt_host_fiber_switch
    .type tt_host_fiber_switch,@function
tt_host_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size tt_host_fiber_switch, .-tt_host_fiber_switch

    .p2align 4
    .globl tt_host_fiber_trampoline
    .hidden tt_host_fiber_trampoline
    .type tt_host_fiber_trampoline,@function
tt_host_fiber_trampoline:
    callq *%r12
    ud2
    .size tt_host_fiber_trampoline, .-tt_host_fiber_trampoline
)");

extern "C" void tt_host_fiber_switch(void** from, void* to);
extern "C" void tt_host_fiber_trampoline();

void ctx_init(Ctx* c, unsigned char* lo, size_t size) {
    // The top, 16-aligned; after the six pops and the ret, rsp = top - 16, so the
    // trampoline's call enters the function with rsp = 8 (mod 16) as the ABI wants.
    uintptr_t top = ((uintptr_t)(lo + size)) & ~(uintptr_t)15;
    void** sp = (void**)(top - 72);
    sp[0] = nullptr;                                 // r15
    sp[1] = nullptr;                                 // r14
    sp[2] = nullptr;                                 // r13
    sp[3] = (void*)&tt_host_fiber_entry;             // r12
    sp[4] = nullptr;                                 // rbx
    sp[5] = nullptr;                                 // rbp
    sp[6] = (void*)&tt_host_fiber_trampoline;        // return address
    c->sp = sp;
}

inline void ctx_switch(Ctx* from, Ctx* to) { tt_host_fiber_switch(&from->sp, to->sp); }
#else
// Other architectures: ucontext (correct, but each switch is a system call).
void ctx_init(Ctx* c, unsigned char* lo, size_t size) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = lo;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, (void (*)())tt_host_fiber_entry, 0);
}
inline void ctx_switch(Ctx* from, Ctx* to) { swapcontext(&from->uc, &to->uc); }
#endif

/* ---------------------------------------------------------- scheduling */

enum State : uint8_t { kRun, kBarrier, kSleep, kPark, kDone };

struct Barrier {
    uint32_t expected = 0; /* lanes still running */
    uint32_t arrived = 0;
    uint32_t gen = 0;
    uint32_t first = 0; /* member lanes: first .. first + count */
    uint32_t count = 0;
};

struct Warp {
    Barrier bar;
    /* Double-buffered by barrier generation: a lane cannot reach exchange g + 2 before
     * every lane has read exchange g (it needs them all at g + 1 first). */
    uint64_t slots[2][32] = {};
    /* What tt_host_warp_match and tt_host_warp_ballot derive from slots[buf]: computed once,
     * by the first lane to read it after the exchange (*_gen[buf] is then the barrier
     * generation that exchange completed), not once per lane. */
    uint32_t match[2][32] = {};
    uint32_t match_gen[2] = {~0u, ~0u};
    uint32_t ballot[2] = {};
    uint32_t ballot_gen[2] = {~0u, ~0u};
    uint32_t vote[2][8] = {};
    uint32_t vote_gen[2] = {~0u, ~0u};
};

struct Lane {
    Ctx ctx;
    tt_host_lane_ctx id{};
    State state = kRun;
    Barrier* waiting = nullptr;
    uint64_t wake = 0;
    const uint32_t* park_word = nullptr;
    uint32_t park_seen = 0;
};

enum Gate : int { kWait = 0, kGo = 1, kAbort = 2 };

struct Launch;

struct BlockRun {
    Launch* launch = nullptr;
    uint32_t index = 0; /* within the launch */
    pthread_t tid{};
    std::vector<Lane> lanes;
    std::vector<Warp> warps;
    Barrier block_bar;
    uint32_t cur = 0;
    uint32_t live = 0;
    uint64_t now_hint = 0; /* a clock reading for run_next (0: none) */
    /* Run by its caller (tt_host_inline_run) rather than by a thread of its own: when no
     * lane can run, run_next goes back to the caller once `deadline` (ns) has passed. */
    bool inline_run = false;
    uint64_t deadline = 0;
    Ctx main;
    unsigned char* stacks = nullptr;
    size_t stacks_len = 0;
    std::vector<unsigned> stack_ids; /* valgrind's ids of the registered lane stacks */
    alignas(64) unsigned char shared[kSharedBytes] = {};

    ~BlockRun() {
#if defined(TT_HOST_VALGRIND)
        for (unsigned id : stack_ids) VALGRIND_STACK_DEREGISTER(id);
#endif
        if (stacks) munmap(stacks, stacks_len);
    }
};

struct Launch {
    tt_host_kernel_fn fn;
    tt_host_args args;
    uint32_t grid;
    uint32_t first; /* block index of blocks[0] within the grid */
    uint32_t block_dim;
    std::vector<std::unique_ptr<BlockRun>> blocks;
    std::atomic<int> gate{kWait};
    std::atomic<uint32_t> finished{0};
};

thread_local BlockRun* t_block;

uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void sleep_ns(uint64_t ns) {
    timespec ts{(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, nullptr);
}

void futex_wait(const uint32_t* word, uint32_t seen, uint64_t ns) {
    timespec ts{(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void switch_to(BlockRun* b, uint32_t i) {
    if (i == b->cur) return;
    Lane* from = &b->lanes[b->cur];
    b->cur = i;
    tt_host_lane = &b->lanes[i].id;
    ctx_switch(&from->ctx, &b->lanes[i].ctx);
}

[[noreturn]] void deadlock(BlockRun* b) {
    fprintf(stderr,
            "tutti host runtime: block %u: every live lane waits at a barrier that cannot complete "
            "(a kernel called a collective from part of a warp or block)\n",
            b->lanes.empty() ? 0u : b->lanes[0].id.block_idx);
    abort();
}

/* Runs the next lane that can run, after the current one (which runs again last, if it
 * can). Returns once the current lane is picked again. When no lane can run, the OS
 * thread waits for the earliest one that will. */
void run_next(BlockRun* b) {
    const uint32_t n = (uint32_t)b->lanes.size();
    /* A reading the caller just took (a lane going to sleep), for the first pass:
     * an older time only makes a sleeper ready later, by nanoseconds. */
    uint64_t hint = b->now_hint;
    b->now_hint = 0;
    for (;;) {
        uint64_t now = hint;
        hint = 0;
        for (uint32_t k = 1; k <= n; k++) {
            uint32_t i = b->cur + k;
            if (i >= n) i -= n;
            Lane& l = b->lanes[i];
            bool ready = l.state == kRun;
            if (l.state == kPark && __atomic_load_n(l.park_word, __ATOMIC_ACQUIRE) != l.park_seen) ready = true;
            if (!ready && (l.state == kSleep || l.state == kPark)) {
                if (!now) now = now_ns();
                ready = l.wake <= now + kSlackNs;
            }
            if (ready) {
                l.state = kRun;
                switch_to(b, i);
                return;
            }
        }
        if (b->live == 0) {
            /* Only a returning lane gets here: back to the block thread, never to return. */
            Lane* from = &b->lanes[b->cur];
            ctx_switch(&from->ctx, &b->main);
            abort(); /* unreachable: nothing resumes a finished lane */
        }
        uint64_t earliest = UINT64_MAX;
        const Lane* parked = nullptr;
        for (const Lane& l : b->lanes) {
            if (l.state != kSleep && l.state != kPark) continue;
            if (l.wake < earliest) earliest = l.wake;
            if (l.state == kPark && !parked) parked = &l;
        }
        if (earliest == UINT64_MAX) deadlock(b);
        now = now_ns();
        if (earliest <= now + kSlackNs) continue;
        if (b->inline_run) {
            if (now >= b->deadline) {
                /* Back to the caller; its next run resumes this scan. */
                ctx_switch(&b->lanes[b->cur].ctx, &b->main);
                continue;
            }
            if (b->deadline < earliest) earliest = b->deadline;
        }
        const uint64_t dt = earliest - now;
        /* A caller-driven block yields rather than sleeps for longer: its thread's
         * timer slack is the caller's (50 us by default), not ours. */
        if (dt < (b->inline_run ? kInlineYieldNs : kYieldNs))
            sched_yield();
        else if (parked)
            futex_wait(parked->park_word, parked->park_seen, dt);
        else
            sleep_ns(dt);
    }
}

void release(BlockRun* b, Barrier* bar) {
    bar->arrived = 0;
    bar->gen++;
    for (uint32_t i = bar->first; i < bar->first + bar->count; i++) {
        Lane& l = b->lanes[i];
        if (l.state == kBarrier && l.waiting == bar) {
            l.state = kRun;
            l.waiting = nullptr;
        }
    }
}

void arrive_and_wait(BlockRun* b, Barrier* bar) {
    if (++bar->arrived >= bar->expected) {
        release(b, bar);
        return;
    }
    Lane& me = b->lanes[b->cur];
    me.state = kBarrier;
    me.waiting = bar;
    run_next(b);
}

void arrive_and_drop(BlockRun* b, Barrier* bar) {
    bar->expected--;
    if (bar->expected != 0 && bar->arrived >= bar->expected) release(b, bar);
}

void set_err(char* err, size_t len, const char* msg, int code) {
    if (err && len) snprintf(err, len, "%s%s%s", msg, code ? ": " : "", code ? strerror(code) : "");
}

void* block_main(void* p) {
    BlockRun* b = static_cast<BlockRun*>(p);
    Launch* l = b->launch;
    // Blocks (futex) rather than spins: the thread creating the others needs the core.
    l->gate.wait(kWait, std::memory_order_acquire);
    if (l->gate.load(std::memory_order_acquire) == kGo) {
        // Sleeps of a few microseconds are back-off between polls: do not let the
        // kernel's default 50 us timer slack stretch them.
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
        // One name for every block thread: how tools and tests find the executor's threads.
        pthread_setname_np(pthread_self(), "tutti-block");
        t_block = b;
        b->cur = 0;
        tt_host_lane = &b->lanes[0].id;
        ctx_switch(&b->main, &b->lanes[0].ctx);
        t_block = nullptr;
        tt_host_lane = nullptr;
    }
    l->finished.fetch_add(1, std::memory_order_acq_rel);
    return nullptr;
}

void lanes_reset(BlockRun* b);

/* Sets up block `index` of a launch: lanes, barriers, stacks. Returns 0 or an errno. */
int block_init(Launch* l, BlockRun* b, uint32_t index) {
    const uint32_t n = l->block_dim;
    b->launch = l;
    b->index = index;
    b->lanes.resize(n);
    b->warps.resize(n / 32);
    b->live = n;
    b->block_bar.expected = n;
    b->block_bar.count = n;
    for (uint32_t w = 0; w < n / 32; w++) {
        b->warps[w].bar.expected = 32;
        b->warps[w].bar.first = w * 32;
        b->warps[w].bar.count = 32;
    }
    const size_t per = kLaneStack + kGuard;
    b->stacks_len = per * n;
    void* m = mmap(nullptr, b->stacks_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
        b->stacks = nullptr;
        return errno;
    }
    b->stacks = static_cast<unsigned char*>(m);
    for (uint32_t t = 0; t < n; t++) {
        unsigned char* lo = b->stacks + per * t;
        /* A guard page below each stack: an overflow faults instead of corrupting a neighbour. */
        if (mprotect(lo, kGuard, PROT_NONE) != 0) return errno;
        Lane& lane = b->lanes[t];
        lane.id = tt_host_lane_ctx{t, l->first + index, n, l->grid, 0};
#if defined(TT_HOST_VALGRIND)
        b->stack_ids.push_back(VALGRIND_STACK_REGISTER(lo + kGuard, lo + kGuard + kLaneStack));
#endif
    }
    lanes_reset(b);
    return 0;
}

/* Every lane of `b` at the start of the kernel, none waiting anywhere. */
void lanes_reset(BlockRun* b) {
    const uint32_t n = (uint32_t)b->lanes.size();
    const size_t per = kLaneStack + kGuard;
    b->live = n;
    b->cur = 0;
    b->block_bar.expected = n;
    b->block_bar.arrived = 0;
    for (Warp& w : b->warps) {
        w.bar.expected = 32;
        w.bar.arrived = 0;
    }
    for (uint32_t t = 0; t < n; t++) {
        unsigned char* lo = b->stacks + per * t;
        Lane& lane = b->lanes[t];
        lane.state = kRun;
        lane.waiting = nullptr;
        lane.park_word = nullptr;
        lane.id.shared_offset = 0;
        /* Stack tops 4 KiB apart would put every lane's hot frames in the same L1 sets
         * (a switch then misses on each line it touches): start each lane's stack a
         * different number of cache lines below its top (19 lines, coprime with the
         * 64 sets, spreads 32 lanes over all of them). */
        const size_t stagger = (size_t)(t * 19u % 64u) * 64u;
        ctx_init(&lane.ctx, lo + kGuard, kLaneStack - stagger);
    }
}

/* A launch of blocks first .. first+count-1 of a grid of `grid`, lanes and stacks set
 * up, no thread started. NULL with a message in err on failure. */
Launch* launch_new(tt_host_kernel_fn fn, const tt_host_args* args, uint32_t grid, uint32_t first, uint32_t count,
                   uint32_t block, char* err, size_t errlen) {
    Launch* l = new (std::nothrow) Launch();
    if (!l) {
        set_err(err, errlen, "out of memory", 0);
        return nullptr;
    }
    int rc = 0;
    try {
        l->fn = fn;
        l->args = *args;
        l->grid = grid;
        l->first = first;
        l->block_dim = block;
        for (uint32_t b = 0; b < count && rc == 0; b++) {
            l->blocks.push_back(std::make_unique<BlockRun>());
            rc = block_init(l, l->blocks.back().get(), b);
        }
    } catch (...) {
        delete l;
        set_err(err, errlen, "out of memory", 0);
        return nullptr;
    }
    if (rc != 0) {
        delete l;
        set_err(err, errlen, "cannot map lane stacks", rc);
        return nullptr;
    }
    return l;
}

}  // namespace

extern "C" void tt_host_fiber_entry() {
    BlockRun* b = t_block;
    Launch* l = b->launch;
    l->fn(&l->args);
    const uint32_t t = b->cur;
    Lane& me = b->lanes[t];
    me.state = kDone;
    b->live--;
    arrive_and_drop(b, &b->warps[t / 32].bar);
    arrive_and_drop(b, &b->block_bar);
    run_next(b);
    abort(); /* unreachable: a finished lane is never picked again */
}

const uint64_t* tt_host_warp_exchange(uint64_t v) {
    BlockRun* b = t_block;
    const uint32_t t = b->cur;
    Warp& w = b->warps[t / 32];
    const uint32_t buf = w.bar.gen & 1u;
    w.slots[buf][t & 31] = v;
    arrive_and_wait(b, &w.bar);
    return w.slots[buf];
}

/* Match and ballot: after the exchange into `buf`, the first lane to look computes the
 * warp's result; until this lane's next exchange bar.gen stays the generation this
 * exchange completed, so *_gen[buf] == bar.gen means "already computed". */
uint32_t tt_host_warp_match(uint32_t v) {
    BlockRun* b = t_block;
    Warp& w = b->warps[b->cur / 32];
    const uint32_t buf = w.bar.gen & 1u;
    tt_host_warp_exchange(v);
    if (w.match_gen[buf] != w.bar.gen) {
        /* One pass per distinct value: each group's mask is every member's result. */
        const uint64_t* slot = w.slots[buf];
        for (uint32_t left = 0xFFFFFFFFu; left;) {
            const uint32_t first = (uint32_t)__builtin_ctz(left);
            const uint32_t x = (uint32_t)slot[first];
            uint32_t mask = 0;
            for (uint32_t i = first; i < 32; i++) mask |= (uint32_t)((uint32_t)slot[i] == x) << i;
            for (uint32_t m = mask; m; m &= m - 1) w.match[buf][__builtin_ctz(m)] = mask;
            left &= ~mask;
        }
        w.match_gen[buf] = w.bar.gen;
    }
    return w.match[buf][b->cur & 31];
}

uint32_t tt_host_warp_ballot(bool pred) {
    BlockRun* b = t_block;
    Warp& w = b->warps[b->cur / 32];
    const uint32_t buf = w.bar.gen & 1u;
    tt_host_warp_exchange(pred ? 1 : 0);
    if (w.ballot_gen[buf] != w.bar.gen) {
        uint32_t bits = 0;
        for (uint32_t i = 0; i < 32; i++) bits |= (uint32_t)(w.slots[buf][i] != 0) << i;
        w.ballot[buf] = bits;
        w.ballot_gen[buf] = w.bar.gen;
    }
    return w.ballot[buf];
}

/* Any lane's predicate set: the ballot, not empty. */
bool tt_host_warp_any(bool pred) { return tt_host_warp_ballot(pred) != 0; }

void tt_host_warp_vote(uint32_t flags, uint32_t* masks, uint32_t n) {
    BlockRun* b = t_block;
    Warp& w = b->warps[b->cur / 32];
    const uint32_t buf = w.bar.gen & 1u;
    tt_host_warp_exchange(flags);
    if (w.vote_gen[buf] != w.bar.gen) {
        uint32_t m[8] = {};
        for (uint32_t i = 0; i < 32; i++)
            for (uint32_t k = 0, f = (uint32_t)w.slots[buf][i]; f && k < 8; k++, f >>= 1) m[k] |= (f & 1u) << i;
        memcpy(w.vote[buf], m, sizeof m);
        w.vote_gen[buf] = w.bar.gen;
    }
    for (uint32_t k = 0; k < n && k < 8; k++) masks[k] = w.vote[buf][k];
}

void tt_host_block_sync(void) {
    BlockRun* b = t_block;
    arrive_and_wait(b, &b->block_bar);
}

void* tt_host_block_shared(size_t bytes) {
    size_t off = tt_host_lane->shared_offset;
    size_t next = off + ((bytes + 15) & ~size_t{15});
    if (next > kSharedBytes) {
        fprintf(stderr, "tutti host runtime: kernel asked for more than %zu bytes of shared memory\n",
                kSharedBytes);
        abort();
    }
    tt_host_lane->shared_offset = next;
    return t_block->shared + off;
}

void tt_host_nanosleep(uint32_t ns) {
    BlockRun* b = t_block;
    if (!b) {
        sleep_ns(ns);
        return;
    }
    Lane& me = b->lanes[b->cur];
    me.state = kSleep;
    const uint64_t t = now_ns();
    me.wake = t + ns;
    b->now_hint = t;
    run_next(b);
}

void tt_host_park(const uint32_t* word, uint32_t seen, uint64_t timeout_ns) {
    BlockRun* b = t_block;
    if (!b) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == seen) futex_wait(word, seen, timeout_ns);
        return;
    }
    Lane& me = b->lanes[b->cur];
    me.state = kPark;
    me.park_word = word;
    me.park_seen = seen;
    me.wake = now_ns() + timeout_ns;
    run_next(b);
}

uint64_t tt_host_now_ns(void) { return now_ns(); }

void tt_host_yield(void) { sched_yield(); }

extern "C" void tt_host_wake(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

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
    Launch* l = launch_new(fn, args, grid, first, count, block, err, errlen);
    if (!l) return nullptr;
    int rc = 0;
    size_t started = 0;
    for (auto& b : l->blocks) {
        rc = pthread_create(&b->tid, nullptr, block_main, b.get());
        if (rc != 0) break;
        started++;
    }
    if (rc != 0) {
        l->gate.store(kAbort, std::memory_order_release);
        l->gate.notify_all();
        for (size_t i = 0; i < started; i++) pthread_join(l->blocks[i]->tid, nullptr);
        delete l;
        set_err(err, errlen, "cannot create block threads", rc);
        return nullptr;
    }
    l->gate.store(kGo, std::memory_order_release);
    l->gate.notify_all();
    return l;
}

extern "C" int tt_host_launch_finished(void* launch) {
    Launch* l = static_cast<Launch*>(launch);
    return l->finished.load(std::memory_order_acquire) == l->blocks.size();
}

extern "C" void tt_host_launch_join(void* launch) {
    Launch* l = static_cast<Launch*>(launch);
    for (auto& b : l->blocks) pthread_join(b->tid, nullptr);
    delete l;
}

/* ------------------------------------------------------------ inline runs */

/* One block of `block` lanes running `fn` on the threads of its callers, one call at a
 * time (tt_host_inline_run): no thread of its own. */
extern "C" void* tt_host_inline_new(tt_host_kernel_fn fn, uint32_t block, const tt_host_args* args, char* err,
                                    size_t errlen) {
    if (!fn || !args) {
        set_err(err, errlen, "no kernel or no arguments", 0);
        return nullptr;
    }
    if (block == 0 || block % 32 != 0 || block > kMaxLanes) {
        char msg[160];
        snprintf(msg, sizeof msg, "invalid inline block of %u threads (a multiple of 32, at most %u)", block,
                 kMaxLanes);
        set_err(err, errlen, msg, 0);
        return nullptr;
    }
    Launch* l = launch_new(fn, args, 1, 0, 1, block, err, errlen);
    if (!l) return nullptr;
    BlockRun* b = l->blocks[0].get();
    b->inline_run = true;
    b->live = 0; /* not started: the first run with start = 1 starts it */
    return l;
}

/* Runs the block on the calling thread until no lane can run and `wait_ns` has
 * passed, or until every lane has returned; meanwhile it sleeps as a block thread
 * would, but never past that. A block whose lanes have all returned is started
 * afresh first if `start`. Returns 1 once every lane has returned (the kernel is
 * not running), else 0. Not for concurrent callers. */
extern "C" int tt_host_inline_run(void* h, int start, uint64_t wait_ns) {
    Launch* l = static_cast<Launch*>(h);
    BlockRun* b = l->blocks[0].get();
    if (b->live == 0) {
        if (!start) return 1;
        lanes_reset(b);
    }
    BlockRun* const saved_block = t_block;
    tt_host_lane_ctx* const saved_lane = tt_host_lane;
    const uint64_t now = now_ns();
    b->deadline = wait_ns > UINT64_MAX - now ? UINT64_MAX : now + wait_ns;
    t_block = b;
    tt_host_lane = &b->lanes[b->cur].id;
    ctx_switch(&b->main, &b->lanes[b->cur].ctx);
    t_block = saved_block;
    tt_host_lane = saved_lane;
    return b->live == 0 ? 1 : 0;
}

/* Frees an inline block. Lanes that have not returned are dropped where they wait. */
extern "C" void tt_host_inline_free(void* h) { delete static_cast<Launch*>(h); }
