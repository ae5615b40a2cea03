//! What an H100 (driver 580) showed and no host thread can: a module loaded in
//! another context while a persistent I/O kernel runs never returns (the demo
//! hung making its KV memory's executor after the store's persistent executor
//! had started). The stand-in's `module_load_waits` knob makes a load wait for
//! every stream of the device, failing with a violation at its sync deadline,
//! so code that loads behind a persistent kernel fails here instead of hanging
//! on a GPU.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use executor_common::*;
use tutti_gio_uring::{CudaExecutor, CudaExecutorConfig, ExecMode};

fn second_executor(path: &std::path::Path) -> Result<CudaExecutor, String> {
    // Like an engine's: the primary context, launch mode, no partition.
    CudaExecutor::new(CudaExecutorConfig { sm_count: None, ..config(path, ExecMode::Launch) })
        .map_err(|e| e.to_string())
}

#[test]
fn a_module_load_behind_a_persistent_kernel_fails_at_the_deadline_not_hangs() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    s.set_knob("module_load_waits", 1).unwrap();
    s.set_knob("sync_deadline_ms", 500).unwrap();
    let rig = rig(config(&path, ExecMode::Persistent), opts());
    round_trip(&rig, 4, 1);
    let e = second_executor(&path).map(|_| ()).unwrap_err();
    assert!(e.contains("cuModuleLoadData") || e.contains("cuLibraryLoadData"), "{e}");
    let v = s.violations();
    assert!(v.iter().any(|v| v.contains("LoadData blocked")), "{v:?}");
    // Once the persistent kernel has stopped, the same load goes through.
    drop(rig);
    s.reset();
    s.set_knob("module_load_waits", 1).unwrap();
    second_executor(&path).unwrap();
    assert!(s.violations().is_empty(), "{:?}", s.violations());
}

#[test]
fn with_the_knob_off_loads_do_not_wait() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    assert_eq!(s.knob("module_load_waits").unwrap(), 0, "off by default");
    let rig = rig(config(&path, ExecMode::Persistent), opts());
    let second = second_executor(&path).unwrap();
    round_trip(&rig, 4, 2);
    // The ring's kernel stops first: the stand-in's library unload waits for every kernel.
    drop(rig);
    drop(second);
    assert!(s.violations().is_empty(), "{:?}", s.violations());
}
