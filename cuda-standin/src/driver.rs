//! The stand-in's process-wide state: knobs, handles, failure injection,
//! violations and statistics, and the guard every exported call runs in.

use crate::context::Context;
use crate::device::Stats;
use crate::error::{fail, Result, StandinError};
use crate::memory::Memory;
use crate::module::{Function, Image, LibKernel, Module};
use crate::stream::{Event, Stream};
use cudarc::driver::sys::CUresult;
use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;
use std::time::Duration;

/// Settings tests change (`tt_standin_set_knob`), also read from the
/// environment at `cuInit` (`TUTTI_STANDIN_<NAME>` in upper case).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Knobs {
    /// SMs of the device.
    pub sm_count: u32,
    /// How long after the call a legacy-stream write to device memory lands.
    pub landing_delay: Duration,
    /// How long a synchronising call (cuMemFree, cuStreamSynchronize, ...)
    /// waits for device work before it fails and records a violation.
    pub sync_deadline: Duration,
    /// Registers per SM (65536 on sm_90; tests may shrink the SM to keep host
    /// thread counts small).
    pub regs_per_sm: u32,
    /// 1: loading a module or library waits (up to `sync_deadline`) for every
    /// stream of the device to drain, as the real driver was seen to do on an
    /// H100 (driver 580): a cuModuleLoadData in the primary context never
    /// returned while a persistent kernel ran in a green context. Off by
    /// default, since tests running in parallel threads share this one device.
    pub module_load_waits: bool,
}

/// Knob names, as `tt_standin_set_knob` takes them.
pub(crate) const KNOBS: [&str; 5] =
    ["sm_count", "landing_delay_ms", "sync_deadline_ms", "regs_per_sm", "module_load_waits"];

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            sm_count: 4,
            landing_delay: Duration::from_millis(5),
            sync_deadline: Duration::from_secs(5),
            regs_per_sm: 65536,
            module_load_waits: false,
        }
    }
}

impl Knobs {
    pub fn set(&mut self, name: &str, value: u64) -> std::result::Result<(), String> {
        let small = |v: u64| u32::try_from(v).map_err(|_| format!("{name} = {v} is out of range"));
        match name {
            "sm_count" if (1..=1024).contains(&value) => self.sm_count = small(value)?,
            "sm_count" => return Err(format!("sm_count = {value}: between 1 and 1024")),
            "landing_delay_ms" => self.landing_delay = Duration::from_millis(value),
            "sync_deadline_ms" => self.sync_deadline = Duration::from_millis(value),
            "regs_per_sm" if (256..=65536).contains(&value) => self.regs_per_sm = small(value)?,
            "regs_per_sm" => return Err(format!("regs_per_sm = {value}: between 256 and 65536")),
            "module_load_waits" if value <= 1 => self.module_load_waits = value == 1,
            "module_load_waits" => return Err(format!("module_load_waits = {value}: 0 or 1")),
            _ => return Err(format!("unknown knob {name:?} (knobs: {})", KNOBS.join(", "))),
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<u64> {
        Some(match name {
            "sm_count" => self.sm_count.into(),
            "landing_delay_ms" => self.landing_delay.as_millis() as u64,
            "sync_deadline_ms" => self.sync_deadline.as_millis() as u64,
            "regs_per_sm" => self.regs_per_sm.into(),
            "module_load_waits" => self.module_load_waits.into(),
            _ => return None,
        })
    }

    /// Defaults overridden by `TUTTI_STANDIN_SM_COUNT` etc.; a malformed value is
    /// recorded as a violation and ignored.
    fn from_env(violations: &mut Vec<String>) -> Self {
        let mut k = Knobs::default();
        for name in KNOBS {
            let var = format!("TUTTI_STANDIN_{}", name.to_ascii_uppercase());
            let Ok(text) = std::env::var(&var) else { continue };
            let set = text.trim().parse::<u64>().map_err(|e| e.to_string()).and_then(|v| k.set(name, v));
            if let Err(e) = set {
                violations.push(format!("{var}={text:?} ignored: {e}"));
            }
        }
        k
    }
}

/// A failure armed by `tt_standin_fail`.
#[derive(Clone, Copy, Debug)]
struct Failure {
    skip: u64,
    count: u64,
    code: CUresult,
}

pub(crate) struct State {
    pub initialized: bool,
    /// The knobs were read from the environment (at the first of cuInit, a knob
    /// call or a reset); later knob calls override them, and cuInit keeps them.
    knobs_read: bool,
    pub knobs: Knobs,
    next_handle: usize,
    next_ticket: u64,
    /// The primary context and its retain count.
    pub primary: Option<(Arc<Context>, u32)>,
    pub contexts: HashMap<usize, Arc<Context>>,
    /// Green context handle -> its context's handle.
    pub greens: HashMap<usize, usize>,
    /// Resource descriptors: the SMs they name.
    pub descs: HashMap<usize, Vec<u32>>,
    pub streams: HashMap<usize, Arc<Stream>>,
    /// Destroyed streams whose work has not all run yet (still device work).
    pub retired: Vec<Arc<Stream>>,
    pub events: HashMap<usize, Arc<Event>>,
    pub modules: HashMap<usize, Module>,
    pub functions: HashMap<usize, Function>,
    pub libraries: HashMap<usize, Arc<Image>>,
    pub lib_kernels: HashMap<usize, LibKernel>,
    pub memory: Memory,
    failures: HashMap<String, Failure>,
    pub violations: Vec<String>,
    /// Green contexts current on some thread: context handle -> that thread.
    pub green_owner: HashMap<usize, ThreadId>,
}

impl State {
    /// A fresh opaque handle (never 0, 1 or 2: those are NULL and the special streams).
    pub fn handle(&mut self) -> usize {
        self.next_handle += 0x10;
        self.next_handle
    }

    /// Issue order of device work.
    pub fn ticket(&mut self) -> u64 {
        self.next_ticket += 1;
        self.next_ticket
    }

    pub fn violation(&mut self, text: String) {
        tracing::warn!(violation = %text, "CUDA stand-in: a call broke the driver's rules");
        self.violations.push(text);
    }

    pub fn need_init(&self) -> Result<()> {
        if self.initialized {
            Ok(())
        } else {
            Err(fail(CUresult::CUDA_ERROR_NOT_INITIALIZED, "cuInit has not been called"))
        }
    }

    /// Consumes one armed failure for `name`, if one is due.
    fn injected(&mut self, name: &str) -> Option<CUresult> {
        let f = self.failures.get_mut(name)?;
        if f.skip > 0 {
            f.skip -= 1;
            return None;
        }
        if f.count == 0 {
            return None;
        }
        f.count -= 1;
        Some(f.code)
    }

    pub fn arm(&mut self, name: &str, skip: u64, count: u64, code: CUresult) {
        self.failures.insert(name.to_string(), Failure { skip, count, code });
    }

    /// The knobs, read from the environment the first time they are needed.
    pub fn knobs_mut(&mut self) -> &mut Knobs {
        if !self.knobs_read {
            self.knobs_read = true;
            let mut notes = Vec::new();
            self.knobs = Knobs::from_env(&mut notes);
            for n in notes {
                self.violation(n);
            }
        }
        &mut self.knobs
    }

    pub fn reset(&mut self) {
        let mut notes = Vec::new();
        self.knobs = Knobs::from_env(&mut notes);
        self.knobs_read = true;
        self.failures.clear();
        self.violations = notes;
        crate::device::ledger().stats = Stats::default();
        crate::residency::reset_peaks();
    }

    /// A new context (and its legacy stream), registered under a fresh handle.
    pub fn new_context(&mut self, green: Option<usize>, sms: Option<Vec<u32>>) -> Arc<Context> {
        let handle = self.handle();
        let legacy_handle = self.handle();
        let ctx = Context::new(handle, legacy_handle, green, sms);
        self.contexts.insert(handle, ctx.clone());
        ctx
    }

    /// Every stream of `ctx`, its legacy stream first, and destroyed ones whose
    /// work still runs (destroying a stream does not end its work).
    pub fn streams_of(&self, ctx: &Context) -> Vec<Arc<Stream>> {
        let mut v = vec![ctx.legacy.clone()];
        v.extend(self.streams.values().filter(|s| s.ctx == ctx.handle).cloned());
        v.extend(self.retired.iter().filter(|s| s.ctx == ctx.handle && s.busy()).cloned());
        v
    }

    pub fn context(&self, handle: usize) -> Result<Arc<Context>> {
        self.contexts.get(&handle).cloned().ok_or_else(|| {
            fail(
                CUresult::CUDA_ERROR_INVALID_CONTEXT,
                format!("context {handle:#x} does not exist (destroyed?)"),
            )
        })
    }
}

pub(crate) struct Driver {
    state: Mutex<State>,
}

pub(crate) fn driver() -> &'static Driver {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    DRIVER.get_or_init(|| Driver {
        state: Mutex::new(State {
            initialized: false,
            knobs_read: false,
            knobs: Knobs::default(),
            next_handle: 0x1000,
            next_ticket: 0,
            primary: None,
            contexts: HashMap::new(),
            greens: HashMap::new(),
            descs: HashMap::new(),
            streams: HashMap::new(),
            retired: Vec::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            libraries: HashMap::new(),
            lib_kernels: HashMap::new(),
            memory: Memory::default(),
            failures: HashMap::new(),
            violations: Vec::new(),
            green_owner: HashMap::new(),
        }),
    })
}

