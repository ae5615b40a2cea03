//! The crate's error type, the thread-local last-error message, and the
//! boundary guard every extern function runs its body in.

use crate::status::*;
use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};
use tutti_objstore::ObjError;
use tutti_scheduler::SchedError;

/// Everything an entry point can fail with; [`CapiError::code`] is what C sees.
#[derive(Debug, thiserror::Error)]
pub enum CapiError {
    #[error("{0} is NULL")]
    Null(&'static str),

    #[error("{what}: {0} is not aligned for its type", what = .1)]
    Misaligned(&'static str, &'static str),

    #[error("{what}.struct_size is {got}, this library (ABI {abi}) expects {expected}", abi = crate::version::TUTTI_ABI_VERSION)]
    StructSize { what: &'static str, got: u32, expected: String },

    #[error("invalid {field}: {what}")]
    Invalid { field: &'static str, what: String },

    #[error("{ptr:#x} is not a live {kind} handle (destroyed, never created, or another type)")]
    BadHandle { kind: &'static str, ptr: usize },

    #[error("{0}")]
    Busy(String),

    #[error("{0}")]
    Timeout(String),

    #[error("{what}: a buffer of {needed} is needed, {capacity} was given")]
    BufferTooSmall { what: &'static str, needed: usize, capacity: usize },

    #[error("{0}")]
    Unsupported(String),

    #[error(transparent)]
    Obj(#[from] ObjError),

    #[error(transparent)]
    Sched(#[from] SchedError),

    #[error("{0}")]
    Io(String),

    #[error("internal state poisoned ({0}); the runtime is unusable")]
    Poisoned(&'static str),
}

pub type Result<T, E = CapiError> = std::result::Result<T, E>;

impl CapiError {
    pub(crate) fn invalid(field: &'static str, what: impl Into<String>) -> Self {
        CapiError::Invalid { field, what: what.into() }
    }

    /// The status code C sees for this error.
    pub fn code(&self) -> i32 {
        match self {
            CapiError::Null(_) => TUTTI_E_NULL_POINTER,
            CapiError::Misaligned(..) | CapiError::Invalid { .. } => TUTTI_E_INVALID_ARG,
            CapiError::StructSize { .. } => TUTTI_E_STRUCT_SIZE,
            CapiError::BadHandle { .. } => TUTTI_E_BAD_HANDLE,
            CapiError::Busy(_) => TUTTI_E_BUSY,
            CapiError::Timeout(_) => TUTTI_E_TIMEOUT,
            CapiError::BufferTooSmall { .. } => TUTTI_E_BUFFER_TOO_SMALL,
            CapiError::Unsupported(_) => TUTTI_E_UNSUPPORTED,
            CapiError::Sched(SchedError::BacklogFull { .. }) => TUTTI_E_BUSY,
            CapiError::Sched(SchedError::LayerOutOfRange { .. }) => TUTTI_E_INVALID_ARG,
            CapiError::Sched(_) => TUTTI_E_PROFILE,
            CapiError::Io(_) => TUTTI_E_IO,
            CapiError::Poisoned(_) => TUTTI_E_INTERNAL,
            CapiError::Obj(e) => obj_code(e),
        }
    }
}

/// The object store reports "something is still in flight" as an invalid
/// value of the field that is busy; C callers get a distinct code for it.
fn obj_code(e: &ObjError) -> i32 {
    match e {
        ObjError::Invalid { field: "registration" | "job" | "store", .. } => TUTTI_E_BUSY,
        // The drives hold no pool, another pool, or a pool of another shape.
        ObjError::Invalid { field: "drives", .. } => TUTTI_E_POOL,
        // The CUDA executor on a machine without a CUDA driver or GPU.
        ObjError::Invalid { field: "executor", .. } => TUTTI_E_UNSUPPORTED,
        ObjError::Invalid { .. } => TUTTI_E_INVALID_ARG,
        ObjError::Driver(_) | ObjError::Gio(_) | ObjError::Drive { .. } | ObjError::Peer(_) => TUTTI_E_IO,
        // tuttid is gone: an I/O error of the runtime, whose message names tuttid.
        ObjError::PeerGone(_) => TUTTI_E_IO,
        ObjError::Pool { .. } => TUTTI_E_POOL,
        ObjError::PoolFull { .. } => TUTTI_E_POOL_FULL,
        ObjError::NotRegistered => TUTTI_E_NOT_REGISTERED,
        ObjError::Unknown { .. } => TUTTI_E_NOT_FOUND,
        ObjError::Timeout { .. } => TUTTI_E_TIMEOUT,
        ObjError::Poisoned(_) => TUTTI_E_INTERNAL,
        // The scheduler's write backlog is full: nothing was done, submit again later.
        ObjError::Backpressure(_) => TUTTI_E_BUSY,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(msg: String) {
    // An interior NUL would cut the message short in C; make it visible instead.
    let msg = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

pub(crate) fn clear_last_error() {
    LAST_ERROR.with(|e| {
        let mut e = e.borrow_mut();
        if !e.as_bytes().is_empty() {
            *e = CString::default();
        }
    });
}

/// This thread's message; the pointer stays valid until the next call that sets or clears it.
pub(crate) fn last_error_ptr() -> *const std::ffi::c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

pub(crate) fn last_error_bytes() -> Vec<u8> {
    LAST_ERROR.with(|e| e.borrow().as_bytes_with_nul().to_vec())
}

/// For an old name (`aliases`): `code`, the status its new name returned, with the last error
/// naming `old`, the function the caller called, where the new name's call put `new`.
pub(crate) fn alias(old: &'static str, new: &'static str, code: i32) -> i32 {
    LAST_ERROR.with(|e| {
        let mut e = e.borrow_mut();
        if let Some(rest) = e.to_bytes().strip_prefix(new.as_bytes()) {
            let mut renamed = old.as_bytes().to_vec();
            renamed.extend_from_slice(rest);
            *e = CString::new(renamed).unwrap_or_default();
        }
    });
    code
}

/// Runs an entry point's body: a panic becomes [`TUTTI_E_PANIC`] (never
/// unwinds into C), an error its code, and the last-error message is set
/// (prefixed with the function's name) or cleared to match.
pub(crate) fn guard(func: &'static str, body: impl FnOnce() -> Result<i32>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code)) => {
            clear_last_error();
            code
        }
        Ok(Err(e)) => {
            let code = e.code();
            tracing::debug!(func, code, error = %e, "tutti C call failed");
            set_last_error(format!("{func}: {e}"));
            code
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".into());
            tracing::error!(func, panic = %what, "panic caught at the C boundary");
            set_last_error(format!("{func}: internal panic (a bug in tutti): {what}"));
            TUTTI_E_PANIC
        }
    }
}

/// Like [`guard`] for calls whose result is not a status (it gets `fallback` on failure).
pub(crate) fn guard_value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// Locks `m`; a poisoned lock (a panic while it was held) is `CapiError::Poisoned(what)`.
pub(crate) fn lock<'a, T>(m: &'a Mutex<T>, what: &'static str) -> Result<MutexGuard<'a, T>> {
    m.lock().map_err(|_| CapiError::Poisoned(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        String::from_utf8(last_error_bytes()).unwrap().trim_end_matches('\0').to_string()
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let code = guard("tutti_test", || panic!("boom {}", 7));
        assert_eq!(code, TUTTI_E_PANIC);
        assert!(last().contains("tutti_test: internal panic"), "{}", last());
        assert!(last().contains("boom 7"));
        // The next successful call clears the message.
        assert_eq!(guard("tutti_test", || Ok(TUTTI_IN_PROGRESS)), TUTTI_IN_PROGRESS);
        assert_eq!(last(), "");
    }

    #[test]
    fn errors_map_to_their_codes_and_name_the_function() {
        assert_eq!(guard("tutti_x", || Err(CapiError::Null("out"))), TUTTI_E_NULL_POINTER);
        assert_eq!(last(), "tutti_x: out is NULL");
        let busy = ObjError::Invalid { field: "registration", what: "2 jobs in flight".into() };
        assert_eq!(CapiError::from(busy).code(), TUTTI_E_BUSY);
        assert_eq!(CapiError::from(ObjError::NotRegistered).code(), TUTTI_E_NOT_REGISTERED);
        assert_eq!(CapiError::from(ObjError::Unknown { what: "pin", id: 3 }).code(), TUTTI_E_NOT_FOUND);
        let e = CapiError::StructSize { what: "config", got: 8, expected: "96".into() };
        assert_eq!(e.code(), TUTTI_E_STRUCT_SIZE);
        assert!(e.to_string().contains("is 8") && e.to_string().contains("expects 96"));
    }

    #[test]
    fn messages_are_per_thread_and_nul_safe() {
        set_last_error("main".into());
        std::thread::spawn(|| {
            assert_eq!(last(), "");
            set_last_error("a\0b".into());
            assert_eq!(last(), "a\\0b");
        })
        .join()
        .unwrap();
        assert_eq!(last(), "main");
    }
}
