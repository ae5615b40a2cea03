/* kv_roundtrip: the C ABI end to end on emulated drives.
 *
 * Opens a runtime on two emulated NVMe drives, registers host memory as a
 * vLLM-style per-layer KV cache, stores a request's blocks layer range by
 * layer range, loads them into other blocks layer by layer, and checks every
 * byte. Then walks the error paths (NULL and stale handles, wrong struct
 * sizes, bad enums, unknown blocks, bad layer ranges, unknown hashes and
 * pins, double destroy, an injected device error) and checks each status
 * code and message.
 *
 * Build: cc -std=c11 -I capi/include kv_roundtrip.c -L <dir of libtutti.so> -ltutti
 *        (add -DTUTTI_FAULT_INJECTION against a library built with the fault-injection
 *        feature, as the crate's tests do, to check the injected device error too)
 * Run:   kv_roundtrip [media-dir]   (file media in media-dir; RAM media without)
 * Exits 0 when every check passed; prints each failed check. */
#include "tutti.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 4
#define KV_HEADS 2
#define HEAD_DIM 64
#define TOKENS_PER_BLOCK 16
#define NUM_BLOCKS 8
#define REQUEST_BLOCKS 4
#define OBJ_BYTES ((size_t)TOKENS_PER_BLOCK * KV_HEADS * HEAD_DIM * 2) /* bf16 */
#define LAYER_BYTES (2 * NUM_BLOCKS * OBJ_BYTES)                        /* [2, blocks, B, H, D] */
#define WAIT_MS 30000

static int failures;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            failures++;                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, " (last error: %s)\n", tutti_last_error());       \
        }                                                                     \
    } while (0)

/* A call expected to fail with `code` and a message containing `needle`. */
#define EXPECT_ERR(call, code, needle)                                                         \
    do {                                                                                       \
        int32_t rc_ = (call);                                                                  \
        const char *msg_ = tutti_last_error();                                                 \
        if (rc_ != (code) || strstr(msg_, (needle)) == NULL) {                                 \
            failures++;                                                                        \
            fprintf(stderr, "FAIL %s:%d: %s returned %s (%d) \"%s\"; expected %s with \"%s\"\n", \
                    __FILE__, __LINE__, #call, tutti_status_name(rc_), rc_, msg_,              \
                    tutti_status_name(code), (needle));                                        \
        }                                                                                      \
    } while (0)

#define OK(call) CHECK((call) == TUTTI_OK, "%s", #call)

/* The byte at offset i of object (block, layer, kv) of the original request. */
static uint8_t pattern(uint32_t block, uint32_t layer, uint32_t kv, size_t i) {
    return (uint8_t)(block * 131u + layer * 29u + kv * 7u + (uint32_t)(i * 2654435761u >> 13));
}

static uint8_t *object(uint8_t *layers[LAYERS], uint32_t block, uint32_t layer, uint32_t kv) {
    return layers[layer] + (size_t)kv * NUM_BLOCKS * OBJ_BYTES + (size_t)block * OBJ_BYTES;
}

static tutti_runtime_config_t config(const char *dir) {
    tutti_runtime_config_t c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.drives = TUTTI_DRIVES_EMULATED;
    c.emulated_count = 2;
    c.emulated_lba_size = 512;
    c.emulated_capacity_bytes = 16u << 20;
    c.emulated_dir = dir;
    c.executor = TUTTI_EXECUTOR_GIO_HOST;
    c.open_mode = TUTTI_OPEN_CREATE;
    c.geometry.layers = LAYERS;
    c.geometry.kv_heads = KV_HEADS;
    c.geometry.head_dim = HEAD_DIM;
    c.geometry.tokens_per_block = TOKENS_PER_BLOCK;
    c.geometry.dtype = TUTTI_DTYPE_BF16;
    return c;
}

