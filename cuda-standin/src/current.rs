//! Each thread's stack of current contexts.
//!
//! A green context may be current on one thread at a time (CUDA driver API,
//! Green Contexts): making it current on a second thread while the first still
//! has it fails with CUDA_ERROR_INVALID_CONTEXT and records a violation.

use crate::context::Context;
use crate::driver::{driver, State};
use crate::error::{fail, Result};
use cudarc::driver::sys::CUresult;
use std::cell::RefCell;
use std::sync::Arc;

/// This thread's context stack; leaving the thread gives up a green context it held.
struct CtxStack(Vec<usize>);

impl Drop for CtxStack {
    fn drop(&mut self) {
        if let Some(&top) = self.0.last() {
            release_green(&mut driver().state(), top);
        }
    }
}

thread_local! {
    static STACK: RefCell<CtxStack> = const { RefCell::new(CtxStack(Vec::new())) };
}

fn release_green(st: &mut State, ctx: usize) {
    let me = std::thread::current().id();
    if st.green_owner.get(&ctx) == Some(&me) {
        st.green_owner.remove(&ctx);
    }
}

/// Checks that `ctx` may become current on this thread and takes a green context.
fn claim(st: &mut State, ctx: usize, call: &str) -> Result<()> {
    let c = st.context(ctx)?;
    if c.green.is_none() {
        return Ok(());
    }
    let me = std::thread::current().id();
    match st.green_owner.get(&ctx) {
        Some(&other) if other != me => {
            let text = format!(
                "{call}: green context {ctx:#x} made current on thread {me:?} while it is current on \
                 thread {other:?} (a green context may be current to one thread at a time)"
            );
            st.violation(text.clone());
            Err(fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, text))
        }
        _ => {
            st.green_owner.insert(ctx, me);
            Ok(())
        }
    }
}

/// The context current on this thread.
pub(crate) fn current() -> Option<usize> {
    STACK.try_with(|s| s.borrow().0.last().copied()).ok().flatten()
}

/// The current context, or CUDA_ERROR_INVALID_CONTEXT.
pub(crate) fn current_ctx(st: &State) -> Result<Arc<Context>> {
    let h = current()
        .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, "no context is current on this thread"))?;
    st.context(h)
}

fn with_stack<R>(f: impl FnOnce(&mut Vec<usize>) -> R) -> Result<R> {
    STACK
        .try_with(|s| f(&mut s.borrow_mut().0))
        .map_err(|_| fail(CUresult::CUDA_ERROR_UNKNOWN, "thread is exiting"))
}

/// cuCtxSetCurrent: replaces the top of the stack (NULL pops it).
pub(crate) fn set_current(st: &mut State, ctx: usize) -> Result<()> {
    let top = current();
    if top == Some(ctx) {
        return Ok(());
    }
    if ctx != 0 {
        claim(st, ctx, "cuCtxSetCurrent")?;
    }
    if let Some(t) = top {
        release_green(st, t);
    }
    with_stack(|s| {
        s.pop();
        if ctx != 0 {
            s.push(ctx);
        }
    })
}

/// cuCtxPushCurrent.
pub(crate) fn push(st: &mut State, ctx: usize) -> Result<()> {
    let top = current();
    if top != Some(ctx) {
        claim(st, ctx, "cuCtxPushCurrent")?;
        if let Some(t) = top {
            release_green(st, t);
        }
    }
    with_stack(|s| s.push(ctx))
}

/// cuCtxPopCurrent: returns the popped context.
pub(crate) fn pop(st: &mut State) -> Result<usize> {
    let popped = with_stack(|s| s.pop())?
        .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, "no context is current on this thread"))?;
    let below = current();
    if below != Some(popped) {
        release_green(st, popped);
        if let Some(b) = below {
            // The context below becomes current again; a green one held elsewhere is a violation,
            // but the pop itself has happened.
            let _ = claim(st, b, "cuCtxPopCurrent");
        }
    }
    Ok(popped)
}
