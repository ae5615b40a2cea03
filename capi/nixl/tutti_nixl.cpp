/* libplugin_TUTTI.so: a NIXL backend that keeps objects in a tutti pool.
 * SPDX-License-Identifier: Apache-2.0
 *
 * A local backend (no remote agents, no notifications) for DRAM <-> OBJ transfers. An OBJ
 * segment is registered with its key in metaInfo; the key names one tutti chunk (a 128-bit
 * hash of the key's bytes under the cache identity `model`), so the pool stays
 * content-addressed: a key is written once, a second write of a stored key is a no-op.
 * One transfer descriptor moves one whole tutti block (`block_bytes`: every layer, K and V, of
 * the geometry) between one block-aligned slot of the registered DRAM region and one object
 * (offset 0). A READ submits one tutti load job, a WRITE one store session; checkXfer polls the
 * job without blocking, fails it past its deadline (`xfer_timeout_ms`), and commits a WRITE
 * when every layer is written. A key that is not stored makes a READ NIXL_ERR_NOT_FOUND before
 * anything moves; a block that fails makes the transfer NIXL_ERR_BACKEND, never a success.
 *
 * FILE segments (what Dynamo KVBM's disk tier registers: one preallocated file, descriptors
 * (offset, length, fd)) are mapped onto pool objects too, the file itself never touched: each
 * WRITE of a block-sized range at an offset stores a new object keyed by (this engine's random
 * nonce, the file's device and inode, the offset, a write generation), and only its commit makes
 * it what a READ of that range gets; until then, and for a range this engine never wrote, a
 * READ is NIXL_ERR_NOT_FOUND. So a rewritten range never reads back older bytes, and a restarted
 * process (a new nonce) never reads the old process's ranges: KVBM's disk file is a fresh
 * temporary file in each process anyway. Superseded generations are evicted by the pool's LRU.
 * Built by scripts/build-nixl-plugin (g++, C++17) against libtutti's C ABI (capi/include). */
#include "nixl_abi.h"
#include "params.h"

#include <tutti.h>

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>

#define TUTTI_NIXL_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using tutti_nixl::dtype_of;
using tutti_nixl::param_defaults;
using tutti_nixl::Params;

constexpr const char *kName = "TUTTI";
constexpr const char *kVersion = "0.1.0";
constexpr size_t kMaxKeyBytes = 4096;

void log_error(const std::string &what) {
    std::fprintf(stderr, "tutti-nixl: %s\n", what.c_str());
}

std::string tutti_err(const char *call, int32_t rc) {
    return std::string(call) + " failed: " + tutti_status_name(rc) + ": " + tutti_last_error();
}

uint64_t now_ms() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
}

/* What registerMem hands back. */
struct TuttiMD : public nixlBackendMD {
    nixl_mem_t mem;
    uintptr_t base = 0;
    size_t len = 0;
    tutti_hash_t hash{};
    std::string key; /* OBJ: the key; FILE: "<nonce>:<st_dev>:<st_ino>" */
    TuttiMD(nixl_mem_t m) : nixlBackendMD(true), mem(m) {}
};

enum class ReqState { Prepared, Running, Done, Failed };

} // namespace

struct TuttiReq : public nixlBackendReqH {
    nixl_xfer_op_t op;
    std::vector<tutti_hash_t> hashes;
    std::vector<uint32_t> blocks;
    std::vector<std::string> keys;
    std::vector<std::string> slots; /* FILE: "<file>:<offset>" per descriptor */
    std::vector<uint64_t> gens;     /* FILE WRITE: the generation each descriptor stores */
    std::vector<uint64_t> pins;
    std::vector<uint64_t> bitmap;
    tutti_job_t *job = nullptr;
    tutti_store_t *store = nullptr;
    uint64_t deadline_ms = 0;
    uint64_t dram_epoch = 0; /* the DRAM registration its block ids belong to */
    ReqState state = ReqState::Prepared;
    nixl_status_t final_status = NIXL_ERR_NOT_POSTED;
};

/* Outside the anonymous namespace so that its vtable's slots carry plain mangled names
 * (tests/nixl/test_nixl_abi.py compares them with the POSIX engine's); hidden all the same. */
