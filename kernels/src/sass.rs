//! Checks on the machine code (SASS) of the I/O kernels, read with
//! `nvdisasm` (the `nvidia-cuda-nvdisasm` pip wheel; no GPU needed).
//!
//! The host executor cannot show a missing fence (x86 orders stores), so the
//! ordering the kernels rely on is checked where it is decided: in the
//! instructions ptxas emitted. For every MMIO store (`STG.E.MMIO.SYS`: a
//! doorbell write, `tt_st_mmio_u32`):
//! - **fenced before**: on every control-flow path from the function's entry
//!   to the store, the last global store or atomic before it is followed by an
//!   unpredicated system-scope fence (`MEMBAR.*.SYS`), so whatever the lane
//!   wrote (SQ entries, the CQ head it consumed up to) is visible to the
//!   drive before the doorbell;
//! - **fenced after**: on every path from the store, a system fence comes
//!   before the next global store or atomic (and before a return to a caller
//!   that may store), so the doorbell is not overtaken by what follows.
//!
//! The analysis is a must-dataflow over each function's control-flow graph
//! (branch targets, predicated branches and exits, calls). A call counts as a
//! store unless the callee has neither stores nor fences (ptxas' integer
//! division helpers). Indirect branches make the check fail rather than guess.
//!
//! [`copy_loop`] reads the staged path's warp copy (`tt_warp_copy`): the
//! widest global loads and stores of its loops, and how many loads a lane has
//! issued before the first store that consumes one of them (loads in flight).

