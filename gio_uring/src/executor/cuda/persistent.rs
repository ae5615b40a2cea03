//! Persistent (SQPOLL) mode's own work: launching the grid that never returns,
//! its SM budget in the control block, and stopping and starting it again to
//! release the frees that pile up while it runs (`deferred_bound`).

use super::CudaExecutor;
use crate::error::Result;
use crate::executor::{ExecBinding, ExecMode};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

impl CudaExecutor {
    /// Frees and host unregistrations waiting for the kernels (see
    /// [`CudaExecutorConfig::deferred_bound`]).
    pub fn deferred_frees(&self) -> usize {
        self.ctx.deferred_len()
    }

    /// Times the persistent kernel was stopped and started again to release them.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Persistent mode, before parts are pushed: when `deferred_bound` frees are waiting,
    /// stops the kernel (it returns once the submission ring is empty, so the work already
    /// queued runs first; nothing new is pushed meanwhile, since the caller pushes only
    /// after this returns), releases them, and starts it again. Skipped while `tt_gio_wait`
    /// runs on the aux stream (the driver's frees would wait for it); the next issue
    /// looks again. A kernel that does not return within `stop_timeout` poisons the
    /// executor, as a failed stop does.
    pub(super) fn restart_if_due(&self) -> Result<()> {
        let bound = self.cfg.deferred_bound;
        if self.cfg.mode != ExecMode::Persistent || bound == 0 || self.ctx.deferred_len() < bound {
            return Ok(());
        }
        let _life = self.lifecycle.lock().map_err(|_| self.err("lifecycle lock poisoned"))?;
        if self.ctx.deferred_len() < bound || !self.ctx.enter()?.idle(&[self.aux]) {
            return Ok(());
        }
        let binding = {
            let mut st = self.state.lock().map_err(|_| self.err("state lock poisoned"))?;
            match st.binding {
                Some(b) if !st.stopped => {
                    st.restarting = true;
                    b
                }
                _ => return Ok(()),
            }
        };
        let result = self.restart(&binding);
        if let Ok(mut st) = self.state.lock() {
            st.restarting = false;
        }
        result
    }

    fn restart(&self, b: &ExecBinding) -> Result<()> {
        // SAFETY: `control` is the live shared control block (pinned, mapped for the GPU).
        let stop = unsafe { AtomicU32::from_ptr(&raw mut (*b.control.as_ptr()).stop) };
        stop.store(1, Ordering::Release);
        if !self.drain(self.stream, self.cfg.stop_timeout)? {
            self.ctx.poison();
            tracing::error!(executor = %self.name, "the persistent kernel did not return to release deferred frees: poisoned");
            return Err(self.err(format!(
                "the persistent kernel did not return within {:?} when stopped to release deferred frees; \
                 the executor is poisoned and leaks its memory",
                self.cfg.stop_timeout
            )));
        }
        let released = {
            let mut cur = self.ctx.enter()?;
            let n = cur.deferred();
            // No launch can start on aux while this thread holds the driver lock.
            if cur.idle(&[self.aux]) {
                cur.release_deferred();
                n
            } else {
                0
            }
        };
        stop.store(0, Ordering::Release);
        self.launch_persistent(b)?;
        self.restarts.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(executor = %self.name, released, "persistent kernel restarted to release deferred frees");
        Ok(())
    }

    /// Launches the persistent grid. Every block must be resident: they wait on each
    /// other through the queues. Everything the kernel reads was written through the copy
    /// stream and has landed.
    pub(super) fn launch_persistent(&self, b: &ExecBinding) -> Result<()> {
        let mut ctx = b.ctx;
        let mut params: [*mut c_void; 1] = [(&raw mut ctx).cast()];
        self.launch(
            self.kernels.persistent,
            self.shape.max_blocks,
            self.shape.block_threads,
            self.stream,
            &mut params,
        )
    }

    /// Stores the persistent kernel's active block count (the SM budget).
    pub(super) fn set_active_blocks(&self, b: &ExecBinding, blocks: u32) {
        // SAFETY: `control` is the live shared control block (pinned, mapped for the GPU).
        unsafe { AtomicU32::from_ptr(&raw mut (*b.control.as_ptr()).active_blocks) }
            .store(blocks, Ordering::Release);
    }
}