class tuttiNixlEngine : public nixlBackendEngine {
public:
    explicit tuttiNixlEngine(const nixlBackendInitParams *init) : nixlBackendEngine(init) {
        try {
            open(Params(getCustomParams()));
        } catch (const std::exception &e) {
            log_error(std::string("backend not created: ") + e.what());
            initErr = true;
        }
    }

    ~tuttiNixlEngine() override {
        if (rt_) {
            if (dram_registered_) tutti_kv_unregister(rt_);
            tutti_runtime_destroy(rt_);
        }
    }

    bool supportsRemote() const override { return false; }
    bool supportsLocal() const override { return true; }
    bool supportsNotif() const override { return false; }
    nixl_mem_list_t getSupportedMems() const override { return {DRAM_SEG, OBJ_SEG, FILE_SEG}; }

    nixl_status_t registerMem(const nixlBlobDesc &mem, const nixl_mem_t &kind, nixlBackendMD *&out) override {
        out = nullptr;
        if (kind == DRAM_SEG) return register_dram(mem, out);
        if (kind == OBJ_SEG) {
            std::unique_ptr<TuttiMD> md(new (std::nothrow) TuttiMD(OBJ_SEG));
            if (!md) return NIXL_ERR_BACKEND;
            md->key = mem.metaInfo.empty() ? std::to_string(mem.devId) : mem.metaInfo;
            if (md->key.size() > kMaxKeyBytes) {
                log_error("OBJ key of " + std::to_string(md->key.size()) + " bytes is longer than " +
                          std::to_string(kMaxKeyBytes));
                return NIXL_ERR_INVALID_PARAM;
            }
            if (!hash_key(md->key, md->hash)) return NIXL_ERR_BACKEND;
            out = md.release();
            return NIXL_SUCCESS;
        }
        if (kind == FILE_SEG) {
            struct stat stt;
            if (mem.devId > static_cast<uint64_t>(INT32_MAX) || fstat(static_cast<int>(mem.devId), &stt) != 0) {
                log_error("FILE segment: devId " + std::to_string(mem.devId) + " is not an open file descriptor");
                return NIXL_ERR_INVALID_PARAM;
            }
            std::unique_ptr<TuttiMD> md(new (std::nothrow) TuttiMD(FILE_SEG));
            if (!md) return NIXL_ERR_BACKEND;
            md->key = std::to_string(nonce_) + ":" + std::to_string(stt.st_dev) + ":" + std::to_string(stt.st_ino);
            md->base = mem.addr;
            md->len = mem.len;
            out = md.release();
            return NIXL_SUCCESS;
        }
        log_error("memory type " + std::to_string(kind) + " is not supported (DRAM, OBJ and FILE are)");
        return NIXL_ERR_NOT_SUPPORTED;
    }

    nixl_status_t deregisterMem(nixlBackendMD *meta) override {
        auto *md = static_cast<TuttiMD *>(meta);
        if (!md) return NIXL_SUCCESS;
        if (md->mem == DRAM_SEG) {
            std::lock_guard<std::mutex> g(mu_);
            if (dram_registered_ && dram_base_ == md->base) {
                int32_t rc = tutti_kv_unregister(rt_);
                if (rc != TUTTI_OK) {
                    log_error(tutti_err("tutti_kv_unregister", rc));
                    return NIXL_ERR_BACKEND; /* transfers still running; the registration stays */
                }
                dram_registered_ = false;
            }
        }
        delete md;
        return NIXL_SUCCESS;
    }

