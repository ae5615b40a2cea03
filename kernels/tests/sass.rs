//! The NVRTC sm_90 cubin of the I/O kernels, checked at the machine-code level
//! (see `tutti_kernels::sass` and `tutti_kernels::cubin`):
//! - every doorbell (MMIO) store has a system fence before it and after it on
//!   every path (`nvdisasm` from the pip wheel);
//! - registers and local-memory spills per kernel are reported and bounded;
//! - the cubin's parameter tables match what the launchers pass (`KERNEL_PARAMS`);
//! - the staged path's copy (`tt_warp_copy`, which `tt_process_staged` calls)
//!   moves 128-bit words with strong system-scope loads, several of them in
//!   flight per lane before the first store that needs one.
//!
//! Skips (with the reason; under CI=true fails) when libnvrtc or nvdisasm
//! cannot be found; `scripts/nvrtc-check --install` installs both wheels.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::sync::OnceLock;
use std::time::Duration;
use tutti_kernels::{
    cubin, nvrtc, sass, GPU_BLOCK_THREADS, KERNELS, KERNEL_COPY, KERNEL_ISSUE, KERNEL_PARAMS,
    KERNEL_PERSISTENT, KERNEL_WAIT,
};

fn compiled() -> Option<&'static nvrtc::Compiled> {
    static C: OnceLock<Result<nvrtc::Compiled, String>> = OnceLock::new();
    match C.get_or_init(|| nvrtc::compile_gio("sm_90").map_err(|e| e.to_string())) {
        Ok(c) => Some(c),
        Err(e) => {
            skip::skip(format!("{e} (scripts/nvrtc-check --install installs the NVRTC wheel)"));
            None
        }
    }
}

fn listing() -> Option<&'static Vec<sass::Function>> {
    static L: OnceLock<Result<Vec<sass::Function>, String>> = OnceLock::new();
    let c = compiled()?;
    let r = L.get_or_init(|| {
        let tool = sass::find_nvdisasm().map_err(|e| e.to_string())?;
        eprintln!("nvdisasm: {}", tool.display());
        let text = sass::disassemble(&tool, &c.cubin, Duration::from_secs(120)).map_err(|e| e.to_string())?;
        Ok(sass::parse(&text))
    });
    match r {
        Ok(l) => Some(l),
        Err(e) => {
            skip::skip(e.clone());
            None
        }
    }
}

