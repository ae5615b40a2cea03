//! The requests an engine process sends tuttid, and the replies.
//!
//! One JSON frame per request, one per reply (see [`crate::wire`]). Every
//! field is checked by the daemon as input from an untrusted peer: sizes are
//! capped ([`MAX_HASHES`], [`MAX_FILES`]), indices are checked against the
//! pool, and a client can name only its own queues, mappings, pins,
//! reservations and loads.

use serde::{Deserialize, Serialize};
use tutti_driver::controller::ControllerInfo;
use tutti_objstore::io::proxy::LayoutSpec;
use tutti_objstore::io::{Direction, LayerOutcome, Pair};
use tutti_objstore::{
    BlockHash, ControlStats, DataPathReport, FileId, Geometry, IdentityId, Lookup, PoolShape, Reserved,
    Verdict,
};

/// Bumped on any change a peer of the other version would misread. 2: the per-drive
/// arbitration board ([`Request::Arbitration`]); a client of 1 would put reads and writes on a
/// drive together with the clients that arbitrate, so it is refused at hello.
pub const PROTOCOL: u32 = 2;
/// Most chained hashes in one lookup, contains or reserve.
pub const MAX_HASHES: usize = 1 << 20;
/// Most files in one begin/end load.
pub const MAX_FILES: usize = 1 << 20;
/// Longest client name.
pub const MAX_NAME: usize = 256;
/// Most IOVA ranges one client may hold on one VFIO controller.
pub const MAX_IOVA_RANGES: usize = 65536;
/// Largest single mapping or IOVA range (1 TiB).
pub const MAX_MAP_LEN: u64 = 1 << 40;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    /// First request of a connection.
    Hello {
        protocol: u32,
        name: String,
    },
    /// The pool and its controllers; emulated controllers' register files come as fds, in order.
    Pool,
    /// Map `len` bytes at `addr` of the client's address space into controller `ctrl`'s IOMMU.
    Map {
        ctrl: u32,
        addr: u64,
        len: u64,
    },
    /// Map `len` bytes of device memory (a PFN map: a GDRCopy window, a BAR) at `addr` of the
    /// client's address space into emulated controller `ctrl`'s IOMMU, counted as device
    /// memory; `what` names it in errors. Page-aligned whole pages. Given back with `Unmap`.
    /// (A VFIO client maps its device memory itself, as its host memory.)
    MapDevice {
        ctrl: u32,
        addr: u64,
        len: u64,
        what: String,
    },
    /// Give back a mapping (emulated) or an IOVA range (VFIO: whatever is
    /// still mapped in it is unmapped by the daemon).
    Unmap {
        ctrl: u32,
        iova: u64,
    },
    /// VFIO controller `ctrl`: its container fd and device fd, in that order.
    VfioFds {
        ctrl: u32,
    },
    /// VFIO controller `ctrl`: reserve `len` bytes (whole pages) of IOVA space
    /// for this client to map its own memory at with VFIO_IOMMU_MAP_DMA.
    ReserveIova {
        ctrl: u32,
        len: u64,
    },
    /// VFIO controller `ctrl`: the client has mapped the whole range reserved at `iova`,
    /// from its address `vaddr` (page aligned). The daemon uses `vaddr` only to find the
    /// client's own IOVAs when it moves that client's layers itself (scarce queue pairs).
    Mapped {
        ctrl: u32,
        iova: u64,
        vaddr: u64,
    },
    /// Claim an I/O queue id on controller `ctrl` (a lease).
    ClaimQueue {
        ctrl: u32,
        purpose: String,
    },
    ReleaseQueue {
        ctrl: u32,
        qid: u16,
    },
    /// I/O queue ids of controller `ctrl` nobody holds.
    FreeQueues {
        ctrl: u32,
    },
    /// Create the claimed queue pair `qid` at memory the client mapped.
    CreateQueues {
        ctrl: u32,
        qid: u16,
        depth: u32,
        sq_iova: u64,
        cq_iova: u64,
    },
    DeleteQueues {
        ctrl: u32,
        qid: u16,
    },
    Lookup {
        identity: IdentityId,
        hashes: Vec<BlockHash>,
    },
    Contains {
        identity: IdentityId,
        hashes: Vec<BlockHash>,
    },
    Unpin {
        pin: u64,
    },
    BeginLoad {
        identity: IdentityId,
        files: Vec<FileId>,
    },
    EndLoad {
        files: Vec<FileId>,
        /// The client's data-path counters as of now (see `tutti_objstore::report`): they ride
        /// on the calls that end a load or a store, so reporting costs no round trip.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        report: Option<Box<DataPathReport>>,
    },
    Reserve {
        identity: IdentityId,
        hashes: Vec<BlockHash>,
    },
    Settle {
        id: u64,
        verdicts: Vec<Verdict>,
        /// As for [`Request::EndLoad`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        report: Option<Box<DataPathReport>>,
    },
    Stats,
    Status,
    /// A client without queue pairs of its own: the daemon moves its layers
    /// on its shared pairs, into and out of the memory `layout` describes.
    ProxyAttach {
        layout: LayoutSpec,
    },
    ProxyDetach,
    ProxyRegisterPairs {
        pairs: Vec<Pair>,
    },
    ProxyUnregisterPairs {
        handle: u64,
    },
    /// Layer `layer` of `pairs`, moved in direction `dir`.
    ProxySubmit {
        layer: u32,
        pairs: Vec<Pair>,
        dir: Direction,
        registered: Option<u64>,
    },
    ProxyPoll {
        token: u64,
    },
    /// A slot on the per-drive arbitration board (its memfd comes with the reply; see
    /// [`crate::arbitration`]). One per client; given back when the client goes.
    Arbitration,
}