use crate::error::KernelError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where `nvdisasm` comes from: `$TUTTI_NVDISASM`, `PATH`, `$CUDA_HOME/bin`,
/// `/usr/local/cuda/bin`, then the pip wheel (`nvidia/cu13/bin`) found through `python3`.
pub fn find_nvdisasm() -> Result<PathBuf, KernelError> {
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("TUTTI_NVDISASM") {
        candidates.push(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvdisasm")));
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        candidates.push(Path::new(&home).join("bin/nvdisasm"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvdisasm"));
    if let Some(dir) = crate::wheel::package_dir("nvidia.cu13") {
        candidates.push(dir.join("bin/nvdisasm"));
    }
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
        tried.push(c.display().to_string());
    }
    Err(KernelError::Sass(format!(
        "nvdisasm not found (tried $TUTTI_NVDISASM, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin and the pip wheel); \
         `scripts/nvrtc-check --install` installs the nvidia-cuda-nvdisasm wheel ({} places looked at)",
        tried.len()
    )))
}

/// Disassembles `cubin` (code sections only), waiting at most `timeout`.
pub fn disassemble(nvdisasm: &Path, cubin: &[u8], timeout: Duration) -> Result<String, KernelError> {
    let err = |what: String| KernelError::Sass(what);
    let dir = std::env::temp_dir().join(format!("tutti-sass-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
    let file = dir.join("kernels.cubin");
    let out_file = dir.join("kernels.sass");
    let result = (|| {
        std::fs::write(&file, cubin).map_err(|e| err(format!("writing {}: {e}", file.display())))?;
        let out =
            std::fs::File::create(&out_file).map_err(|e| err(format!("{}: {e}", out_file.display())))?;
        let mut child = std::process::Command::new(nvdisasm)
            .arg("-c")
            .arg(&file)
            .stdout(out)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| err(format!("running {}: {e}", nvdisasm.display())))?;
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(err(format!("nvdisasm still running after {timeout:?}")));
                }
                Err(e) => return Err(err(format!("waiting for nvdisasm: {e}"))),
            }
        };
        let mut stderr = String::new();
        if let Some(mut s) = child.stderr.take() {
            use std::io::Read;
            let _ = s.read_to_string(&mut stderr);
        }
        if !status.success() {
            return Err(err(format!("nvdisasm failed ({status}): {}", stderr.trim())));
        }
        std::fs::read_to_string(&out_file).map_err(|e| err(format!("reading {}: {e}", out_file.display())))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// One SASS instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instr {
    pub addr: u64,
    /// `@P0`, `@!P1`, ... when predicated.
    pub pred: Option<String>,
    /// With modifiers, e.g. `STG.E.MMIO.SYS`.
    pub opcode: String,
    /// Branch or call target label, e.g. `.L_x_12`.
    pub target: Option<String>,
    /// The operands as printed, e.g. `R12, desc[UR18][R50.64]`.
    pub operands: String,
}

impl Instr {
    fn base(&self) -> &str {
        self.opcode.split('.').next().unwrap_or_default()
    }
    /// An unpredicated system-scope fence.
    pub fn is_system_fence(&self) -> bool {
        self.pred.is_none() && self.base() == "MEMBAR" && self.opcode.split('.').any(|m| m == "SYS")
    }
    /// A store or atomic to global or generic memory (shared and local memory are not seen by other agents).
    pub fn is_store(&self) -> bool {
        matches!(self.base(), "ST" | "STG" | "ATOM" | "ATOMG" | "RED" | "REDG")
    }
    pub fn is_mmio_store(&self) -> bool {
        self.is_store() && self.opcode.split('.').any(|m| m == "MMIO")
    }
}

/// One function (kernel or subroutine) of the listing.
#[derive(Clone, Debug, Default)]
pub struct Function {
    pub name: String,
    pub instrs: Vec<Instr>,
    /// Label → index of the instruction it names.
    pub labels: HashMap<String, usize>,
}

impl Function {
    pub fn count(&self, base: &str) -> usize {
        self.instrs.iter().filter(|i| i.base() == base).count()
    }
}

/// Splits an `nvdisasm -c` listing into functions.
pub fn parse(listing: &str) -> Vec<Function> {
    let mut funcs: Vec<Function> = Vec::new();
    let mut pending_labels: Vec<String> = Vec::new();
    for raw in listing.lines() {
        let line = raw.trim();
        if let Some(rest) = line.strip_prefix(".type") {
            let rest = rest.trim();
            if let Some(name) = rest.strip_suffix(",@function") {
                funcs.push(Function { name: name.trim().to_string(), ..Default::default() });
                pending_labels.clear();
            }
            continue;
        }
        if let Some(label) = line.strip_suffix(':') {
            if !label.contains(char::is_whitespace) {
                pending_labels.push(label.to_string());
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("/*") else { continue };
        let Some((addr, body)) = rest.split_once("*/") else { continue };
        let Ok(addr) = u64::from_str_radix(addr.trim(), 16) else { continue };
        let Some(f) = funcs.last_mut() else { continue };
        let body = body.trim().trim_end_matches(';').trim();
        let mut words = body.split_whitespace();
        let mut first = words.next().unwrap_or_default();
        let pred = if first.starts_with('@') {
            let p = first.to_string();
            first = words.next().unwrap_or_default();
            Some(p)
        } else {
            None
        };
        let target = body.split_once("`(").and_then(|(_, t)| t.split_once(')')).map(|(t, _)| t.to_string());
        let operands = body.split_once(first).map_or("", |(_, rest)| rest).trim().to_string();
        for l in pending_labels.drain(..) {
            f.labels.insert(l, f.instrs.len());
        }
        f.instrs.push(Instr { addr, pred, opcode: first.to_string(), target, operands });
    }
    funcs
}

/// A doorbell store that is not fenced as required.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub function: String,
    pub addr: u64,
    pub what: &'static str,
}

/// What the checks found in one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionReport {
    pub name: String,
    pub mmio_stores: usize,
    pub system_fences: usize,
    /// Local-memory stores and loads (register spills and stack).
    pub local_stores: usize,
    pub local_loads: usize,
}

/// The result of [`check`].
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub functions: Vec<FunctionReport>,
    pub violations: Vec<Violation>,
}

impl Report {
    pub fn mmio_stores(&self) -> usize {
        self.functions.iter().map(|f| f.mmio_stores).sum()
    }
}

/// Effect of calling a function: does it store, does it fence.
fn summaries(funcs: &[Function]) -> HashMap<String, (bool, bool)> {
    funcs
        .iter()
        .map(|f| {
            let stores = f.instrs.iter().any(|i| i.is_store()) || f.instrs.iter().any(|i| i.base() == "CALL");
            let fences = f.instrs.iter().any(|i| i.base() == "MEMBAR");
            (f.name.clone(), (stores, fences))
        })
        .collect()
}

/// Successors of instruction `i`, or an error for control flow the analysis does not follow.
fn successors(f: &Function, i: usize) -> Result<Vec<usize>, KernelError> {
    let ins = &f.instrs[i];
    let next = (i + 1 < f.instrs.len()).then_some(i + 1);
    let predicated = ins.pred.is_some();
    let mut out = Vec::new();
    match ins.base() {
        "BRA" => {
            let t = ins.target.as_deref().ok_or_else(|| {
                KernelError::Sass(format!("{}: branch at {:#x} without a label target", f.name, ins.addr))
            })?;
            let j = *f.labels.get(t).ok_or_else(|| {
                KernelError::Sass(format!(
                    "{}: branch at {:#x} to {t}, not a label of this function",
                    f.name, ins.addr
                ))
            })?;
            out.push(j);
            if predicated {
                out.extend(next);
            }
        }
        "EXIT" | "RET" => {
            if predicated {
                out.extend(next);
            }
        }
        "BRX" | "JMX" | "JMP" | "CALLX" => {
            return Err(KernelError::Sass(format!(
                "{}: indirect control flow ({}) at {:#x}: the fence check cannot follow it",
                f.name, ins.opcode, ins.addr
            )))
        }
        _ => out.extend(next),
    }
    Ok(out)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Effect {
    Fence,
    Store,
    None,
}

fn effect(ins: &Instr, calls: &HashMap<String, (bool, bool)>) -> Effect {
    if ins.is_system_fence() {
        return Effect::Fence;
    }
    if ins.is_store() {
        return Effect::Store;
    }
    if ins.base() == "CALL" {
        let pure = ins.target.as_deref().and_then(|t| calls.get(t)).is_some_and(|&(st, fe)| !st && !fe);
        return if pure { Effect::None } else { Effect::Store };
    }
    Effect::None
}

/// Runs the doorbell fence checks and counts local-memory traffic per function.
pub fn check(funcs: &[Function]) -> Result<Report, KernelError> {
    let calls = summaries(funcs);
    let mut report = Report::default();
    for f in funcs {
        let n = f.instrs.len();
        let succ: Vec<Vec<usize>> = (0..n).map(|i| successors(f, i)).collect::<Result<_, _>>()?;
        let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, s) in succ.iter().enumerate() {
            for &j in s {
                preds[j].push(i);
            }
        }
        let eff: Vec<Effect> = f.instrs.iter().map(|i| effect(i, &calls)).collect();

        // Forward: fenced_in[i] = on every path to i, a fence follows the last store.
        let mut fenced_in = vec![true; n];
        let out_of = |i: usize, v: bool| match eff[i] {
            Effect::Fence => true,
            Effect::Store => false,
            Effect::None => v,
        };
        let mut changed = true;
        let mut rounds = 0;
        while changed && rounds <= n + 1 {
            changed = false;
            rounds += 1;
            for i in 0..n {
                let v = i != 0 && preds[i].iter().all(|&p| out_of(p, fenced_in[p]));
                if v != fenced_in[i] {
                    fenced_in[i] = v;
                    changed = true;
                }
            }
        }
        // Backward: safe_at[i] = on every path starting at i, a fence comes before any store.
        let mut safe_at = vec![true; n];
        changed = true;
        rounds = 0;
        while changed && rounds <= n + 1 {
            changed = false;
            rounds += 1;
            for i in (0..n).rev() {
                let ins = &f.instrs[i];
                let v = match eff[i] {
                    Effect::Fence => true,
                    Effect::Store => false,
                    // A return hands control to a caller that may store next.
                    Effect::None if ins.base() == "RET" && ins.pred.is_none() => false,
                    Effect::None => {
                        let ret = ins.base() == "RET";
                        !ret && succ[i].iter().all(|&j| safe_at[j])
                    }
                };
                if v != safe_at[i] {
                    safe_at[i] = v;
                    changed = true;
                }
            }
        }
        for (i, ins) in f.instrs.iter().enumerate() {
            if !ins.is_mmio_store() {
                continue;
            }
            if !fenced_in[i] {
                report.violations.push(Violation {
                    function: f.name.clone(),
                    addr: ins.addr,
                    what: "MMIO store not preceded by a system fence on every path",
                });
            }
            if !succ[i].iter().all(|&j| safe_at[j]) {
                report.violations.push(Violation {
                    function: f.name.clone(),
                    addr: ins.addr,
                    what: "MMIO store not followed by a system fence before the next store on every path",
                });
            }
        }
        report.functions.push(FunctionReport {
            name: f.name.clone(),
            mmio_stores: f.instrs.iter().filter(|i| i.is_mmio_store()).count(),
            system_fences: f.instrs.iter().filter(|i| i.is_system_fence()).count(),
            local_stores: f.count("STL"),
            local_loads: f.count("LDL"),
        });
    }
    Ok(report)
}

/// What the machine code of a copy loop does (see [`copy_loop`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyLoop {
    /// Address of the loop's first instruction (its backward branch's target).
    pub start: u64,
    /// Global loads (`LDG`) and stores (`STG`) in the loop, with their modifiers.
    pub loads: Vec<String>,
    pub stores: Vec<String>,
    /// Loads issued, from the loop's start, before the first store whose data
    /// registers one of them writes: how many a lane has in flight when it
    /// must first wait for one.
    pub in_flight: usize,
    /// Local-memory loads and stores (spills) inside the loop.
    pub local: usize,
}

impl CopyLoop {
    /// Every global load and store of the loop moves 128 bits.
    pub fn all_128_bit(&self) -> bool {
        let wide = |o: &String| o.split('.').any(|m| m == "128");
        !self.loads.is_empty()
            && !self.stores.is_empty()
            && self.loads.iter().all(wide)
            && self.stores.iter().all(wide)
    }
    /// Every global load is strong at system scope (`.STRONG.SYS`): not served from the SM's L1.
    pub fn loads_strong_sys(&self) -> bool {
        let sys = |o: &String| o.split('.').any(|m| m == "STRONG") && o.split('.').any(|m| m == "SYS");
        !self.loads.is_empty() && self.loads.iter().all(sys)
    }
}

/// The registers an operand such as `R12` names for an access of `width` bits
/// (a 128-bit access uses R12..R15).
fn registers(op: &str, width: u32) -> Option<std::ops::Range<u32>> {
    let n: u32 = op.trim().strip_prefix('R')?.parse().ok()?;
    Some(n..n + (width / 32).max(1))
}

fn access_width(opcode: &str) -> u32 {
    opcode
        .split('.')
        .find_map(|m| m.parse::<u32>().ok())
        .filter(|w| [8, 16, 32, 64, 128].contains(w))
        .unwrap_or(32)
}

/// The loops of `f` (a backward branch and its target) that both load and store
/// global memory, each read as a [`CopyLoop`], in address order.
pub fn copy_loops(f: &Function) -> Vec<CopyLoop> {
    let mut out = Vec::new();
    for (end, br) in f.instrs.iter().enumerate() {
        if br.base() != "BRA" {
            continue;
        }
        let Some(&start) = br.target.as_deref().and_then(|t| f.labels.get(t)) else { continue };
        if start > end {
            continue;
        }
        let body = &f.instrs[start..=end];
        let mut l = CopyLoop { start: f.instrs[start].addr, ..Default::default() };
        let mut loaded: Vec<std::ops::Range<u32>> = Vec::new();
        let mut first_use = None;
        for ins in body {
            match ins.base() {
                "LDG" => {
                    l.loads.push(ins.opcode.clone());
                    // Destination first: `R12, desc[UR18][R50.64]`.
                    if let Some(r) =
                        ins.operands.split(',').next().and_then(|d| registers(d, access_width(&ins.opcode)))
                    {
                        loaded.push(r);
                    }
                }
                "STG" => {
                    l.stores.push(ins.opcode.clone());
                    // Data last: `desc[UR18][R8.64], R12`.
                    let data =
                        ins.operands.rsplit(',').next().and_then(|d| registers(d, access_width(&ins.opcode)));
                    if first_use.is_none()
                        && data.is_some_and(|d| loaded.iter().any(|r| r.start < d.end && d.start < r.end))
                    {
                        first_use = Some(loaded.len());
                    }
                }
                "LDL" | "STL" => l.local += 1,
                _ => {}
            }
        }
        if l.loads.is_empty() || l.stores.is_empty() {
            continue;
        }
        l.in_flight = first_use.unwrap_or(0);
        out.push(l);
    }
    out
}

/// The copy loop of `f` with the most loads in flight (ties: the first).
pub fn copy_loop(f: &Function) -> Option<CopyLoop> {
    copy_loops(f).into_iter().reduce(|best, l| if l.in_flight > best.in_flight { l } else { best })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(body: &str) -> Vec<Function> {
        parse(&format!("        .type           k,@function\nk:\n{body}"))
    }

    fn violations(body: &str) -> Vec<&'static str> {
        check(&listing(body)).unwrap().violations.into_iter().map(|v| v.what).collect()
    }

    const FENCED: &str = "
        /*0000*/                   ST.E.64.STRONG.SYS desc[UR4][R2.64], R4 ;
        /*0010*/                   MEMBAR.SC.SYS ;
        /*0020*/                   LD.E.64 R16, desc[UR4][R10.64+0x18] ;
        /*0030*/                   STG.E.MMIO.SYS [R16], R0 ;
        /*0040*/                   MEMBAR.ALL.SYS ;
        /*0050*/                   ATOM.E.ADD.64.STRONG.GPU P0, RZ, desc[UR14][R12.64+0x168], R2 ;
        /*0060*/                   EXIT ;
";

    #[test]
    fn a_doorbell_fenced_on_both_sides_passes() {
        assert_eq!(violations(FENCED), Vec::<&str>::new());
    }

    #[test]
    fn a_store_between_fence_and_doorbell_is_flagged() {
        let body = FENCED.replace("LD.E.64 R16", "ST.E.64 R16");
        assert_eq!(violations(&body).len(), 1);
        assert!(violations(&body)[0].contains("preceded"));
    }

    #[test]
    fn a_predicated_fence_does_not_count() {
        let body = FENCED
            .replace("/*0010*/                   MEMBAR.SC.SYS", "/*0010*/              @!P0 MEMBAR.SC.SYS");
        assert!(violations(&body)[0].contains("preceded"));
        let gpu = FENCED.replace("MEMBAR.SC.SYS", "MEMBAR.SC.GPU");
        assert!(violations(&gpu)[0].contains("preceded"), "a GPU-scope fence is not a system fence");
    }

    #[test]
    fn a_missing_trailing_fence_is_flagged() {
        let body = FENCED.replace("MEMBAR.ALL.SYS", "NOP");
        let v = violations(&body);
        assert_eq!(v.len(), 1);
        assert!(v[0].contains("followed"));
    }

    #[test]
    fn an_unfenced_path_joining_at_the_doorbell_is_flagged() {
        // The fence sits on the fall-through path only; the branch skips it after a store.
        let body = "
        /*0000*/                   ST.E.64 desc[UR4][R2.64], R4 ;
        /*0010*/               @P0 BRA `(.L_x_1) ;
        /*0020*/                   MEMBAR.SC.SYS ;
.L_x_1:
        /*0030*/                   STG.E.MMIO.SYS [R16], R0 ;
        /*0040*/                   MEMBAR.SC.SYS ;
        /*0050*/                   EXIT ;
";
        let v = violations(body);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("preceded"));
        let both = body.replace("/*0010*/               @P0 BRA", "/*0010*/               @P0 NOP");
        assert!(violations(&both).is_empty());
    }

    #[test]
    fn a_return_after_the_doorbell_needs_the_fence_first() {
        let body = "
        /*0000*/                   MEMBAR.SC.SYS ;
        /*0010*/                   STG.E.MMIO.SYS [R16], R0 ;
        /*0020*/                   RET.REL.NODEC R2 `(k) ;
";
        assert_eq!(
            violations(body),
            vec!["MMIO store not followed by a system fence before the next store on every path"]
        );
    }

    #[test]
    fn calls_to_pure_helpers_are_transparent_and_others_are_stores() {
        let text = "        .type           k,@function
k:
        /*0000*/                   MEMBAR.SC.SYS ;
        /*0010*/                   CALL.REL.NOINC `($helper) ;
        /*0020*/                   STG.E.MMIO.SYS [R16], R0 ;
        /*0030*/                   MEMBAR.SC.SYS ;
        /*0040*/                   EXIT ;
        .type           $helper,@function
$helper:
        /*0050*/                   IMAD R0, R1, R2, RZ ;
        /*0060*/                   RET.REL.NODEC R2 `(k) ;
";
        assert!(check(&parse(text)).unwrap().violations.is_empty());
        let storing = text.replace("IMAD R0, R1, R2, RZ", "ST.E [R4], R0");
        let v = check(&parse(&storing)).unwrap().violations;
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn indirect_branches_are_refused() {
        let body =
            "        /*0000*/                   BRX R2 -0x10 ;\n        /*0010*/                   EXIT ;\n";
        assert!(check(&listing(body)).is_err());
    }

    #[test]
    fn spills_are_counted() {
        let body = "        /*0000*/                   STL [R1], R2 ;\n        /*0010*/                   LDL R3, [R1] ;\n        /*0020*/                   EXIT ;\n";
        let r = check(&listing(body)).unwrap();
        assert_eq!((r.functions[0].local_stores, r.functions[0].local_loads), (1, 1));
    }

    const COPY: &str = "
.L_x_13:
        /*0ba0*/                   LDG.E.128.STRONG.SYS R8, desc[UR8][R4.64] ;
        /*0bd0*/                   LDG.E.128.STRONG.SYS R12, desc[UR10][R4.64+0x200] ;
        /*0bf0*/                   LDG.E.128.STRONG.SYS R16, desc[UR12][R4.64+0x400] ;
        /*0c00*/                   IADD3 R4, P1, R4, 0x600, RZ ;
        /*0cf0*/                   STG.E.128 desc[UR8][R6.64], R8 ;
        /*0d00*/                   STG.E.128 desc[UR10][R6.64+0x200], R12 ;
        /*0d10*/                   STG.E.128 desc[UR12][R6.64+0x400], R16 ;
        /*0d70*/               @P2 BRA `(.L_x_13) ;
        /*0d80*/                   RET.REL.NODEC R2 `(k) ;
";

    #[test]
    fn a_copy_loop_reports_its_widths_and_loads_in_flight() {
        let f = &listing(COPY)[0];
        let l = copy_loop(f).unwrap();
        assert_eq!((l.loads.len(), l.stores.len(), l.in_flight, l.local), (3, 3, 3, 0));
        assert!(l.all_128_bit() && l.loads_strong_sys());
        assert_eq!(l.start, 0xba0);
    }

    #[test]
    fn a_copy_that_stores_each_word_before_the_next_load_has_one_in_flight() {
        // The old staged copy: one load, its store, the next load.
        let body = "
.L_x_1:
        /*0000*/                   LDG.E.64.STRONG.SYS R8, desc[UR8][R4.64] ;
        /*0010*/                   STG.E.64 desc[UR8][R6.64], R8 ;
        /*0020*/                   LDG.E.64.STRONG.SYS R10, desc[UR8][R4.64+0x8] ;
        /*0030*/                   STG.E.64 desc[UR8][R6.64+0x8], R10 ;
        /*0040*/               @P2 BRA `(.L_x_1) ;
";
        let l = copy_loop(&listing(body)[0]).unwrap();
        assert_eq!(l.in_flight, 1);
        assert!(!l.all_128_bit());
        // A store of a register no load wrote does not end the count early.
        let unrelated = COPY.replace("STG.E.128 desc[UR8][R6.64], R8", "STG.E.128 desc[UR8][R6.64], R40");
        assert_eq!(copy_loop(&listing(&unrelated)[0]).unwrap().in_flight, 3);
        // Weak loads (an L1 hit may be stale) are told apart.
        let weak = COPY.replace("LDG.E.128.STRONG.SYS R12", "LDG.E.128 R12");
        assert!(!copy_loop(&listing(&weak)[0]).unwrap().loads_strong_sys());
        // No backward branch, no loop.
        assert!(copy_loop(&listing(&COPY.replace("@P2 BRA", "@P2 NOP"))[0]).is_none());
    }
}