static void config_errors(void) {
    tutti_runtime_t *rt = (tutti_runtime_t *)0x1;
    tutti_runtime_config_t c = config(NULL);
    EXPECT_ERR(tutti_runtime_open(NULL, &rt), TUTTI_E_NULL_POINTER, "tutti_runtime_config_t is NULL");
    CHECK(rt == NULL, "the out handle is cleared on failure");
    EXPECT_ERR(tutti_runtime_open(&c, NULL), TUTTI_E_NULL_POINTER, "out is NULL");
    c.struct_size = sizeof c - 4; /* between two versions' sizes */
    EXPECT_ERR(tutti_runtime_open(&c, &rt), TUTTI_E_STRUCT_SIZE, "struct_size");
    c = config(NULL);
    c.geometry.dtype = 99;
    EXPECT_ERR(tutti_runtime_open(&c, &rt), TUTTI_E_INVALID_ARG, "dtype");
    c = config(NULL);
    c.executor = 7;
    EXPECT_ERR(tutti_runtime_open(&c, &rt), TUTTI_E_INVALID_ARG, "executor");
    c = config(NULL);
    c.emulated_count = 0;
    EXPECT_ERR(tutti_runtime_open(&c, &rt), TUTTI_E_INVALID_ARG, "emulated_count");
    c = config(NULL);
    c.emulated_capacity_bytes = 1000;
    EXPECT_ERR(tutti_runtime_open(&c, &rt), TUTTI_E_INVALID_ARG, "emulated_capacity_bytes");
    c = config(NULL);
    c.geometry.layers = 0;
    EXPECT_ERR(tutti_runtime_open(&c, &rt), TUTTI_E_INVALID_ARG, "layers");
    c = config(NULL);
    c.open_mode = TUTTI_OPEN_EXISTING; /* blank RAM drives hold no pool */
    EXPECT_ERR(tutti_runtime_open(&c, &rt), TUTTI_E_POOL, "pool");
}

