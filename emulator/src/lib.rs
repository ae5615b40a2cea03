//! tutti-emulator: a software NVMe controller that behaves as a device, for
//! machines (tests, CI, demos) without a drive.
//!
//! It has a register file ([`regs`]) the driver pokes exactly as it would a
//! BAR, an IOMMU ([`iommu`]) through which it reaches every byte of host
//! memory, and one thread that watches CC and the doorbells, fetches commands
//! from submission queues, walks their PRP lists and SGLs per spec, moves data
//! between its media and host memory, and posts completions with phase tags
//! and SQ head pointers. Malformed commands get the spec's status codes.
//! [`faults`] can make chosen commands fail, stall, lose their completion or
//! execute only long after they were fetched (late DMA),
//! and [`EmulatedController::set_fatal`] raises CSTS.CFS.
//!
//! It implements the driver's transport traits ([`Registers`], [`DmaSpace`])
//! and speaks the driver's spec types, so the driver brings it up through the
//! same code path as a real drive:
//! `Controller::new(ctrl.registers(), ctrl.dma_space(), ..)`. [`owner`] locks
//! a drive's media file for one controller at a time.

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod config;
mod cost;
mod engine;
pub mod faults;
pub mod iommu;
mod media;
pub mod owner;
pub mod regs;
mod shared;
pub mod walk;

pub use config::{CostModel, EmulatedConfig, MediaConfig, MixedModel, NamespaceConfig};
pub use faults::{FaultAction, FaultInjector, FaultMatch};
pub use iommu::{allow_peer_access, DeviceDmaCounts, DeviceReach, EmuIommu, RemoteSpace, LOCAL_OWNER};
pub use regs::RegisterFile;
pub use shared::{monotonic_ns, TraceSpan};

use shared::{Counters, Shared, Trace};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use tutti_driver::transport::wake::wake_controller;
use tutti_driver::transport::{DmaSpace, Registers};
use tutti_driver::{DriverError, Result};

/// A snapshot of an emulated controller's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EmulatedStats {
    /// I/O commands executed (completed or dropped).
    pub commands: u64,
    pub admin_commands: u64,
    /// Bytes moved from media to host (reads).
    pub bytes_read: u64,
    /// Bytes moved from host to media (writes).
    pub bytes_written: u64,
    /// Commands completed with a non-success status.
    pub errors: u64,
    pub dropped_completions: u64,
    /// Commands executed late by [`FaultAction::DelayExecution`] (the data moved then).
    pub late_executions: u64,
    /// DMA accesses to unmapped addresses.
    pub iommu_faults: u64,
    /// I/O commands whose completion the cost model held back.
    pub cost_delayed_commands: u64,
    /// Transfers the cost model paced at the mixed (collapsed) rate.
    pub mixed_commands: u64,
    /// Modelled nanoseconds of transfers paced at the mixed rate (overlaps counted once).
    pub mixed_nanos: u64,
    /// Times the idle controller thread parked on its wake word.
    pub parks: u64,
    /// Parks a doorbell writer ended ([`wake_controller`]) rather than the timeout.
    pub woken: u64,
}

/// A running emulated controller. Dropping it stops its thread.
pub struct EmulatedController {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl EmulatedController {
    /// Validates `cfg`, opens the media and starts the controller thread. The
    /// controller starts disabled (CC.EN = 0, CSTS.RDY = 0), as after reset.
    pub fn start(cfg: EmulatedConfig) -> Result<Self> {
        cfg.validate().map_err(|e| DriverError::Emulated(format!("{}: {e}", cfg.name)))?;
        let media = media::Media::open(&cfg)?;
        let regs = Arc::new(RegisterFile::new(&cfg.name, cfg.max_io_queue_pairs, cfg.dstrd)?);
        let shared = Arc::new(Shared {
            iommu: EmuIommu::new(&cfg.name),
            regs,
            faults: Arc::default(),
            counters: Counters::default(),
            trace: Trace::default(),
            stop: AtomicBool::new(false),
            fatal: AtomicBool::new(false),
            cfg,
        });
        engine::reset_registers(&shared);
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nvme-{}", shared.cfg.name))
            .spawn(move || engine::run(thread_shared, media))
            .map_err(|e| DriverError::io("spawning the emulated controller thread", e))?;
        Ok(EmulatedController { shared, thread: Some(thread) })
    }

    pub fn name(&self) -> &str {
        &self.shared.cfg.name
    }
    pub fn config(&self) -> &EmulatedConfig {
        &self.shared.cfg
    }
    /// BAR0, for `Controller::new`.
    pub fn registers(&self) -> Arc<dyn Registers> {
        self.shared.regs.clone()
    }
    /// BAR0 as the shared register file, whose memfd a lease hands to a
    /// client process ([`RegisterFile::memfd`], [`RegisterFile::from_fd`]).
    pub fn register_file(&self) -> &Arc<RegisterFile> {
        &self.shared.regs
    }
    /// The DMA space (IOMMU) of this controller, for `Controller::new`.
    pub fn dma_space(&self) -> Arc<dyn DmaSpace> {
        Arc::new(self.shared.iommu.clone())
    }
    pub fn iommu(&self) -> &EmuIommu {
        &self.shared.iommu
    }
    /// Fault rules of this controller.
    pub fn faults(&self) -> &Arc<FaultInjector> {
        &self.shared.faults
    }
    /// Makes the controller report Controller Fatal Status and stop processing.
    pub fn set_fatal(&self) {
        self.shared.fatal.store(true, Ordering::Release);
        wake_controller(self.shared.regs.wake());
    }
    /// Starts recording when the next command is fetched and when completions
    /// are written ([`trace_take`](Self::trace_take)); costs nothing measurable.
    pub fn trace_start(&self) {
        let t = &self.shared.trace;
        t.first_fetch_ns.store(0, Ordering::Relaxed);
        t.last_post_ns.store(0, Ordering::Relaxed);
        t.on.store(true, Ordering::Release);
    }
    /// What was recorded since [`trace_start`](Self::trace_start), which stops
    /// recording; `None` when no command was fetched and completed meanwhile.
    pub fn trace_take(&self) -> Option<TraceSpan> {
        let t = &self.shared.trace;
        t.on.store(false, Ordering::Release);
        let span = TraceSpan {
            first_fetch_ns: t.first_fetch_ns.load(Ordering::Acquire),
            last_post_ns: t.last_post_ns.load(Ordering::Acquire),
        };
        (span.first_fetch_ns != 0 && span.last_post_ns >= span.first_fetch_ns).then_some(span)
    }
    pub fn stats(&self) -> EmulatedStats {
        let c = &self.shared.counters;
        EmulatedStats {
            commands: c.commands.load(Ordering::Relaxed),
            admin_commands: c.admin_commands.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            dropped_completions: c.dropped_completions.load(Ordering::Relaxed),
            late_executions: c.late_executions.load(Ordering::Relaxed),
            iommu_faults: self.shared.iommu.fault_count(),
            cost_delayed_commands: c.cost_delayed.load(Ordering::Relaxed),
            mixed_commands: c.mixed_commands.load(Ordering::Relaxed),
            mixed_nanos: c.mixed_nanos.load(Ordering::Relaxed),
            parks: c.parks.load(Ordering::Relaxed),
            woken: c.woken.load(Ordering::Relaxed),
        }
    }
}

impl Drop for EmulatedController {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        wake_controller(self.shared.regs.wake());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
