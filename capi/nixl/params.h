/* The TUTTI backend's parameters: names, defaults, and how a value is found.
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef TUTTI_NIXL_PARAMS_H
#define TUTTI_NIXL_PARAMS_H

#include <tutti.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tutti_nixl {

/* Every parameter the backend reads, with its default. An empty value in the agent's
 * parameters means "not given": the environment variable TUTTI_NIXL_<NAME> is used then
 * (KVBM passes a plugin's default options unchanged), else the default. */
inline const std::vector<std::pair<std::string, std::string>> &param_defaults() {
    static const std::vector<std::pair<std::string, std::string>> d = {
        {"daemon_socket", ""},      /* a tuttid's socket: be its client (the pool is the daemon's) */
        {"drives", "emulated"},     /* emulated | vfio */
        {"pool_dir", ""},           /* emulated drives' media dir; empty = RAM, gone at close */
        {"emulated_count", "2"},
        {"emulated_capacity_mb", "64"},
        {"vfio_bdfs", ""},          /* comma-separated PCI addresses, pool order */
        {"open_mode", "open_or_create"}, /* create | existing | open_or_create */
        {"layers", "2"},
        {"kv_heads", "2"},
        {"head_dim", "64"},
        {"tokens_per_block", "16"},
        {"dtype", "f16"},           /* f32 | f16 | bf16 | fp8_e4m3 | fp8_e5m2 | i8 */
        {"model", "nixl"},          /* the cache identity's model name */
        {"io_timeout_ms", "0"},     /* 0 = tutti's default */
        {"xfer_timeout_ms", "30000"},
        {"host_lane_blocks", "0"},
        /* Tests only: the next N reads of emulated drive 0 fail (a libtutti built with the
         * fault-injection feature, as scripts/test-python builds it; refused otherwise). */
        {"fault_fail_next_load", "0"},
        /* Tests only, likewise: the next read of emulated drive 0 executes this many ms late. */
        {"fault_delay_next_load_ms", "0"},
    };
    return d;
}

class Params {
public:
    explicit Params(const nixl_b_params_t &given) {
        for (const auto &kv : param_defaults()) {
            std::string v;
            auto it = given.find(kv.first);
            if (it != given.end() && !it->second.empty()) {
                v = it->second;
            } else {
                std::string env = "TUTTI_NIXL_" + kv.first;
                std::transform(env.begin(), env.end(), env.begin(), ::toupper);
                const char *e = std::getenv(env.c_str());
                v = (e && *e) ? std::string(e) : kv.second;
            }
            values_[kv.first] = v;
        }
        for (const auto &kv : given) {
            if (values_.find(kv.first) == values_.end())
                throw std::invalid_argument("unknown backend parameter '" + kv.first + "'");
        }
    }
    const std::string &str(const std::string &k) const { return values_.at(k); }
    uint64_t num(const std::string &k, uint64_t max) const {
        const std::string &s = str(k);
        char *end = nullptr;
        errno = 0;
        unsigned long long v = std::strtoull(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno != 0 || v > max || s[0] == '-')
            throw std::invalid_argument("backend parameter " + k + "='" + s + "' is not a number in 0.." +
                                        std::to_string(max));
        return v;
    }

private:
    std::unordered_map<std::string, std::string> values_;
};

inline uint32_t dtype_of(const std::string &s) {
    if (s == "f32") return TUTTI_DTYPE_F32;
    if (s == "f16") return TUTTI_DTYPE_F16;
    if (s == "bf16") return TUTTI_DTYPE_BF16;
    if (s == "fp8_e4m3") return TUTTI_DTYPE_FP8_E4M3;
    if (s == "fp8_e5m2") return TUTTI_DTYPE_FP8_E5M2;
    if (s == "i8") return TUTTI_DTYPE_I8;
    throw std::invalid_argument("backend parameter dtype='" + s + "' is none of f32, f16, bf16, fp8_e4m3, fp8_e5m2, i8");
}

} // namespace tutti_nixl

#endif /* TUTTI_NIXL_PARAMS_H */
