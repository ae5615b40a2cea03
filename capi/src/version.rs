//! The ABI version of the library, and the calls that report it.

/// The ABI version of this library; a caller built against another version
/// must not use it. It changes only when the ABI changes incompatibly.
///
/// Within ABI 1, additions are minor versions (`TUTTI_ABI_MINOR`): new
/// functions, constants, and fields appended to size-prefixed structs. A
/// library of minor `m` accepts in `struct_size` the size of the struct in
/// any minor `<= m` (the sizes are listed with each struct): it reads only
/// the fields the caller's size covers (absent inputs take their defaults)
/// and writes only those, so a caller built against an older header works
/// unchanged. Any other `struct_size` is `TUTTI_E_STRUCT_SIZE`. A caller that
/// needs the fields of minor `m` checks `tutti_abi_minor() >= m` first (an
/// older library refuses the larger size). Minor 0 is the first ABI 1;
/// minor 1 added the host-work counters of `tutti_stats_t` and
/// `tutti_job_status_t`; minor 2 added outcome-unknown failures
/// (`tutti_stats_t::quarantined_files`, `tutti_job_status_t::unknown` and
/// `unknown_bitmap`) and `tutti_emulated_delay_next`; minor 3 added clients
/// of tuttid (`tutti_runtime_connect`, `tutti_client_config_t`); minor 4
/// added the staged data path (`TUTTI_MEMORY_CUDA` accepted with
/// `TUTTI_EXECUTOR_GIO_CUDA`, `TUTTI_MEMORY_HOST_STAGED`, the CUDA and staging
/// fields of `tutti_runtime_config_t`, `tutti_data_path`, now `tutti_runtime_data_path`); minor 5 added the
/// emulated drives' bandwidth and latency model (the `emulated_*_bytes_per_sec`,
/// `emulated_*latency_us` and `emulated_mixed_*` fields of `tutti_runtime_config_t`);
/// minor 6 added the scheduler in the job path (`tutti_sched_configure`,
/// `tutti_sched_config_t`, the `tutti_sched_layer_*`/`tutti_sched_decode_*`
/// timing hooks, `tutti_sched_stats`); minor 7 added per-drive arbitration across the
/// clients of one tuttid and its counters (the `xproc_*` fields of `tutti_sched_stats_t`);
/// minor 8 added every executor to tuttid clients (`TUTTI_EXECUTOR_GIO_CUDA` and the CUDA
/// and staging fields appended to `tutti_client_config_t`; `TUTTI_EXECUTOR_CONTROL` for a
/// client that moves no bytes) and the executor mode (`TUTTI_EXEC_MODE_*`: the `exec_mode`
/// fields appended to `tutti_runtime_config_t` and `tutti_client_config_t`); minor 9 added the
/// names that follow one rule (`tutti_<object>_<verb>`, handles released by `_destroy`:
/// `tutti_load_submit`, `tutti_kv_register`, ..., `tutti_runtime_destroy`), the old names staying
/// as aliases (`aliases`); minor 10 added the P2P data path (`TUTTI_MEMORY_DEVICE_P2P`,
/// `TUTTI_DATA_PATH_P2P`, and `p2p_provider` appended to `tutti_data_path_t`); minor 11 added
/// reconnecting clients of tuttid (the `reconnect*` fields appended to `tutti_client_config_t`,
/// `TUTTI_RECONNECT_*`, and the reconnect counters appended to `tutti_stats_t`).
pub const TUTTI_ABI_VERSION: u32 = 1;

/// The minor version of ABI 1 this library implements (see `TUTTI_ABI_VERSION`).
pub const TUTTI_ABI_MINOR: u32 = 11;

/// The ABI version of the loaded library (`TUTTI_ABI_VERSION` it was built with).
///
/// # Safety
/// None: callable at any time from any thread.
#[no_mangle]
pub extern "C" fn tutti_abi_version() -> u32 {
    TUTTI_ABI_VERSION
}

/// The minor version of ABI 1 the loaded library implements
/// (`TUTTI_ABI_MINOR` it was built with). Libraries of minor 0 lack this
/// function; a caller that loads the library dynamically treats its absence as 0.
///
/// # Safety
/// None: callable at any time from any thread.
#[no_mangle]
pub extern "C" fn tutti_abi_minor() -> u32 {
    TUTTI_ABI_MINOR
}
