//! What the daemon serves and what each client holds: the types every handler reads
//! and updates.

use crate::arbitration::Seat;
use crate::peer::PeerCred;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;
use tutti_driver::controller::Controller;
use tutti_driver::transport::vfio::VfioDevice;
use tutti_emulator::EmulatedController;
use tutti_objstore::FileId;

/// One controller the daemon owns.
pub(crate) struct Served {
    pub ctrl: Arc<Controller>,
    /// Set for emulated controllers (their register file and IOMMU serve clients).
    pub emulated: Option<EmulatedController>,
    /// Set for controllers bound to vfio-pci (their container and IOVA space serve clients).
    pub vfio: Option<VfioDevice>,
}

/// An IOVA range reserved for a client on a VFIO controller.
#[derive(Clone, Copy, Debug)]
pub(super) struct IovaRange {
    /// Its length in bytes.
    pub len: u64,
    /// Whether the client said it mapped the range (`Mapped`).
    pub mapped: bool,
    /// The client's address it mapped the range from (0 until `mapped`).
    pub vaddr: u64,
}

#[derive(Default, Clone)]
pub(super) struct ClientState {
    pub name: String,
    pub peer: Option<PeerCred>,
    pub since: Option<Instant>,
    pub hello: bool,
    pub requests: u64,
    /// Claimed queue ids, and whether the queues exist on the controller.
    pub qids: HashMap<(u32, u16), bool>,
    /// IOVAs mapped for the client, per controller.
    pub maps: HashSet<(u32, u64)>,
    /// Of `maps`, those of the client's device memory.
    pub device_maps: HashSet<(u32, u64)>,
    /// IOVA ranges reserved for the client on VFIO controllers, by (ctrl, iova).
    pub iovas: HashMap<(u32, u64), IovaRange>,
    /// Live queue pairs on VFIO controllers: (ctrl, qid) → the IOVA ranges
    /// (their starts) holding the SQ and CQ, which may not be given back while
    /// the queues exist.
    pub queue_ranges: HashMap<(u32, u16), [u64; 2]>,
    /// VFIO ranges (ctrl, iova) a proxied registration of the client points into.
    pub proxy_ranges: HashSet<(u32, u64)>,
    pub pins: HashSet<u64>,
    pub reservations: HashMap<u64, usize>,
    /// I/O references held for the client's loads (a file may be in several).
    pub loads: HashMap<FileId, u32>,
    /// Its slot on the arbitration board.
    pub seat: Option<Seat>,
}
