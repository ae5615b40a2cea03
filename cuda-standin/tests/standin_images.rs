//! Cubin validation: the real NVRTC cubin loads; an image for another
//! architecture, an entry point without a host build, a missing entry point,
//! and a parameter table that disagrees with the host kernel are refused,
//! each with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod standin_common;

use cudarc::driver::sys::{self, CUresult};
use standin_common::*;
use tutti_kernels::{KERNELS, KERNEL_WAIT};

fn load_err(image: &[u8]) -> CUresult {
    let mut m = std::ptr::null_mut();
    // SAFETY: a complete (if corrupted) image.
    unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr().cast()) }
}

#[test]
fn the_nvrtc_cubin_loads_with_every_entry_point_and_its_register_count() {
    let Some(env) = env() else { return };
    primary();
    let m = load_module(env.cubin);
    let report = tutti_kernels::nvrtc::compile_gio("sm_90").unwrap();
    for name in KERNELS {
        let f = function(m, name);
        let mut regs = 0;
        // SAFETY: a loaded function, valid out pointer.
        ok(unsafe {
            sys::cuFuncGetAttribute(&mut regs, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS, f)
        });
        let ptxas = report.kernels.iter().find(|k| k.name == name).unwrap().registers;
        assert_eq!(regs as u32, ptxas, "{name}: registers from the cubin vs ptxas' report");
    }
    // SAFETY: a loaded module with no work running.
    ok(unsafe { sys::cuModuleUnload(m) });
}

#[test]
fn a_cubin_for_another_architecture_is_refused() {
    let Some(env) = env() else { return };
    primary();
    let mut image = env.cubin.to_vec();
    assert_eq!(image[0x30], 90, "e_flags carry the SM version in their low byte");
    image[0x30] = 80;
    assert_eq!(load_err(&image), CUresult::CUDA_ERROR_INVALID_IMAGE);
    let why = env.standin.last_error();
    assert!(why.contains("sm_80") && why.contains("sm_90"), "{why}");
}

#[test]
fn an_entry_point_without_a_host_build_is_refused_and_a_missing_one_is_not_found() {
    let Some(env) = env() else { return };
    primary();
    // Rename tt_gio_wait everywhere (section and symbol names): an unknown kernel.
    let mut image = env.cubin.to_vec();
    let (from, to) = (KERNEL_WAIT.as_bytes(), b"tt_gio_wxit");
    let mut renamed = 0;
    for i in 0..image.len() - from.len() {
        if &image[i..i + from.len()] == from {
            image[i..i + from.len()].copy_from_slice(to);
            renamed += 1;
        }
    }
    assert!(renamed >= 2, "the name appears in the section and symbol names");
    assert_eq!(load_err(&image), CUresult::CUDA_ERROR_INVALID_IMAGE);
    let why = env.standin.last_error();
    assert!(why.contains("tt_gio_wxit") && why.contains("no host build"), "{why}");

    let m = load_module(env.cubin);
    let name = c"tt_gio_missing";
    let mut f = std::ptr::null_mut();
    // SAFETY: a loaded module, a NUL-terminated name.
    let rc = unsafe { sys::cuModuleGetFunction(&mut f, m, name.as_ptr()) };
    assert_eq!(rc, CUresult::CUDA_ERROR_NOT_FOUND);
    assert!(env.standin.last_error().contains("tt_gio_missing"), "{}", env.standin.last_error());
}

/// Finds tt_gio_wait's EIATTR_KPARAM_INFO record (format 4, attribute 0x17,
/// 12 bytes) for `ordinal` at `offset`, returning where its flags word is.
fn kparam_flags(image: &[u8], ordinal: u16, offset: u16) -> usize {
    let mut pattern = vec![0x04, 0x17, 0x0c, 0x00, 0, 0, 0, 0];
    pattern.extend_from_slice(&ordinal.to_le_bytes());
    pattern.extend_from_slice(&offset.to_le_bytes());
    let at = image.windows(pattern.len()).position(|w| w == pattern).expect("the parameter record");
    at + pattern.len()
}

#[test]
fn a_parameter_table_that_disagrees_with_the_host_kernel_is_refused_at_launch() {
    let Some(env) = env() else { return };
    primary();
    // tt_gio_wait's parameter 3 (`n`, 4 bytes at offset 24) claimed to be 8 bytes.
    let mut image = env.cubin.to_vec();
    let flags_at = kparam_flags(&image, 3, 24);
    let flags = u32::from_le_bytes(image[flags_at..flags_at + 4].try_into().unwrap());
    assert_eq!(flags >> 18, 4, "size field of `n`");
    let patched = (flags & 0x3ffff) | (8 << 18);
    image[flags_at..flags_at + 4].copy_from_slice(&patched.to_le_bytes());

    let m = load_module(&image);
    let wait = function(m, KERNEL_WAIT);
    let ctx = Ctx::new(1);
    let rc = launch_wait(wait, std::ptr::null_mut(), &ctx, 0, 0);
    assert_eq!(rc, CUresult::CUDA_ERROR_INVALID_VALUE);
    let why = env.standin.last_error();
    assert!(why.contains("parameter 3") && why.contains("8 bytes") && why.contains("4 bytes"), "{why}");
    assert_eq!(env.standin.stat("launches", 0).unwrap(), 0, "nothing was launched");

    // The unpatched image launches the same call.
    let good = function(load_module(env.cubin), KERNEL_WAIT);
    ok(launch_wait(good, std::ptr::null_mut(), &ctx, 0, 0));
    // SAFETY: no arguments.
    ok(unsafe { sys::cuCtxSynchronize() });
    assert_eq!(env.standin.stat("launches", 0).unwrap(), 1);
    assert_eq!(env.standin.stat("blocks_run", 0).unwrap(), 1);
}