static void general(void) {
    char small[4];
    size_t needed = 0;
    CHECK(tutti_abi_version() == TUTTI_ABI_VERSION, "abi %u", tutti_abi_version());
    CHECK(strcmp(tutti_status_name(TUTTI_E_TIMEOUT), "TUTTI_E_TIMEOUT") == 0, "name");
    CHECK(strcmp(tutti_status_name(12345), "TUTTI_UNKNOWN_STATUS") == 0, "unknown name");
    EXPECT_ERR(tutti_runtime_info(NULL, NULL), TUTTI_E_NULL_POINTER, "tutti_runtime_t is NULL");
    CHECK(tutti_last_error_copy(small, sizeof small, &needed) == TUTTI_E_BUFFER_TOO_SMALL, "copy");
    CHECK(needed == strlen(tutti_last_error()) + 1, "needed %zu", needed);
    char *buf = malloc(needed);
    CHECK(tutti_last_error_copy(buf, needed, NULL) == TUTTI_OK && strcmp(buf, tutti_last_error()) == 0, "copy");
    free(buf);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : NULL;
    general();
    config_errors();

    tutti_runtime_config_t cfg = config(dir);
    tutti_runtime_t *rt = NULL;
    OK(tutti_runtime_open(&cfg, &rt));
    if (rt == NULL) return 1;
    CHECK(strcmp(tutti_last_error(), "") == 0, "success clears the message");

    tutti_runtime_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    OK(tutti_runtime_info(rt, &info));
    CHECK(info.object_bytes == OBJ_BYTES && info.drives == 2 && info.formatted_now == 1,
          "object %" PRIu64 " drives %u", info.object_bytes, info.drives);
    CHECK(info.geometry.layers == LAYERS && info.files > NUM_BLOCKS, "files %u", info.files);

    /* Engine KV memory: one [2, NUM_BLOCKS, B, H, D] tensor per layer, page aligned. */
    uint8_t *layers[LAYERS];
    uint64_t bases[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        layers[l] = aligned_alloc(4096, LAYER_BYTES);
        memset(layers[l], 0, LAYER_BYTES);
        bases[l] = (uint64_t)(uintptr_t)layers[l];
    }
    tutti_kv_layout_t kv;
    memset(&kv, 0, sizeof kv);
    kv.struct_size = sizeof kv;
    kv.kind = TUTTI_LAYOUT_VLLM_PER_LAYER;
    kv.num_blocks = NUM_BLOCKS;
    kv.num_layers = LAYERS;
    kv.k_bases = bases;
    kv.memory = TUTTI_MEMORY_HOST;
    kv.model = "capi-example-model";

    tutti_hash_t hashes[REQUEST_BLOCKS];
    uint32_t tokens[REQUEST_BLOCKS * TOKENS_PER_BLOCK + 5]; /* a partial last chunk gets no hash */
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++) tokens[i] = (uint32_t)(1000 + 7 * i);
    size_t n_hashes = 0;
    EXPECT_ERR(tutti_hash_chain(tokens, sizeof tokens / 4, TOKENS_PER_BLOCK, NULL, NULL, 0, &n_hashes),
               TUTTI_E_BUFFER_TOO_SMALL, "needed");
    CHECK(n_hashes == REQUEST_BLOCKS, "%zu hashes needed", n_hashes);
    OK(tutti_hash_chain(tokens, sizeof tokens / 4, TOKENS_PER_BLOCK, NULL, hashes, REQUEST_BLOCKS, &n_hashes));
    /* Chaining from hash 1 reproduces hashes 2 and 3. */
    tutti_hash_t tail[2];
    OK(tutti_hash_chain(tokens + 2 * TOKENS_PER_BLOCK, 2 * TOKENS_PER_BLOCK, TOKENS_PER_BLOCK, &hashes[1], tail, 2,
                          &n_hashes));
    CHECK(memcmp(tail, &hashes[2], sizeof tail) == 0, "a chain continues from its parent");

    size_t hits = 99;
    uint64_t pin = 99;
    EXPECT_ERR(tutti_kv_lookup(rt, hashes, REQUEST_BLOCKS, 0, &hits, NULL), TUTTI_E_NOT_REGISTERED, "registered");

    kv.struct_size = sizeof kv + 4;
    EXPECT_ERR(tutti_kv_register(rt, &kv, NULL), TUTTI_E_STRUCT_SIZE, "tutti_kv_layout_t.struct_size");
    kv.struct_size = sizeof kv;
    kv.kind = 9;
    EXPECT_ERR(tutti_kv_register(rt, &kv, NULL), TUTTI_E_INVALID_ARG, "kind");
    kv.kind = TUTTI_LAYOUT_VLLM_PER_LAYER;
    kv.memory = TUTTI_MEMORY_CUDA;
    EXPECT_ERR(tutti_kv_register(rt, &kv, NULL), TUTTI_E_UNSUPPORTED, "CUDA");
    kv.memory = TUTTI_MEMORY_HOST;
    kv.num_layers = LAYERS - 1;
    EXPECT_ERR(tutti_kv_register(rt, &kv, NULL), TUTTI_E_INVALID_ARG, "num_layers");
    kv.num_layers = LAYERS;
    tutti_table_sizes_t sizes;
    memset(&sizes, 0, sizeof sizes);
    sizes.struct_size = sizeof sizes;
    OK(tutti_kv_register(rt, &kv, &sizes));
    CHECK(sizes.descriptors > 0 && sizes.sgl_bytes > 0, "descriptors %" PRIu64, sizes.descriptors);

    OK(tutti_kv_lookup(rt, hashes, REQUEST_BLOCKS, TUTTI_LOOKUP_PIN, &hits, &pin));
    CHECK(hits == 0 && pin == 0, "nothing stored yet: %zu hits", hits);

    /* The request's KV in blocks 0..3. */
    uint32_t src_blocks[REQUEST_BLOCKS] = {0, 1, 2, 3};
    for (uint32_t b = 0; b < REQUEST_BLOCKS; b++)
        for (uint32_t l = 0; l < LAYERS; l++)
            for (uint32_t k = 0; k < 2; k++) {
                uint8_t *o = object(layers, b, l, k);
                for (size_t i = 0; i < OBJ_BYTES; i++) o[i] = pattern(b, l, k, i);
            }

    /* Store: one session, two jobs of two layers each (as save_kv_layer would). */
    tutti_store_t *st = NULL;
    OK(tutti_store_begin(rt, hashes, src_blocks, REQUEST_BLOCKS, &st));
    tutti_job_t *w0 = NULL, *w1 = NULL;
    OK(tutti_store_submit(st, 0, 2, &w0));
    OK(tutti_store_submit(st, 2, 2, &w1));
    tutti_job_t *w2 = (tutti_job_t *)0x1;
    EXPECT_ERR(tutti_store_submit(st, 3, 2, &w2), TUTTI_E_INVALID_ARG, "layers");
    CHECK(w2 == NULL, "no job on failure");
    uint64_t bitmap[1] = {~0ull};
    tutti_job_status_t js;
    memset(&js, 0, sizeof js);
    js.struct_size = sizeof js;
    js.failed_bitmap = bitmap;
    js.failed_bitmap_words = 1;
    OK(tutti_job_wait(w0, WAIT_MS, &js));
    CHECK(js.done == 1 && js.failed == 0 && bitmap[0] == 0 && js.direction == TUTTI_DIR_STORE,
          "store job: done %u failed %u", js.done, js.failed);
    OK(tutti_job_wait(w1, WAIT_MS, &js));
    CHECK(js.first_layer == 2 && js.num_layers == 2 && js.layers_done == 2, "layers %u", js.layers_done);
    tutti_store_report_t rep;
    memset(&rep, 0, sizeof rep);
    rep.struct_size = sizeof rep;
    OK(tutti_store_commit(st, &rep));
    CHECK(rep.stored == REQUEST_BLOCKS && rep.failed == 0, "stored %u failed %u", rep.stored, rep.failed);
    EXPECT_ERR(tutti_store_commit(st, &rep), TUTTI_E_INVALID_ARG, "already committed");
    OK(tutti_job_destroy(w0));
    OK(tutti_job_destroy(w1));
    OK(tutti_store_destroy(st));

    /* Lookup pins the stored prefix; a changed chunk 3 hits 3. */
    OK(tutti_kv_lookup(rt, hashes, REQUEST_BLOCKS, TUTTI_LOOKUP_PIN, &hits, &pin));
    CHECK(hits == REQUEST_BLOCKS && pin != 0, "%zu hits, pin %" PRIu64, hits, pin);
    tutti_hash_t changed[REQUEST_BLOCKS];
    memcpy(changed, hashes, sizeof changed);
    changed[3].bytes[0] ^= 1;
    size_t hits2 = 0;
    OK(tutti_kv_lookup(rt, changed, REQUEST_BLOCKS, 0, &hits2, NULL));
    CHECK(hits2 == 3, "%zu hits for a changed last chunk", hits2);

    /* Load into blocks 4..7, waiting layer by layer (as wait_for_layer_load would). */
    uint32_t dst_blocks[REQUEST_BLOCKS] = {7, 5, 4, 6};
    tutti_job_t *r = NULL;
    OK(tutti_load_submit(rt, hashes, dst_blocks, REQUEST_BLOCKS, 0, LAYERS, &r));
    for (uint32_t l = 0; l < LAYERS; l++) {
        OK(tutti_job_wait_layer(r, l, WAIT_MS, NULL));
        CHECK(tutti_job_layer_done(r, l) == TUTTI_OK, "layer %u done", l);
    }
    EXPECT_ERR(tutti_job_layer_done(r, LAYERS), TUTTI_E_INVALID_ARG, "not in the job");
    bitmap[0] = ~0ull;
    OK(tutti_job_wait(r, WAIT_MS, &js));
    CHECK(js.done && js.failed == 0 && bitmap[0] == 0 && js.direction == TUTTI_DIR_LOAD, "load failed %u", js.failed);
    CHECK(js.bytes == (uint64_t)REQUEST_BLOCKS * LAYERS * 2 * OBJ_BYTES, "bytes %" PRIu64, js.bytes);
    OK(tutti_job_destroy(r));
    EXPECT_ERR(tutti_job_destroy(r), TUTTI_E_BAD_HANDLE, "not a live tutti_job_t handle");
    OK(tutti_job_destroy(NULL));
    OK(tutti_kv_unpin(rt, pin));
    EXPECT_ERR(tutti_kv_unpin(rt, pin), TUTTI_E_NOT_FOUND, "pin");

    size_t bad = 0;
    for (uint32_t i = 0; i < REQUEST_BLOCKS; i++)
        for (uint32_t l = 0; l < LAYERS; l++)
            for (uint32_t k = 0; k < 2; k++) {
                const uint8_t *o = object(layers, dst_blocks[i], l, k);
                for (size_t x = 0; x < OBJ_BYTES; x++) bad += o[x] != pattern(src_blocks[i], l, k, x);
            }
    CHECK(bad == 0, "%zu loaded bytes differ from what was stored", bad);
    printf("verified %zu bytes loaded back\n", (size_t)REQUEST_BLOCKS * LAYERS * 2 * OBJ_BYTES);