#[test]
fn every_doorbell_store_is_fenced_before_and_after() {
    let Some(funcs) = listing() else { return };
    let report = sass::check(funcs).unwrap_or_else(|e| panic!("{e}"));
    println!("{:<70} {:>6} {:>7} {:>5} {:>5}", "function", "mmio", "fences", "STL", "LDL");
    for f in &report.functions {
        println!(
            "{:<70} {:>6} {:>7} {:>5} {:>5}",
            f.name, f.mmio_stores, f.system_fences, f.local_stores, f.local_loads
        );
    }
    // Both kernels that issue commands ring SQ and CQ doorbells.
    for k in [KERNEL_ISSUE, KERNEL_PERSISTENT] {
        let n: usize = report.functions.iter().filter(|f| f.name.contains(k)).map(|f| f.mmio_stores).sum();
        assert!(n >= 2, "{k}: expected SQ and CQ doorbell stores in its SASS, found {n}");
    }
    assert!(
        report.violations.is_empty(),
        "doorbell stores without their system fences:\n{}",
        report
            .violations
            .iter()
            .map(|v| format!("  {} @ {:#x}: {}", v.function, v.addr, v.what))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn registers_and_spills_are_bounded() {
    let Some(c) = compiled() else { return };
    let Some(funcs) = listing() else { return };
    // __launch_bounds__(512, 2) caps the issue kernels at 64 registers a thread;
    // the wait kernel runs beside a persistent grid and must stay small.
    let caps = [
        (KERNEL_ISSUE, 65536 / (2 * GPU_BLOCK_THREADS)),
        (KERNEL_PERSISTENT, 65536 / (2 * GPU_BLOCK_THREADS)),
        (KERNEL_WAIT, 32),
    ];
    for (name, cap) in caps {
        let k = c.kernels.iter().find(|k| k.name == name).unwrap();
        println!(
            "{name}: {} registers (cap {cap}), spill stores {} B, spill loads {} B, stack {} B",
            k.registers, k.spill_stores, k.spill_loads, k.stack_frame
        );
        assert!(k.registers <= cap, "{name} uses {} registers, more than {cap}", k.registers);
        // Spills go to local memory (cached in L1/L2, backed by HBM): tolerable on a path
        // that waits on NVMe, but a growing amount is a regression to look at. NVRTC 12.9
        // spilled 316 B each way in tt_process_part once the staged path joined the direct
        // one under the 64-register cap (84/56 B before), 376/408 B later. The warp-stepped
        // staged loop (issue 27) holds more per lane across its steps: inlined as before it
        // spilled ~730 B; with the staged loop, its copy, the command builder, the submission,
        // the poll and the CQ drain as calls of their own it is ~400/480 B in all, and none
        // of it in the copy loop (the test below). The bound leaves room, not licence.
        assert!(k.spill_stores <= 512 && k.spill_loads <= 512, "{name} spills {k:?}");
    }
    let local: usize = funcs.iter().map(|f| f.count("STL") + f.count("LDL")).sum();
    println!("local-memory instructions in all functions: {local}");
    // Both issue kernels carry their own copy of every function they call. 336 before the
    // warp-stepped staged loop, 616 with it: a lane's command and wait state live in local
    // memory (L1) between the warp's steps, and tt_wait_poll reads its waiter there. None of
    // it is in the copy loop (the test below).
    assert!(local <= 704, "{local} local-memory loads/stores in the SASS");
}

#[test]
fn parameter_tables_match_the_launchers() {
    let Some(c) = compiled() else { return };
    let parsed = cubin::parse(&c.cubin).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.sm, 90, "the cubin is not for sm_90");
    for name in KERNELS {
        assert!(parsed.kernel(name).is_some(), "{name} is not in the cubin");
    }
    for (name, sizes) in KERNEL_PARAMS {
        let k = parsed.kernel(name).unwrap();
        assert_eq!(
            k.param_sizes(),
            sizes,
            "{name}: cubin parameter sizes differ from what the launchers pass"
        );
        // Offsets are naturally aligned and packed in order.
        let mut off = 0u32;
        for p in &k.params {
            off = off.next_multiple_of(u32::from(p.size));
            assert_eq!(u32::from(p.offset), off, "{name}: parameter {} at offset {}", p.ordinal, p.offset);
            off += u32::from(p.size);
        }
    }
    for name in [KERNEL_ISSUE, KERNEL_PERSISTENT] {
        let k = parsed.kernel(name).unwrap();
        assert_eq!(k.max_threads, Some(GPU_BLOCK_THREADS), "{name}: __launch_bounds__ thread limit");
        let from_ptxas = c.kernels.iter().find(|r| r.name == name).unwrap().registers;
        assert_eq!(k.registers, Some(from_ptxas), "{name}: cubin REGCOUNT differs from ptxas' report");
    }
}

#[test]
fn the_staged_copy_moves_128_bit_words_with_several_loads_in_flight() {
    let Some(funcs) = listing() else { return };
    // ptxas compiles a __noinline__ function once per kernel that calls it.
    for k in [KERNEL_ISSUE, KERNEL_PERSISTENT, KERNEL_COPY] {
        let copies: Vec<&sass::Function> =
            funcs.iter().filter(|f| f.name.contains(k) && f.name.contains("tt_warp_copy")).collect();
        assert_eq!(copies.len(), 1, "{k}: expected one tt_warp_copy in its SASS");
        let f = copies[0];
        let l = sass::copy_loop(f).unwrap_or_else(|| panic!("{}: no loop that loads and stores", f.name));
        println!(
            "{}: loop at {:#x}: {} loads ({}), {} stores ({}), {} in flight before the first dependent store, {} local",
            f.name,
            l.start,
            l.loads.len(),
            l.loads.first().map_or("", String::as_str),
            l.stores.len(),
            l.stores.first().map_or("", String::as_str),
            l.in_flight,
            l.local
        );
        assert!(
            l.all_128_bit(),
            "{}: not every global load and store of the copy loop is 128-bit: {l:?}",
            f.name
        );
        assert!(
            l.loads_strong_sys(),
            "{}: the slot loads must be strong at system scope (an L1 hit may be a reused slot's old bytes): {l:?}",
            f.name
        );
        assert!(
            l.in_flight >= 2,
            "{}: {} load(s) in flight before the first dependent store",
            f.name,
            l.in_flight
        );
        assert_eq!(l.local, 0, "{}: local-memory traffic inside the copy loop", f.name);
    }
    // ... and it is what the staged loop copies chunks with (directly or through a callee).
    for k in [KERNEL_ISSUE, KERNEL_PERSISTENT] {
        let staged = funcs
            .iter()
            .find(|f| f.name.contains(k) && f.name.contains("tt_process_staged"))
            .unwrap_or_else(|| panic!("{k}: no tt_process_staged in its SASS"));
        let mut reached = vec![staged.name.clone()];
        let mut at = 0;
        while at < reached.len() {
            let f = funcs.iter().find(|f| f.name == reached[at]);
            at += 1;
            let callees =
                f.into_iter().flat_map(|f| f.instrs.iter()).filter(|i| i.opcode.starts_with("CALL"));
            for t in callees.filter_map(|i| i.target.clone()) {
                if !reached.contains(&t) {
                    reached.push(t);
                }
            }
        }
        assert!(
            reached.iter().any(|n| n.contains("tt_warp_copy")),
            "{}: never reaches tt_warp_copy (calls {reached:?})",
            staged.name
        );
    }
}