    nixl_status_t connect(const std::string &) override { return NIXL_SUCCESS; }
    nixl_status_t disconnect(const std::string &) override { return NIXL_SUCCESS; }
    /* loadLocalMD hands back the registration itself: nothing to free here. */
    nixl_status_t unloadMD(nixlBackendMD *) override { return NIXL_SUCCESS; }
    nixl_status_t loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) override {
        output = input;
        return NIXL_SUCCESS;
    }

    nixl_status_t prepXfer(const nixl_xfer_op_t &op,
                           const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote,
                           const std::string &,
                           nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t *) const override {
        handle = nullptr;
        std::unique_ptr<TuttiReq> req(new (std::nothrow) TuttiReq());
        if (!req) return NIXL_ERR_BACKEND;
        nixl_status_t st = describe(op, local, remote, *req);
        if (st != NIXL_SUCCESS) return st;
        handle = req.release();
        return NIXL_SUCCESS;
    }

    nixl_status_t postXfer(const nixl_xfer_op_t &op,
                           const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote,
                           const std::string &agent,
                           nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t *opt) const override {
        if (!handle) {
            nixl_status_t st = prepXfer(op, local, remote, agent, handle, opt);
            if (st != NIXL_SUCCESS) return st;
        }
        auto *req = static_cast<TuttiReq *>(handle);
        if (req->state == ReqState::Running) return NIXL_ERR_REPOST_ACTIVE;
        finish(*req); /* a repost of a finished request starts afresh */
        return submit(*req);
    }

    nixl_status_t checkXfer(nixlBackendReqH *handle) const override {
        auto *req = static_cast<TuttiReq *>(handle);
        if (!req) return NIXL_ERR_INVALID_PARAM;
        if (req->state == ReqState::Prepared) return NIXL_ERR_NOT_POSTED;
        if (req->state != ReqState::Running) return req->final_status;
        tutti_job_status_t st;
        std::memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        st.failed_bitmap = req->bitmap.data();
        st.failed_bitmap_words = static_cast<uint32_t>(req->bitmap.size());
        int32_t rc = tutti_job_poll(req->job, &st);
        if (rc == TUTTI_IN_PROGRESS) {
            if (now_ms() < req->deadline_ms) return NIXL_IN_PROG;
            tutti_job_cancel(req->job);
            return fail(*req, "transfer of " + std::to_string(req->blocks.size()) +
                                  " blocks passed its deadline (xfer_timeout_ms=" +
                                  std::to_string(xfer_timeout_ms_) + "); cancelled");
        }
        if (rc != TUTTI_OK) return fail(*req, tutti_err("tutti_job_poll", rc));
        if (st.failed > 0) {
            char why[512] = {0};
            tutti_job_error(req->job, why, sizeof why, nullptr);
            return fail(*req, std::to_string(st.failed) + " of " + std::to_string(st.blocks) +
                                  " blocks failed (first: key '" + first_failed_key(*req) + "'): " + why);
        }
        if (req->op == NIXL_WRITE) {
            std::vector<uint64_t> bm(req->bitmap.size(), 0);
            tutti_store_report_t rep;
            std::memset(&rep, 0, sizeof rep);
            rep.struct_size = sizeof rep;
            rep.failed_bitmap = bm.data();
            rep.failed_bitmap_words = static_cast<uint32_t>(bm.size());
            rc = tutti_store_commit(req->store, &rep);
            if (rc != TUTTI_OK) return fail(*req, tutti_err("tutti_store_commit", rc));
            if (rep.failed > 0)
                return fail(*req, std::to_string(rep.failed) + " blocks were not stored by the commit");
            std::lock_guard<std::mutex> g(mu_);
            for (size_t i = 0; i < req->gens.size(); i++) {
                FileSlot &fs = file_slots_[req->slots[i]];
                if (fs.posted == req->gens[i]) fs.committed = req->gens[i]; /* a later write wins */
            }
        }
        req->state = ReqState::Done;
        req->final_status = NIXL_SUCCESS;
        return NIXL_SUCCESS;
    }

    nixl_status_t releaseReqH(nixlBackendReqH *handle) const override {
        auto *req = static_cast<TuttiReq *>(handle);
        if (!req) return NIXL_SUCCESS;
        finish(*req);
        delete req;
        return NIXL_SUCCESS;
    }

    /* For each OBJ descriptor: an empty dictionary when its key is stored, nothing when not. */
    nixl_status_t queryMem(const nixl_reg_dlist_t &descs, std::vector<nixl_query_resp_t> &resp) const override {
        resp.clear();
        for (int i = 0; i < descs.descCount(); i++) {
            const nixlBlobDesc &d = descs[i];
            std::string key = d.metaInfo.empty() ? std::to_string(d.devId) : d.metaInfo;
            tutti_hash_t h;
            if (key.size() > kMaxKeyBytes || !hash_key(key, h)) return NIXL_ERR_INVALID_PARAM;
            size_t hits = 0;
            int32_t rc = tutti_kv_contains_identity(rt_, model_.c_str(), nullptr, 0, TUTTI_LAYOUT_CONTIGUOUS,
                                                    &h, 1, &hits);
            if (rc != TUTTI_OK) {
                log_error(tutti_err("tutti_kv_contains_identity", rc));
                return NIXL_ERR_BACKEND;
            }
            if (hits == 1)
                resp.emplace_back(nixl_b_params_t{});
            else
                resp.emplace_back(std::nullopt);
        }
        return NIXL_SUCCESS;
    }