#if defined(TUTTI_FAULT_INJECTION)
    /* A device read error fails exactly the block it hit; the others load intact
     * (needs a libtutti built with the fault-injection feature). */
    memset(layers[0], 0, LAYER_BYTES);
    OK(tutti_emulated_fail_next(rt, 1, TUTTI_DIR_LOAD, 1));
    OK(tutti_load_submit(rt, hashes, dst_blocks, REQUEST_BLOCKS, 0, LAYERS, &r));
    bitmap[0] = 0;
    OK(tutti_job_wait(r, WAIT_MS, &js));
    CHECK(js.failed == 1 && bitmap[0] != 0 && (bitmap[0] & (bitmap[0] - 1)) == 0, "failed %u bitmap %" PRIx64,
          js.failed, bitmap[0]);
    char why_io[256];
    OK(tutti_job_error(r, why_io, sizeof why_io, NULL));
    CHECK(strstr(why_io, "Unrecovered Read Error") != NULL, "job error \"%s\"", why_io);
    OK(tutti_job_destroy(r));
    bad = 0;
    for (uint32_t i = 0; i < REQUEST_BLOCKS; i++) {
        if (bitmap[0] >> i & 1) continue;
        const uint8_t *o = object(layers, dst_blocks[i], 0, 0);
        for (size_t x = 0; x < OBJ_BYTES; x++) bad += o[x] != pattern(src_blocks[i], 0, 0, x);
    }
    CHECK(bad == 0, "%zu bytes of the blocks that did not fail differ", bad);
    EXPECT_ERR(tutti_emulated_fail_next(rt, 2, TUTTI_DIR_LOAD, 1), TUTTI_E_INVALID_ARG, "drive");