impl Request {
    /// The request's name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "hello",
            Request::Pool => "pool",
            Request::Map { .. } => "map",
            Request::MapDevice { .. } => "map-device",
            Request::Unmap { .. } => "unmap",
            Request::VfioFds { .. } => "vfio-fds",
            Request::ReserveIova { .. } => "reserve-iova",
            Request::Mapped { .. } => "mapped",
            Request::ClaimQueue { .. } => "claim-queue",
            Request::ReleaseQueue { .. } => "release-queue",
            Request::FreeQueues { .. } => "free-queues",
            Request::CreateQueues { .. } => "create-queues",
            Request::DeleteQueues { .. } => "delete-queues",
            Request::Lookup { .. } => "lookup",
            Request::Contains { .. } => "contains",
            Request::Unpin { .. } => "unpin",
            Request::BeginLoad { .. } => "begin-load",
            Request::EndLoad { .. } => "end-load",
            Request::Reserve { .. } => "reserve",
            Request::Settle { .. } => "settle",
            Request::Stats => "stats",
            Request::Status => "status",
            Request::ProxyAttach { .. } => "proxy-attach",
            Request::ProxyDetach => "proxy-detach",
            Request::ProxyRegisterPairs { .. } => "proxy-register-pairs",
            Request::ProxyUnregisterPairs { .. } => "proxy-unregister-pairs",
            Request::ProxySubmit { .. } => "proxy-submit",
            Request::ProxyPoll { .. } => "proxy-poll",
            Request::Arbitration => "arbitration",
        }
    }
}

/// How an error reply classifies what went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The request was malformed or named something that is not the client's.
    Invalid,
    /// Something is in use (no queue pair left, a second owner).
    Busy,
    /// The drives or the pool failed.
    Io,
    /// The request came before `Hello`, or with a protocol this daemon does not speak.
    Protocol,
}

impl ErrorKind {
    /// The kind's name in reports and metrics.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Invalid => "invalid",
            ErrorKind::Busy => "busy",
            ErrorKind::Io => "io",
            ErrorKind::Protocol => "protocol",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Response {
    Ok,
    Error {
        kind: ErrorKind,
        message: String,
    },
    Welcome {
        protocol: u32,
        client: u64,
        daemon_pid: u32,
    },
    Pool(Box<PoolReply>),
    Iova(u64),
    Qid(u16),
    Lookup(Lookup),
    Count(u64),
    Reserved {
        id: u64,
        entries: Vec<Reserved>,
    },
    Settled(Vec<Result<(), String>>),
    Stats(ControlStats),
    Status(Box<StatusReport>),
    /// A pair-list handle or transfer token (None: none was made, or full for now).
    Handle(Option<u64>),
    Outcome(Option<LayerOutcome>),
    /// The board's memfd comes with it.
    Arbitration(ArbitrationReply),
}

/// The client's slot on the arbitration board and the board's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArbitrationReply {
    pub slot: u32,
    pub generation: u16,
    pub slots: u32,
    pub drives: u32,
}

