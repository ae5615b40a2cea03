//! [`Daemon`]: opens the drives and the pool, and serves engine processes
//! on a Unix socket until stopped.

use crate::error::{DaemonError, Result};
use crate::proto::StatusReport;
use crate::server::{Server, SocketMode};
use crate::service::{Served, Service};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::emulated::{EmulatedConfig, EmulatedController};
use tutti_driver::transport::vfio::{IommuMode, VfioDevice, VfioOptions};
use tutti_objstore::{DriveSpec, LocalPool, PoolOptions};

/// Where the pool's drives come from.
#[derive(Clone, Debug)]
pub enum DriveSource {
    /// Emulated controllers started by the daemon (file media is locked for
    /// as long as the daemon runs: a second owner is refused).
    Emulated(Vec<EmulatedConfig>),
    /// NVMe controllers bound to vfio-pci, each with the namespaces to use
    /// (empty: every usable one; each one named must be usable).
    Vfio { drives: Vec<(tutti_driver::pci::Bdf, Vec<u32>)>, noiommu: bool },
}

#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub socket: PathBuf,
    pub mode: SocketMode,
    pub drives: DriveSource,
    pub pool: PoolOptions,
    /// Deadline of every admin and metadata command.
    pub io_timeout: Duration,
}

/// How often the daemon looks at the arbitration board, so that `tutti status` can say how long
/// a stuck client's row has not changed.
const BOARD_LOOK: Duration = Duration::from_millis(200);

/// A running daemon. Dropping it stops it (clients get errors, not hangs).
pub struct Daemon {
    service: Arc<Service>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
    watcher: Option<JoinHandle<()>>,
    socket: PathBuf,
}

/// The controllers the daemon serves, the pool's drives, and each drive's
/// (controller index, namespace id).
type OpenedDrives = (Vec<Served>, Vec<DriveSpec>, Vec<(u32, u32)>);

fn open_drives(cfg: &DaemonConfig) -> Result<OpenedDrives> {
    let opts = ControllerOptions { io_timeout: cfg.io_timeout, ..Default::default() };
    let mut served = Vec::new();
    let mut specs = Vec::new();
    let mut drives = Vec::new();
    // `only`: the namespaces asked for (each must be usable); empty: every usable one.
    let mut add = |ctrl: Arc<Controller>,
                   emu: Option<EmulatedController>,
                   vfio: Option<VfioDevice>,
                   only: &[u32]|
     -> Result<()> {
        let c = served.len() as u32;
        let mut any = false;
        for &nsid in only {
            ctrl.data_namespace(nsid)?;
        }
        for ns in &ctrl.info().namespaces {
            if (only.is_empty() || only.contains(&ns.nsid)) && ctrl.data_namespace(ns.nsid).is_ok() {
                specs.push(DriveSpec::new(ctrl.clone(), ns.nsid));
                drives.push((c, ns.nsid));
                any = true;
            }
        }
        if !any {
            return Err(DaemonError::Config(format!("{} has no namespace the pool can use", ctrl.name())));
        }
        served.push(Served { ctrl, emulated: emu, vfio });
        Ok(())
    };
    match &cfg.drives {
        DriveSource::Emulated(list) => {
            for c in list {
                let emu = EmulatedController::start(c.clone())?;
                let ctrl = Controller::new(emu.registers(), emu.dma_space(), opts.clone())?;
                add(ctrl, Some(emu), None, &[])?;
            }
        }
        DriveSource::Vfio { drives: list, noiommu } => {
            let mode = if *noiommu { IommuMode::NoIommu } else { IommuMode::Type1 };
            for (bdf, only) in list {
                let dev = VfioDevice::open(bdf, &VfioOptions { mode, ..VfioOptions::default() })?;
                let ctrl = Controller::new(dev.registers(), dev.dma_space(), opts.clone())?;
                add(ctrl, None, Some(dev), only)?;
            }
        }
    }
    Ok((served, specs, drives))
}

impl Daemon {
    /// Opens the drives and the pool, binds the socket and starts serving.
    /// Refused when the drives (or media files) have another owner, or
    /// another daemon listens on the socket; both errors name the holder.
    pub fn start(cfg: DaemonConfig) -> Result<Daemon> {
        let (served, specs, drives) = open_drives(&cfg)?;
        let pool = Arc::new(LocalPool::open(specs, &cfg.pool)?);
        let server = Server::bind(&cfg.socket, cfg.mode)?;
        let service = Arc::new(Service::new(pool, served, drives, cfg.socket.display().to_string())?);
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (service.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("tuttid-accept".into())
            .spawn(move || server.run(h, s))
            .map_err(|e| DaemonError::Io { what: "spawning the accept thread".into(), source: e })?;
        let (h, s) = (service.clone(), stop.clone());
        let watcher = std::thread::Builder::new().name("tuttid-board".into()).spawn(move || {
            while !s.load(Ordering::Acquire) {
                h.observe_board();
                std::thread::sleep(BOARD_LOOK);
            }
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                // Only the status report's "unchanged for" gets coarser: holds look themselves.
                tracing::warn!(error = %e, "could not start the arbitration board's watcher");
                None
            }
        };
        tracing::info!(socket = %cfg.socket.display(), "tuttid serving");
        Ok(Daemon { service, stop, thread: Some(thread), watcher, socket: cfg.socket })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn status(&self) -> StatusReport {
        self.service.status()
    }

    /// Whether the accept loop has ended (it ends only when stopped or on a fatal error).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stops serving: every client is disconnected and released, the socket removed.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(DaemonError::Unexpected("the accept thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "tuttid stopped with an error");
        }
    }
}
