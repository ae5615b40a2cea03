/* tutti: the part of NIXL's backend-plugin interface that libplugin_TUTTI.so implements.
 * SPDX-License-Identifier: Apache-2.0
 *
 * NIXL ships no headers in its wheel, and its headers are not ours to copy. These are our own
 * declarations of the types a NIXL agent (pinned: nixl 1.5.1) exchanges with a backend plugin,
 * written from the interface's documented facts: the type and member names (they are part of
 * the C++ mangled names the agent and the plugin must agree on), the member order and types
 * (they fix the layout the agent's inline code reads), the order of nixlBackendEngine's virtual
 * functions (they fix its vtable), NIXL_PLUGIN_API_VERSION and the two extern "C" entry points.
 *
 * What checks them: capi/python/tests/nixl/test_nixl_abi.py compares the vtable this plugin
 * emits for nixlBackendEngine, slot by slot (mangled name or pure virtual), and its size, with
 * the one in the wheel's own libplugin_POSIX.so, and the plugin's overrides with the POSIX
 * engine's; a NIXL upgrade that moves, adds or retypes a virtual fails that test. The data
 * layout (offsets the agent reads inline, e.g. initErr) is pinned by the static_asserts below,
 * taken from the wheel's POSIX engine constructor (stores at 0xa0 initErr, 0xa8 localAgent,
 * 0xc8 enableTelemetry_; reads of the init params at 0x40 and 0x5c).
 *
 * Only what the plugin needs is declared: a descriptor list is read, never built, here. */
#ifndef TUTTI_NIXL_ABI_H
#define TUTTI_NIXL_ABI_H

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

/* Segment kinds (FILE_SEG last). */
enum nixl_mem_t { DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG };

/* READ: remote -> local; WRITE: local -> remote. */
enum nixl_xfer_op_t { NIXL_READ, NIXL_WRITE };

enum nixl_status_t {
    NIXL_IN_PROG = 1,
    NIXL_SUCCESS = 0,
    NIXL_ERR_NOT_POSTED = -1,
    NIXL_ERR_INVALID_PARAM = -2,
    NIXL_ERR_BACKEND = -3,
    NIXL_ERR_NOT_FOUND = -4,
    NIXL_ERR_MISMATCH = -5,
    NIXL_ERR_NOT_ALLOWED = -6,
    NIXL_ERR_REPOST_ACTIVE = -7,
    NIXL_ERR_UNKNOWN = -8,
    NIXL_ERR_NOT_SUPPORTED = -9,
    NIXL_ERR_REMOTE_DISCONNECT = -10,
    NIXL_ERR_CANCELED = -11,
    NIXL_ERR_NO_TELEMETRY = -12
};

enum class nixl_thread_sync_t { NIXL_THREAD_SYNC_NONE, NIXL_THREAD_SYNC_STRICT, NIXL_THREAD_SYNC_RW };
enum class nixl_cost_t { ANALYTICAL_BACKEND = 0 };

using nixl_backend_t = std::string;
using nixl_blob_t = std::string;
using nixl_mem_list_t = std::vector<nixl_mem_t>;
using nixl_b_params_t = std::unordered_map<std::string, std::string>;
using nixl_query_resp_t = std::optional<nixl_b_params_t>;
using notif_list_t = std::vector<std::pair<std::string, std::string>>;
using nixlMemViewH = void *;

/* Only passed by pointer to a virtual the plugin does not override. */
struct nixlAgentOptionalArgs;

/* addr, len and devId of one piece of memory: for DRAM an address, for OBJ an offset into the
 * object that devId names, for FILE an offset into the file whose descriptor is devId. */
class nixlBasicDesc {
public:
    uintptr_t addr;
    size_t len;
    uint64_t devId;
};

/* A registration: a basic descriptor and its metaInfo (OBJ: the object's key). */
class nixlBlobDesc : public nixlBasicDesc {
public:
    nixl_blob_t metaInfo;
};

/* What a backend returns for a registration; the agent hands it back in descriptors. */
class nixlBackendMD {
protected:
    bool isPrivateMD;

public:
    explicit nixlBackendMD(bool is_private) : isPrivateMD(is_private) {}
    virtual ~nixlBackendMD() {}
};

/* A backend's transfer request. */
class nixlBackendReqH {
public:
    nixlBackendReqH() {}
    virtual ~nixlBackendReqH() {}
};

class nixlMetaDesc : public nixlBasicDesc {
public:
    nixlBackendMD *metadataP;
};

struct nixlRemoteMetaDesc : public nixlMetaDesc {
    std::string remoteAgent;
};

/* A list of descriptors of one segment kind. Read only here. */
template<class T> class nixlDescList {
protected:
    nixl_mem_t type;
    std::vector<T> descs;

public:
    virtual ~nixlDescList() = default;
    nixl_mem_t getType() const { return type; }
    int descCount() const { return static_cast<int>(descs.size()); }
    const T &operator[](size_t i) const { return descs[i]; }
};

using nixl_meta_dlist_t = nixlDescList<nixlMetaDesc>;
using nixl_remote_meta_dlist_t = nixlDescList<nixlRemoteMetaDesc>;
using nixl_reg_dlist_t = nixlDescList<nixlBlobDesc>;

struct nixlBackendOptionalArgs {
    nixl_blob_t notifMsg;
    bool hasNotif = false;
    nixl_blob_t customParam;
};
using nixl_opt_b_args_t = nixlBackendOptionalArgs;