private:
    void open(const Params &p) {
        tutti_geometry_t geo{};
        geo.layers = static_cast<uint32_t>(p.num("layers", 4096));
        geo.kv_heads = static_cast<uint32_t>(p.num("kv_heads", 1u << 16));
        geo.head_dim = static_cast<uint32_t>(p.num("head_dim", 1u << 16));
        geo.tokens_per_block = static_cast<uint32_t>(p.num("tokens_per_block", 1u << 20));
        geo.dtype = dtype_of(p.str("dtype"));
        model_ = p.str("model");
        if (model_.empty()) throw std::invalid_argument("backend parameter model is empty");
        xfer_timeout_ms_ = p.num("xfer_timeout_ms", TUTTI_MAX_TIMEOUT_MS);
        if (xfer_timeout_ms_ == 0) throw std::invalid_argument("backend parameter xfer_timeout_ms is 0");
        uint32_t io_timeout = static_cast<uint32_t>(p.num("io_timeout_ms", 600000));
        uint32_t lanes = static_cast<uint32_t>(p.num("host_lane_blocks", 64));
        int32_t rc;
        const std::string &sock = p.str("daemon_socket");
        if (!sock.empty()) {
            tutti_client_config_t c;
            std::memset(&c, 0, sizeof c);
            c.struct_size = sizeof c;
            c.executor = TUTTI_EXECUTOR_GIO_HOST;
            c.socket = sock.c_str();
            c.client_name = "nixl";
            c.io_timeout_ms = io_timeout;
            c.host_lane_blocks = lanes;
            c.geometry = geo;
            rc = tutti_runtime_connect(&c, &rt_);
            if (rc != TUTTI_OK) throw std::runtime_error(tutti_err("tutti_runtime_connect", rc));
        } else {
            tutti_runtime_config_t c;
            std::memset(&c, 0, sizeof c);
            c.struct_size = sizeof c;
            const std::string &drives = p.str("drives");
            const std::string &dir = p.str("pool_dir");
            std::vector<std::string> bdfs;
            std::vector<const char *> bdf_ptrs;
            if (drives == "emulated") {
                c.drives = TUTTI_DRIVES_EMULATED;
                c.emulated_count = static_cast<uint32_t>(p.num("emulated_count", 64));
                c.emulated_capacity_bytes = p.num("emulated_capacity_mb", 1ull << 24) << 20;
                c.emulated_dir = dir.empty() ? nullptr : dir.c_str();
            } else if (drives == "vfio") {
                const std::string &list = p.str("vfio_bdfs");
                size_t start = 0;
                while (start <= list.size()) {
                    size_t comma = list.find(',', start);
                    std::string one = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
                    if (!one.empty()) bdfs.push_back(one);
                    if (comma == std::string::npos) break;
                    start = comma + 1;
                }
                if (bdfs.empty()) throw std::invalid_argument("drives=vfio needs vfio_bdfs (comma-separated PCI addresses)");
                for (const auto &b : bdfs) bdf_ptrs.push_back(b.c_str());
                c.drives = TUTTI_DRIVES_VFIO;
                c.vfio_bdfs = bdf_ptrs.data();
                c.vfio_count = static_cast<uint32_t>(bdf_ptrs.size());
            } else {
                throw std::invalid_argument("backend parameter drives='" + drives + "' is neither emulated nor vfio");
            }
            const std::string &mode = p.str("open_mode");
            if (mode == "create") c.open_mode = TUTTI_OPEN_CREATE;
            else if (mode == "existing") c.open_mode = TUTTI_OPEN_EXISTING;
            else if (mode == "open_or_create") c.open_mode = TUTTI_OPEN_OR_CREATE;
            else throw std::invalid_argument("backend parameter open_mode='" + mode + "' is none of create, existing, open_or_create");
            c.executor = TUTTI_EXECUTOR_GIO_HOST;
            c.geometry = geo;
            c.io_timeout_ms = io_timeout;
            c.host_lane_blocks = lanes;
            rc = tutti_runtime_open(&c, &rt_);
            if (rc != TUTTI_OK) throw std::runtime_error(tutti_err("tutti_runtime_open", rc));
        }
        tutti_runtime_info_t info;
        std::memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        rc = tutti_runtime_info(rt_, &info);
        if (rc != TUTTI_OK) throw std::runtime_error(tutti_err("tutti_runtime_info", rc));
        block_bytes_ = info.file_bytes;
        layers_ = info.geometry.layers;
        uint32_t fail_loads = static_cast<uint32_t>(p.num("fault_fail_next_load", 1u << 20));
        if (fail_loads > 0) inject("fault_fail_next_load", "tutti_emulated_fail_next", fail_loads);
        uint32_t delay = static_cast<uint32_t>(p.num("fault_delay_next_load_ms", TUTTI_MAX_TIMEOUT_MS));
        if (delay > 0) inject("fault_delay_next_load_ms", "tutti_emulated_delay_next", delay);
    }

    /* The emulated drives' fault calls are exported only by a fault-injection build of libtutti:
     * look them up in the libtutti this plugin is linked with, and refuse the parameter without. */
    void inject(const char *param, const char *symbol, uint32_t arg) {
        using fault_fn = int32_t (*)(tutti_runtime_t *, uint32_t, uint32_t, uint32_t);
        Dl_info info;
        void *lib = nullptr;
        if (dladdr(reinterpret_cast<void *>(&tutti_abi_version), &info) && info.dli_fname)
            lib = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
        auto fn = lib ? reinterpret_cast<fault_fn>(dlsym(lib, symbol)) : nullptr;
        if (lib) dlclose(lib);
        if (!fn) throw std::invalid_argument(std::string(param) + " needs a libtutti built with the fault-injection feature");
        int32_t rc = fn(rt_, 0, TUTTI_DIR_LOAD, arg);
        if (rc != TUTTI_OK) throw std::runtime_error(tutti_err(symbol, rc));
    }

    nixl_status_t register_dram(const nixlBlobDesc &mem, nixlBackendMD *&out) {
        std::lock_guard<std::mutex> g(mu_);
        if (dram_registered_) {
            log_error("a second DRAM region is not supported: one region of whole blocks is registered at a time "
                      "(deregister the first)");
            return NIXL_ERR_NOT_SUPPORTED;
        }
        size_t blocks = mem.len / block_bytes_;
        if (blocks == 0 || blocks > UINT32_MAX) {
            log_error("DRAM region of " + std::to_string(mem.len) + " bytes holds no whole tutti block of " +
                      std::to_string(block_bytes_) + " bytes");
            return NIXL_ERR_INVALID_PARAM;
        }
        tutti_kv_layout_t l;
        std::memset(&l, 0, sizeof l);
        l.struct_size = sizeof l;
        l.kind = TUTTI_LAYOUT_CONTIGUOUS;
        l.num_blocks = static_cast<uint32_t>(blocks);
        l.base = mem.addr;
        l.memory = TUTTI_MEMORY_HOST;
        l.model = model_.c_str();
        int32_t rc = tutti_kv_register(rt_, &l, nullptr);
        if (rc != TUTTI_OK) {
            log_error(tutti_err("tutti_kv_register", rc));
            return rc == TUTTI_E_INVALID_ARG ? NIXL_ERR_INVALID_PARAM : NIXL_ERR_BACKEND;
        }
        std::unique_ptr<TuttiMD> md(new (std::nothrow) TuttiMD(DRAM_SEG));
        if (!md) {
            tutti_kv_unregister(rt_);
            return NIXL_ERR_BACKEND;
        }
        md->base = mem.addr;
        md->len = blocks * block_bytes_;
        dram_base_ = mem.addr;
        dram_blocks_ = blocks;
        dram_registered_ = true;
        dram_epoch_++;
        out = md.release();
        return NIXL_SUCCESS;
    }

    static bool hash_key(const std::string &key, tutti_hash_t &out) {
        /* Tokens: a tag, the length, then the key's bytes, four to a token (the last zero-padded). */
        std::vector<uint32_t> tokens(2 + (key.size() + 3) / 4, 0);
        tokens[0] = 0x6e69786cu; /* "nixl" */
        tokens[1] = static_cast<uint32_t>(key.size());
        for (size_t i = 0; i < key.size(); i++)
            tokens[2 + i / 4] |= static_cast<uint32_t>(static_cast<unsigned char>(key[i])) << (8 * (i % 4));
        size_t count = 0;
        int32_t rc = tutti_hash_chain(tokens.data(), tokens.size(), static_cast<uint32_t>(tokens.size()), nullptr,
                                      &out, 1, &count);
        if (rc != TUTTI_OK || count != 1) {
            log_error(tutti_err("tutti_hash_chain", rc));
            return false;
        }
        return true;
    }

    nixl_status_t describe(const nixl_xfer_op_t &op,
                           const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote,
                           TuttiReq &req) const {
        if (op != NIXL_READ && op != NIXL_WRITE) return NIXL_ERR_INVALID_PARAM;
        if (local.getType() != DRAM_SEG || (remote.getType() != OBJ_SEG && remote.getType() != FILE_SEG)) {
            log_error("transfers go between DRAM (local) and OBJ or FILE (remote); got local type " +
                      std::to_string(local.getType()) + ", remote type " + std::to_string(remote.getType()));
            return NIXL_ERR_NOT_SUPPORTED;
        }
        int n = local.descCount();
        if (n != remote.descCount() || n <= 0 || static_cast<size_t>(n) > TUTTI_MAX_BLOCKS_PER_CALL) {
            log_error("a transfer needs as many local as remote descriptors, 1.." +
                      std::to_string(TUTTI_MAX_BLOCKS_PER_CALL) + "; got " + std::to_string(n) + " and " +
                      std::to_string(remote.descCount()));
            return NIXL_ERR_INVALID_PARAM;
        }
        std::lock_guard<std::mutex> g(mu_);
        if (!dram_registered_) {
            log_error("no DRAM region is registered with the TUTTI backend");
            return NIXL_ERR_INVALID_PARAM;
        }
        req.op = op;
        req.dram_epoch = dram_epoch_;
        const bool file = remote.getType() == FILE_SEG;
        if (file) req.slots.resize(n);
        req.hashes.resize(n);
        req.blocks.resize(n);
        req.keys.resize(n);
        std::vector<bool> used(dram_blocks_, false);
        for (int i = 0; i < n; i++) {
            const nixlMetaDesc &l = local[i];
            const nixlMetaDesc &r = remote[i];
            auto *obj = static_cast<const TuttiMD *>(r.metadataP);
            if (!obj || obj->mem != remote.getType()) {
                log_error("remote descriptor " + std::to_string(i) + " has no " + (file ? "FILE" : "OBJ") +
                          " registration of this backend");
                return NIXL_ERR_INVALID_PARAM;
            }
            if (l.len != block_bytes_ || r.len != block_bytes_ || (!file && r.addr != 0)) {
                log_error("descriptor " + std::to_string(i) + " (key '" + obj->key + "'): each moves one whole tutti block of " +
                          std::to_string(block_bytes_) + " bytes at object offset 0; got local " +
                          std::to_string(l.len) + " bytes, remote " + std::to_string(r.len) + " bytes at offset " +
                          std::to_string(r.addr));
                return NIXL_ERR_INVALID_PARAM;
            }
            if (l.addr < dram_base_ || (l.addr - dram_base_) % block_bytes_ != 0 ||
                (l.addr - dram_base_) / block_bytes_ >= dram_blocks_) {
                log_error("local descriptor " + std::to_string(i) + " is not a block-aligned slot of the registered DRAM region");
                return NIXL_ERR_INVALID_PARAM;
            }
            size_t b = (l.addr - dram_base_) / block_bytes_;
            if (used[b]) {
                log_error("local descriptor " + std::to_string(i) + " names a DRAM block another descriptor of the transfer names");
                return NIXL_ERR_INVALID_PARAM;
            }
            used[b] = true;
            req.blocks[i] = static_cast<uint32_t>(b);
            if (file) {
                req.slots[i] = obj->key + ":" + std::to_string(r.addr);
                req.keys[i] = "file range at offset " + std::to_string(r.addr);
            } else {
                req.hashes[i] = obj->hash;
                req.keys[i] = obj->key;
            }
        }
        req.bitmap.assign((static_cast<size_t>(n) + 63) / 64, 0);
        return NIXL_SUCCESS;
    }

    nixl_status_t submit(TuttiReq &req) const {
        size_t n = req.blocks.size();
        int32_t rc;
        {
            std::lock_guard<std::mutex> g(mu_);
            if (!dram_registered_ || req.dram_epoch != dram_epoch_) {
                log_error("the DRAM region this transfer was prepared for is no longer registered");
                return NIXL_ERR_INVALID_PARAM;
            }
        }
        if (!req.slots.empty()) {
            std::lock_guard<std::mutex> g(mu_);
            req.gens.assign(n, 0);
            for (size_t i = 0; i < n; i++) {
                FileSlot &fs = file_slots_[req.slots[i]];
                uint64_t gen;
                if (req.op == NIXL_WRITE) {
                    gen = ++generation_;
                    fs.posted = gen;
                    fs.committed = 0; /* the range reads as a miss until this write commits */
                    req.gens[i] = gen;
                } else if (fs.committed == 0) {
                    log_error(req.keys[i] + " holds nothing this engine committed");
                    req.state = ReqState::Failed;
                    req.final_status = NIXL_ERR_NOT_FOUND;
                    return NIXL_ERR_NOT_FOUND;
                } else {
                    gen = fs.committed;
                }
                if (!hash_key("file:" + req.slots[i] + ":" + std::to_string(gen), req.hashes[i])) return NIXL_ERR_BACKEND;
            }
        }
        if (req.op == NIXL_READ) {
            /* Each key on its own: tutti_load_submit treats its hashes as a chain (from the first
             * missing one on, nothing loads), and NIXL keys are independent. A miss is reported
             * before anything moves; the pins hold the objects until the request is released. */
            for (size_t i = 0; i < n; i++) {
                size_t hits = 0;
                uint64_t pin = 0;
                rc = tutti_kv_lookup(rt_, &req.hashes[i], 1, TUTTI_LOOKUP_PIN, &hits, &pin);
                if (rc != TUTTI_OK) {
                    finish(req);
                    return fail(req, tutti_err("tutti_kv_lookup", rc));
                }
                if (pin) req.pins.push_back(pin);
                if (hits != 1) {
                    finish(req);
                    log_error("key '" + req.keys[i] + "' is not stored");
                    req.state = ReqState::Failed;
                    req.final_status = NIXL_ERR_NOT_FOUND;
                    return NIXL_ERR_NOT_FOUND;
                }
            }
            rc = tutti_load_submit(rt_, req.hashes.data(), req.blocks.data(), n, 0, layers_, &req.job);
            if (rc != TUTTI_OK) {
                finish(req);
                return fail(req, tutti_err("tutti_load_submit", rc));
            }
        } else {
            rc = tutti_store_begin(rt_, req.hashes.data(), req.blocks.data(), n, &req.store);
            if (rc != TUTTI_OK) {
                finish(req);
                return fail(req, tutti_err("tutti_store_begin", rc));
            }
            rc = tutti_store_submit(req.store, 0, layers_, &req.job);
            if (rc != TUTTI_OK) {
                finish(req);
                return fail(req, tutti_err("tutti_store_submit", rc));
            }
        }
        req.deadline_ms = now_ms() + xfer_timeout_ms_;
        req.state = ReqState::Running;
        return NIXL_IN_PROG;
    }

    nixl_status_t fail(TuttiReq &req, const std::string &why) const {
        log_error(why);
        req.state = ReqState::Failed;
        req.final_status = NIXL_ERR_BACKEND;
        return NIXL_ERR_BACKEND;
    }

    static std::string first_failed_key(const TuttiReq &req) {
        for (size_t i = 0; i < req.keys.size(); i++)
            if (req.bitmap[i / 64] >> (i % 64) & 1) return req.keys[i];
        return "?";
    }

    /* Releases what a submission holds: the job (an unfinished one is cancelled and its layers
     * waited for, bounded, by tutti_job_destroy), an uncommitted store (given up), the pins. */
    void finish(TuttiReq &req) const {
        if (req.job) {
            tutti_job_destroy(req.job);
            req.job = nullptr;
        }
        if (req.store) {
            tutti_store_destroy(req.store);
            req.store = nullptr;
        }
        for (uint64_t pin : req.pins) tutti_kv_unpin(rt_, pin);
        req.pins.clear();
        std::fill(req.bitmap.begin(), req.bitmap.end(), 0);
    }

    tutti_runtime_t *rt_ = nullptr;
    uint64_t block_bytes_ = 0;
    uint32_t layers_ = 0;
    uint64_t xfer_timeout_ms_ = 30000;
    std::string model_;
    mutable std::mutex mu_;
    uintptr_t dram_base_ = 0;
    size_t dram_blocks_ = 0;
    bool dram_registered_ = false;
    uint64_t dram_epoch_ = 0;
    /* FILE ranges: the generation last posted and the one committed (0 = none), by range. */
    struct FileSlot {
        uint64_t posted = 0;
        uint64_t committed = 0;
    };
    mutable std::unordered_map<std::string, FileSlot> file_slots_;
    mutable uint64_t generation_ = 0;
    const uint64_t nonce_ = std::random_device{}() * 0x100000000ull + std::random_device{}();

    /* The base class's data layout as the wheel's POSIX engine constructor shows it. */
    static void check_layout();
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
[[maybe_unused]] void tuttiNixlEngine::check_layout() {
    static_assert(offsetof(tuttiNixlEngine, initErr) == 0xa0, "nixlBackendEngine::initErr at 0xa0");
    static_assert(offsetof(tuttiNixlEngine, localAgent) == 0xa8, "nixlBackendEngine::localAgent at 0xa8");
    static_assert(offsetof(tuttiNixlEngine, enableTelemetry_) == 0xc8, "nixlBackendEngine::enableTelemetry_ at 0xc8");
}
#pragma GCC diagnostic pop