#endif

    /* Unknown hash: the job finishes with that block failed, and says why. */
    tutti_hash_t unknown[2] = {hashes[0], changed[3]};
    uint32_t two[2] = {4, 5};
    OK(tutti_load_submit(rt, unknown, two, 2, 0, LAYERS, &r));
    OK(tutti_job_wait(r, WAIT_MS, &js));
    CHECK(js.failed == 1 && bitmap[0] == 2, "failed %u bitmap %" PRIx64, js.failed, bitmap[0]);
    char why[256];
    OK(tutti_job_error(r, why, sizeof why, NULL));
    CHECK(strstr(why, "not stored") != NULL, "job error \"%s\"", why);
    js.failed_bitmap_words = 0;
    EXPECT_ERR(tutti_job_poll(r, &js), TUTTI_E_BUFFER_TOO_SMALL, "failed_bitmap");
    js.failed_bitmap_words = 1;

    /* Bad input on the data path. */
    uint32_t unknown_block[1] = {NUM_BLOCKS};
    uint32_t twice[2] = {1, 1};
    tutti_job_t *none = (tutti_job_t *)0x1;
    EXPECT_ERR(tutti_load_submit(rt, hashes, unknown_block, 1, 0, LAYERS, &none), TUTTI_E_INVALID_ARG,
               "outside the 8 registered blocks");
    CHECK(none == NULL, "no job on failure");
    EXPECT_ERR(tutti_load_submit(rt, hashes, twice, 2, 0, LAYERS, &none), TUTTI_E_INVALID_ARG, "twice");
    EXPECT_ERR(tutti_load_submit(rt, hashes, dst_blocks, 1, 3, 2, &none), TUTTI_E_INVALID_ARG, "layers");
    EXPECT_ERR(tutti_load_submit(rt, hashes, dst_blocks, 1, 0, 0, &none), TUTTI_E_INVALID_ARG, "layers");
    EXPECT_ERR(tutti_load_submit(rt, NULL, dst_blocks, 1, 0, 1, &none), TUTTI_E_NULL_POINTER, "hashes");
    EXPECT_ERR(tutti_load_submit(rt, hashes, dst_blocks, 0, 0, 1, &none), TUTTI_E_INVALID_ARG, "count");
    EXPECT_ERR(tutti_load_submit(rt, hashes, dst_blocks, (size_t)TUTTI_MAX_BLOCKS_PER_CALL + 1, 0, 1, &none),
               TUTTI_E_INVALID_ARG, "one call accepts");
    EXPECT_ERR(tutti_kv_lookup(rt, hashes, 1, 0x80, &hits, NULL), TUTTI_E_INVALID_ARG, "flags");
    EXPECT_ERR(tutti_kv_lookup(rt, hashes, 1, TUTTI_LOOKUP_PIN, &hits, NULL), TUTTI_E_NULL_POINTER, "out_pin");
    EXPECT_ERR(tutti_job_wait(r, TUTTI_MAX_TIMEOUT_MS + 1, NULL), TUTTI_E_INVALID_ARG, "timeout_ms");
    EXPECT_ERR(tutti_job_poll(NULL, NULL), TUTTI_E_NULL_POINTER, "tutti_job_t is NULL");
    EXPECT_ERR(tutti_job_poll((tutti_job_t *)rt, NULL), TUTTI_E_BAD_HANDLE, "not a live tutti_job_t");
    EXPECT_ERR(tutti_kv_lookup((tutti_runtime_t *)r, hashes, 1, 0, &hits, NULL), TUTTI_E_BAD_HANDLE,
               "not a live tutti_runtime_t");
    EXPECT_ERR(tutti_hash_chain(tokens, 16, 0, NULL, hashes, 1, &n_hashes), TUTTI_E_INVALID_ARG,
               "tokens_per_block");
    OK(tutti_job_destroy(r));
    /* An open store session keeps the registration in use; destroying it gives the session up. */
    OK(tutti_store_begin(rt, changed + 3, two, 1, &st));
    EXPECT_ERR(tutti_kv_register(rt, &kv, NULL), TUTTI_E_BUSY, "in flight");
    OK(tutti_store_destroy(st));
    EXPECT_ERR(tutti_store_submit(st, 0, 1, &w0), TUTTI_E_BAD_HANDLE, "not a live tutti_store_t");

    /* Stats. */
    tutti_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    OK(tutti_runtime_stats(rt, &s));
    CHECK(s.bytes_stored == (uint64_t)REQUEST_BLOCKS * LAYERS * 2 * OBJ_BYTES, "stored %" PRIu64, s.bytes_stored);
    /* The request twice (the second time one block short), and one more block. */
    CHECK(s.bytes_loaded == (uint64_t)(2 * REQUEST_BLOCKS + 1) * LAYERS * 2 * OBJ_BYTES - 2 * OBJ_BYTES,
          "loaded %" PRIu64, s.bytes_loaded);
    CHECK(s.files_valid == REQUEST_BLOCKS && s.files_committed == REQUEST_BLOCKS, "valid %u", s.files_valid);
    CHECK(s.jobs_in_flight == 0 && s.stores_open == 0 && s.files_pinned == 0, "in flight %" PRIu64,
          s.jobs_in_flight);
    CHECK(s.lookup_hits >= 2 * REQUEST_BLOCKS && s.lookup_misses >= REQUEST_BLOCKS, "hits %" PRIu64,
          s.lookup_hits);
    /* ABI 1.1: the host's work. Every job here registered its pairs once (gio_uring on the host). */
    CHECK(tutti_abi_minor() >= 1, "ABI minor %u", tutti_abi_minor());
    CHECK(s.pairs_registered > 0 && s.host_pairs == 0 && s.host_calls > 0, "pairs registered %" PRIu64
          ", host pairs %" PRIu64, s.pairs_registered, s.host_pairs);
    /* An engine built against ABI 1.0 passes the smaller struct (its fields end at stores_open):
       it is filled up to there and not a byte further. */
    {
        tutti_stats_t old;
        const size_t old_size = offsetof(tutti_stats_t, host_calls);
        memset(&old, 0xA5, sizeof old);
        old.struct_size = (uint32_t)old_size;
        OK(tutti_runtime_stats(rt, &old));
        CHECK(old.files_valid == s.files_valid && old.bytes_stored == s.bytes_stored, "1.0 stats");
        const unsigned char *tail = (const unsigned char *)&old + old_size;
        for (size_t i = 0; i < sizeof old - old_size; i++)
            CHECK(tail[i] == 0xA5, "byte %zu past a 1.0 tutti_stats_t was written", old_size + i);
    }
    s.struct_size = 8;
    EXPECT_ERR(tutti_runtime_stats(rt, &s), TUTTI_E_STRUCT_SIZE, "tutti_stats_t.struct_size is 8");

    /* Profile hooks. */
    OK(tutti_profile_request_begin(rt, 1, 512, 0));
    OK(tutti_profile_layer_start(rt, 1, 0));
    OK(tutti_profile_layer_end(rt, 1, 0));
    EXPECT_ERR(tutti_profile_layer_end(rt, 1, 1), TUTTI_E_INVALID_ARG, "without a start");
    EXPECT_ERR(tutti_profile_layer(rt, 1, LAYERS, 0, 10), TUTTI_E_PROFILE, "layer");
    EXPECT_ERR(tutti_profile_layer(rt, 2, 0, 0, 10), TUTTI_E_PROFILE, "never began");

    OK(tutti_kv_unregister(rt));
    OK(tutti_runtime_destroy(rt));
    EXPECT_ERR(tutti_runtime_destroy(rt), TUTTI_E_BAD_HANDLE, "not a live tutti_runtime_t");
    OK(tutti_runtime_destroy(NULL));
    for (int l = 0; l < LAYERS; l++) free(layers[l]);

    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("kv_roundtrip: all checks passed\n");
    return 0;
}