/// How a client reaches one controller.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ControllerKind {
    /// An emulated controller in the daemon: its register file comes as an fd
    /// of `register_len` bytes; DMA reaches client memory the daemon maps.
    Emulated { register_len: u64 },
    /// A controller bound to vfio-pci (type1 IOMMU), IOMMU group `group`. Its
    /// container and device fds come with [`Request::VfioFds`]: the client
    /// mmaps the doorbells of BAR0 and maps its own memory at IOVAs the
    /// daemon reserves ([`Request::ReserveIova`]).
    Vfio { group: u32 },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ControllerReply {
    pub kind: ControllerKind,
    pub info: ControllerInfo,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PoolReply {
    pub shape: PoolShape,
    pub controllers: Vec<ControllerReply>,
    /// The pool's drives in pool order: (controller index, namespace id).
    pub drives: Vec<(u32, u32)>,
}

/// What `tutti status` shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatusReport {
    pub pid: u32,
    pub socket: String,
    pub pool: String,
    pub uptime_s: u64,
    /// Clients connected since the daemon started (including those gone).
    pub clients_served: u64,
    pub stats: ControlStats,
    pub controllers: Vec<ControllerStatus>,
    pub clients: Vec<ClientStatus>,
    /// The emulated controllers' I/O counters (none for VFIO controllers).
    #[serde(default)]
    pub emulated_io: Vec<EmulatedIo>,
    /// Connections that have not said hello yet (not in `clients`; each is closed at its hello
    /// deadline, and the oldest goes when too many wait).
    #[serde(default)]
    pub waiting_for_hello: usize,
    /// What tuttid's own metadata writes met on the arbitration board.
    #[serde(default)]
    pub arbitration: crate::arbitration::HoldStats,
    /// The pool's KV geometry (what its drives were formatted for).
    #[serde(default)]
    pub geometry: Option<Geometry>,
}

/// A client whose arbitration row has held I/O without changing (stopped, hung, or broken):
/// the other clients skip it once their stale deadline passed, and so do tuttid's metadata
/// writes once one of them waited it out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleStatus {
    /// How long its row has stayed the same while it holds I/O (as far as tuttid, which looks
    /// a few times a second, can tell).
    pub unchanged_ms: u64,
    /// A metadata write of tuttid waited its reads out; later ones skip it until its row changes.
    pub skipped_by_holds: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ControllerStatus {
    pub name: String,
    /// I/O queue pairs the controller granted, and how many nobody holds.
    pub granted_pairs: u16,
    pub free_pairs: u16,
    /// Ranges of client memory mapped for the controller (its emulated IOMMU's
    /// client regions, or IOVA ranges reserved for clients on VFIO), whoever
    /// holds them: 0 once every client is gone and released.
    #[serde(default)]
    pub client_mappings: u64,
}

/// An emulated controller's I/O counters (every client's commands and the daemon's).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EmulatedIo {
    pub name: String,
    pub commands: u64,
    /// Commands its cost model ran with reads and writes on the drive together.
    pub mixed_commands: u64,
    /// Bytes its media gave (reads) and took (writes), and commands completed with an error.
    #[serde(default)]
    pub bytes_read: u64,
    #[serde(default)]
    pub bytes_written: u64,
    #[serde(default)]
    pub errors: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClientStatus {
    pub id: u64,
    pub name: String,
    pub pid: i32,
    pub uid: u32,
    pub connected_s: u64,
    pub requests: u64,
    /// Leased queue pairs: (controller name, qid).
    pub queues: Vec<(String, u16)>,
    pub mappings: usize,
    /// Of `mappings`, those of device memory (`MapDevice`).
    #[serde(default)]
    pub device_mappings: usize,
    pub pins: usize,
    /// Open store reservations (stores in flight).
    pub reservations: usize,
    /// Files with loads in flight.
    pub loading_files: usize,
    /// The daemon moves this client's layers (it could lease no queue pair).
    pub proxied: bool,
    /// Its slot on the arbitration board, if it took one.
    #[serde(default)]
    pub arbitration_slot: Option<u32>,
    /// Set while its row on the board is stuck (see [`StaleStatus`]).
    #[serde(default)]
    pub stale: Option<StaleStatus>,
}