namespace {


nixlBackendEngine *create_engine(const nixlBackendInitParams *init) {
    try {
        return new tuttiNixlEngine(init);
    } catch (const std::exception &e) {
        log_error(std::string("backend not created: ") + e.what());
        return nullptr;
    }
}

void destroy_engine(nixlBackendEngine *e) { delete e; }
const char *plugin_name() { return kName; }
const char *plugin_version() { return kVersion; }
nixl_b_params_t backend_options() {
    nixl_b_params_t p;
    for (const auto &kv : param_defaults()) p[kv.first] = "";
    return p;
}
nixl_mem_list_t backend_mems() { return {DRAM_SEG, OBJ_SEG, FILE_SEG}; }

nixlBackendPlugin plugin = {NIXL_PLUGIN_API_VERSION, create_engine, destroy_engine, plugin_name,
                            plugin_version, backend_options, backend_mems};

} // namespace

TUTTI_NIXL_EXPORT nixlBackendPlugin *nixl_plugin_init() {
    if (tutti_abi_version() != TUTTI_ABI_VERSION || tutti_abi_minor() < 9) {
        log_error("libtutti is ABI " + std::to_string(tutti_abi_version()) + "." + std::to_string(tutti_abi_minor()) +
                  "; this plugin needs 1.9 or later");
        return nullptr;
    }
    return &plugin;
}

TUTTI_NIXL_EXPORT void nixl_plugin_fini() {}