impl Driver {
    /// The state, also after a panic elsewhere poisoned the lock (every
    /// mutation leaves it consistent between statements that can panic).
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `cuInit`: the first call reads the knobs from the environment.
pub(crate) fn init(st: &mut State) {
    if !st.initialized {
        st.initialized = true;
        // Knobs a test set before the first cuInit stay set.
        st.knobs_mut();
    }
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The calling thread's last refused call and why (`tt_standin_last_error`).
pub(crate) fn last_error() -> String {
    LAST_ERROR.try_with(|e| e.borrow().clone()).unwrap_or_default()
}

/// Runs an exported call: failure injection for each of `names` (the first
/// is the call's own name), then `body`; a panic becomes CUDA_ERROR_UNKNOWN.
/// A refusal is remembered with its reason for `tt_standin_last_error`.
pub(crate) fn call(names: &[&str], body: impl FnOnce() -> Result<()>) -> CUresult {
    let name = names.first().copied().unwrap_or("?");
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        {
            let mut st = driver().state();
            for n in names {
                if let Some(code) = st.injected(n) {
                    return Err(fail(code, format!("failure injected for {n}")));
                }
            }
        }
        body()
    }));
    let err = match run {
        Ok(Ok(())) => return CUresult::CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => fail(CUresult::CUDA_ERROR_UNKNOWN, "the stand-in panicked (a bug in the stand-in)"),
    };
    let text = format!("{name}: {err}");
    tracing::debug!(call = name, error = %err, "CUDA stand-in call refused");
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = text);
    if let StandinError::Driver { code, .. } = err {
        code
    } else {
        CUresult::CUDA_ERROR_UNKNOWN
    }
}

/// Writes `v` through an out pointer, refusing NULL.
///
/// # Safety
/// `p` is NULL or valid for a write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{what} is NULL")));
    }
    // SAFETY: non-null, and valid per the caller.
    unsafe { p.write(v) };
    Ok(())
}
