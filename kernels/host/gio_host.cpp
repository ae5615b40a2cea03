// gio_host.cpp — the kernels of cuda/gio.cu compiled for host lanes, and the
// entry points the Rust host executor calls (kernels/src/host.rs).

#include "../cuda/gio.cu"

namespace {
void run_issue(const tt_host_args* a) { tt_gio_issue(a->ctx); }
void run_persistent(const tt_host_args* a) { tt_gio_persistent(a->ctx); }
void run_wait(const tt_host_args* a) { tt_gio_wait(a->ctx, a->ids, a->seqs, a->n, a->timeout_ns, a->result); }
void run_copy(const tt_host_args* a) { tt_gio_copy(a->pairs, a->n, a->bytes); }
}  // namespace

extern "C" {

/* Kernel ids, as in kernels/src/host.rs. */
static tt_host_kernel_fn kernel_fn(uint32_t kernel) {
    return kernel == 1   ? run_issue
           : kernel == 2 ? run_persistent
           : kernel == 3 ? run_wait
           : kernel == 4 ? run_copy
                         : nullptr;
}

void* tt_host_launch(uint32_t kernel, uint32_t grid, uint32_t block, const tt_host_args* args, char* err,
                     size_t errlen) {
    return tt_host_launch_fn(kernel_fn(kernel), grid, block, args, err, errlen);
}

/* Blocks first .. first+count-1 of a grid of `grid` blocks. */
void* tt_host_launch_blocks(uint32_t kernel, uint32_t grid, uint32_t first, uint32_t count, uint32_t block,
                            const tt_host_args* args, char* err, size_t errlen) {
    return tt_host_launch_blocks_fn(kernel_fn(kernel), grid, first, count, block, args, err, errlen);
}

/* One block run on its callers' threads (runtime.cpp, tt_host_inline_run). */
void* tt_host_inline(uint32_t kernel, uint32_t block, const tt_host_args* args, char* err, size_t errlen) {
    return tt_host_inline_new(kernel_fn(kernel), block, args, err, errlen);
}

/* The executor's ring operations, callable from Rust tests and benches. */
int tt_host_ring_pop(tt_ring* r, uint64_t* out) { return tt_ring_pop(r, out) ? 1 : 0; }
int tt_host_ring_push(tt_ring* r, uint64_t v) { return tt_ring_push(r, v) ? 1 : 0; }

}  // extern "C"