/* What the agent passes to a backend's constructor. */
class nixlBackendInitParams {
public:
    std::string localAgent;
    nixl_backend_t type;
    nixl_b_params_t *customParams = nullptr;
    bool enableProgTh = false;
    uint64_t pthrDelay = 0; /* microseconds */
    nixl_thread_sync_t syncMode;
    bool enableTelemetry_ = false;
};

/* An element of the base class's telemetry queue; this plugin never queues one. */
struct nixlTelemetryEvent {
    uint32_t eventType_;
    uint64_t value_;
};

/* The base class of every backend engine. The order of the virtual functions below is the
 * vtable's order and must not change; the data members fix the layout the agent reads. */
class nixlBackendEngine {
private:
    nixl_backend_t backendType;
    nixl_b_params_t customParams;
    std::vector<nixlTelemetryEvent> telemetryEvents_;
    std::mutex telemetryEventsMutex_;

protected:
    bool initErr = false;
    const std::string localAgent;
    const bool enableTelemetry_;

public:
    explicit nixlBackendEngine(const nixlBackendInitParams *p)
        : backendType(p->type),
          customParams(*p->customParams),
          localAgent(p->localAgent),
          enableTelemetry_(p->enableTelemetry_) {}
    nixlBackendEngine(const nixlBackendEngine &) = delete;
    void operator=(const nixlBackendEngine &) = delete;
    virtual ~nixlBackendEngine() = default;

    bool getInitErr() const noexcept { return initErr; }
    const nixl_b_params_t &getCustomParams() const noexcept { return customParams; }

    /* Pure virtuals: what every backend implements. */
    virtual bool supportsRemote() const = 0;
    virtual bool supportsLocal() const = 0;
    virtual bool supportsNotif() const = 0;
    virtual nixl_mem_list_t getSupportedMems() const = 0;
    virtual nixl_status_t
    registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) = 0;
    virtual nixl_status_t deregisterMem(nixlBackendMD *meta) = 0;
    virtual nixl_status_t connect(const std::string &remote_agent) = 0;
    virtual nixl_status_t disconnect(const std::string &remote_agent) = 0;
    virtual nixl_status_t unloadMD(nixlBackendMD *input) = 0;
    virtual nixl_status_t prepXfer(const nixl_xfer_op_t &op,
                                   const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote,
                                   const std::string &remote_agent,
                                   nixlBackendReqH *&handle,
                                   const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
    virtual nixl_status_t postXfer(const nixl_xfer_op_t &op,
                                   const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote,
                                   const std::string &remote_agent,
                                   nixlBackendReqH *&handle,
                                   const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
    virtual nixl_status_t checkXfer(nixlBackendReqH *handle) const = 0;
    virtual nixl_status_t releaseReqH(nixlBackendReqH *handle) const = 0;

    /* Virtuals with defaults (a backend overrides what it supports). */
    virtual nixl_status_t
    prepMemView(const nixl_remote_meta_dlist_t &, nixlMemViewH &, const nixl_opt_b_args_t * = nullptr) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual nixl_status_t
    prepMemView(const nixl_meta_dlist_t &, nixlMemViewH &, const nixl_opt_b_args_t * = nullptr) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual void releaseMemView(nixlMemViewH) const {}
    virtual nixl_status_t getPublicData(const nixlBackendMD *, std::string &) const {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t getConnInfo(std::string &) const { return NIXL_ERR_BACKEND; }
    virtual nixl_status_t loadRemoteConnInfo(const std::string &, const std::string &) {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t
    loadRemoteMD(const nixlBlobDesc &, const nixl_mem_t &, const std::string &, nixlBackendMD *&) {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t loadLocalMD(nixlBackendMD *, nixlBackendMD *&) { return NIXL_ERR_BACKEND; }
    virtual nixl_status_t getNotifs(notif_list_t &) { return NIXL_ERR_BACKEND; }
    virtual nixl_status_t genNotif(const std::string &, const std::string &) const {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t
    queryMem(const nixl_reg_dlist_t &, std::vector<nixl_query_resp_t> &) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual nixl_status_t estimateXferCost(const nixl_xfer_op_t &,
                                           const nixl_meta_dlist_t &,
                                           const nixl_meta_dlist_t &,
                                           const std::string &,
                                           nixlBackendReqH *const &,
                                           std::chrono::microseconds &,
                                           std::chrono::microseconds &,
                                           nixl_cost_t &,
                                           const nixlAgentOptionalArgs * = nullptr) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
};

/* What nixl_plugin_init returns: the agent refuses another api_version. */
#define NIXL_PLUGIN_API_VERSION 1

class nixlBackendPlugin {
public:
    int api_version;
    nixlBackendEngine *(*create_engine)(const nixlBackendInitParams *init_params);
    void (*destroy_engine)(nixlBackendEngine *engine);
    const char *(*get_plugin_name)();
    const char *(*get_plugin_version)();
    nixl_b_params_t (*get_backend_options)();
    nixl_mem_list_t (*get_backend_mems)();
};

/* The layout facts read from the wheel's binaries (see the top of this file). */
static_assert(sizeof(nixlBasicDesc) == 24, "nixlBasicDesc is addr, len, devId");
static_assert(sizeof(nixlMetaDesc) == 32, "nixlMetaDesc adds the backend's metadata pointer");
static_assert(offsetof(nixlBackendInitParams, customParams) == 0x40, "init params: customParams");
static_assert(offsetof(nixlBackendInitParams, enableTelemetry_) == 0x5c, "init params: telemetry flag");
static_assert(sizeof(nixlBackendPlugin) == 56, "plugin struct: api_version and six function pointers");

#endif /* TUTTI_NIXL_ABI_H */
