//! What an emulated controller looks like to the driver.

use std::path::PathBuf;
use std::time::Duration;
use tutti_driver::spec::SglSupport;

/// One namespace of an emulated controller.
///
/// `metadata_size`, `extended_metadata`, `pi_type` and `command_set` only
/// change what Identify reports (so that the driver's refusal of such
/// namespaces can be tested); I/O to the namespace moves data blocks as if
/// it had none.
#[derive(Clone, Debug)]
pub struct NamespaceConfig {
    /// Size in logical blocks.
    pub blocks: u64,
    /// log2 of the logical block size: 9 (512 B) or 12 (4096 B).
    pub lba_shift: u8,
    /// Metadata bytes per block in the LBA format in use (0 = none).
    pub metadata_size: u16,
    /// Metadata at the end of each block's data (FLBAS bit 4).
    pub extended_metadata: bool,
    /// Protection information type (DPS bits 2:0), 0..=3.
    pub pi_type: u8,
    /// Command Set Identifier reported in the descriptor list: 0 NVM, 2 zoned.
    pub command_set: u8,
}

impl NamespaceConfig {
    /// A namespace of `bytes` (rounded down to whole blocks) with `lba_size`-byte blocks.
    pub fn with_bytes(bytes: u64, lba_size: u32) -> Self {
        let lba_shift = lba_size.trailing_zeros() as u8;
        NamespaceConfig {
            blocks: bytes >> lba_shift,
            lba_shift,
            metadata_size: 0,
            extended_metadata: false,
            pi_type: 0,
            command_set: 0,
        }
    }
    pub fn bytes(&self) -> u64 {
        self.blocks << self.lba_shift
    }
}

/// Where an emulated controller keeps its blocks.
#[derive(Clone, Debug)]
pub enum MediaConfig {
    /// Anonymous memory, allocated lazily by the kernel as blocks are written.
    Ram,
    /// Anonymous memory whose every page is faulted in when the controller starts,
    /// as a drive's capacity exists before it is written: writes to fresh media
    /// then cost a copy, not a kernel page fault per 4 KiB (which made first stores
    /// to `Ram` media several times slower than loads). Takes its full size in RAM
    /// at start, and the start takes as long as the kernel needs to zero it.
    RamPrefaulted,
    /// A regular file, created sparse if it does not exist; namespaces are laid
    /// out one after another. Data survives the controller (and the process).
    File(PathBuf),
    /// No storage at all, like Linux's null_blk: commands are checked and their
    /// data pointers walked as usual, then complete without moving any data
    /// (reads leave the host buffer as it was, writes are discarded). For
    /// measuring what a command costs apart from its data copy.
    Null,
}

/// Optional timing so the emulator can stand in for a slower device.
///
/// `Default` adds no cost at all. The model, per I/O command:
///
/// * every command completes no earlier than `per_command` (plus
///   `read_latency` for a Read, `write_latency` for a Write) after it was
///   fetched;
/// * a transfer is paced on a channel: with only `bytes_per_sec` set, reads
///   and writes share one channel of that rate (each transfer starts when the
///   previous one ends); with `read_bytes_per_sec` or `write_bytes_per_sec` set,
///   reads and writes each have their own channel, of that rate (falling back
///   to `bytes_per_sec`, or unpaced);
/// * with `mixed` set, a transfer that starts while the other direction's
///   channel is still busy is paced at the collapsed rate instead: the drive's
///   total becomes `efficiency` × the faster direction's rate, of which reads
///   get `read_share` and writes the rest (never more than their rate alone).
///   The rate is chosen when a command is fetched and not revised later.
///
/// A command completes at the later of its latency and its transfer's end.
#[derive(Clone, Debug, Default)]
pub struct CostModel {
    /// Added to every I/O command before it completes.
    pub per_command: Duration,
    /// If set, data transfers are paced to this many bytes per second.
    pub bytes_per_sec: Option<u64>,
    /// Reads paced to this many bytes per second on their own channel.
    pub read_bytes_per_sec: Option<u64>,
    /// Writes paced to this many bytes per second on their own channel.
    pub write_bytes_per_sec: Option<u64>,
    /// Added to `per_command` for Read commands.
    pub read_latency: Duration,
    /// Added to `per_command` for Write commands.
    pub write_latency: Duration,
    /// Bandwidth collapse while reads and writes share the drive.
    pub mixed: Option<MixedModel>,
}

/// How a drive's bandwidth collapses while reads and writes are both in flight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MixedModel {
    /// Fraction of the faster direction's rate the drive keeps in total, (0, 1].
    pub efficiency: f64,
    /// Fraction of the mixed total that reads get, (0, 1); writes get the rest.
    pub read_share: f64,
}

impl CostModel {
    /// Whether the model adds nothing: no latency and no paced rate (the default).
    pub fn is_free(&self) -> bool {
        self.per_command.is_zero()
            && self.read_latency.is_zero()
            && self.write_latency.is_zero()
            && self.bytes_per_sec.is_none()
            && self.read_bytes_per_sec.is_none()
            && self.write_bytes_per_sec.is_none()
    }

    /// Checks the numbers make sense; the message names the field at fault.
    pub fn validate(&self) -> Result<(), String> {
        for (name, rate) in [
            ("bytes_per_sec", self.bytes_per_sec),
            ("read_bytes_per_sec", self.read_bytes_per_sec),
            ("write_bytes_per_sec", self.write_bytes_per_sec),
        ] {
            if rate == Some(0) {
                return Err(format!("cost model: {name} is 0 (leave it unset for no pacing)"));
            }
        }
        if let Some(m) = self.mixed {
            if !(m.efficiency > 0.0 && m.efficiency <= 1.0) {
                return Err(format!("cost model: mixed efficiency {} is not in (0, 1]", m.efficiency));
            }
            if !(m.read_share > 0.0 && m.read_share < 1.0) {
                return Err(format!("cost model: mixed read share {} is not in (0, 1)", m.read_share));
            }
            if self.read_bytes_per_sec.is_none()
                && self.write_bytes_per_sec.is_none()
                && self.bytes_per_sec.is_none()
            {
                return Err("cost model: a mixed collapse needs a read or write rate to collapse".into());
            }
        }
        Ok(())
    }
}

/// Everything that can be configured about an emulated controller.
#[derive(Clone, Debug)]
pub struct EmulatedConfig {
    /// Name used in messages and as the device name (`emu0`).
    pub name: String,
    pub model: String,
    pub serial: String,
    pub firmware: String,
    pub namespaces: Vec<NamespaceConfig>,
    /// Identify Controller MDTS: max transfer = 2^mdts × min page; 0 = no limit.
    pub mdts: u8,
    pub sgl: SglSupport,
    /// I/O queue pairs the controller grants through Set Features.
    pub max_io_queue_pairs: u16,
    /// Maximum entries per queue (CAP.MQES + 1), 2..=65536.
    pub max_queue_entries: u32,
    /// Doorbell stride: doorbells are 4 << dstrd bytes apart.
    pub dstrd: u8,
    /// CAP.CQR: queues must be physically contiguous.
    pub contiguous_queues_required: bool,
    /// CAP.TO in 500 ms units.
    pub timeout_500ms: u8,
    /// CAP.MPSMIN / CAP.MPSMAX (page = 2^(12 + n)).
    pub mps_min: u8,
    pub mps_max: u8,
    pub volatile_write_cache: bool,
    pub media: MediaConfig,
    pub cost: CostModel,
    /// How long CSTS.RDY takes to follow CC.EN.
    pub ready_delay: Duration,
}

impl Default for EmulatedConfig {
    fn default() -> Self {
        EmulatedConfig {
            name: "emu0".into(),
            model: "tutti emulated NVMe".into(),
            serial: "TUTTI-EMU-0".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            namespaces: vec![NamespaceConfig::with_bytes(256 << 20, 512)],
            mdts: 5,
            sgl: SglSupport::Supported,
            max_io_queue_pairs: 16,
            max_queue_entries: 1024,
            dstrd: 0,
            contiguous_queues_required: true,
            timeout_500ms: 20,
            mps_min: 0,
            mps_max: 4,
            volatile_write_cache: true,
            media: MediaConfig::Ram,
            cost: CostModel::default(),
            ready_delay: Duration::ZERO,
        }
    }
}

impl EmulatedConfig {
    /// Checks that the configuration describes a controller the spec allows.
    pub fn validate(&self) -> Result<(), String> {
        if self.namespaces.is_empty() {
            return Err("at least one namespace is required".into());
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            if !(9..=16).contains(&ns.lba_shift) {
                return Err(format!(
                    "namespace {}: LBA size 2^{} is not 512..=65536 bytes",
                    i + 1,
                    ns.lba_shift
                ));
            }
            if ns.blocks == 0 {
                return Err(format!("namespace {}: size is zero blocks", i + 1));
            }
            if ns.pi_type > 3 || (ns.pi_type > 0 && ns.metadata_size < 8) {
                return Err(format!(
                    "namespace {}: protection information type {} needs type 1..=3 and 8+ bytes of metadata",
                    i + 1,
                    ns.pi_type
                ));
            }
        }
        if !(2..=65536).contains(&self.max_queue_entries) {
            return Err(format!("max_queue_entries {} is not 2..=65536", self.max_queue_entries));
        }
        if self.max_io_queue_pairs == 0 || self.max_io_queue_pairs > 1024 {
            return Err(format!("max_io_queue_pairs {} is not 1..=1024", self.max_io_queue_pairs));
        }
        if self.dstrd > 4 {
            return Err(format!("dstrd {} is larger than this emulator supports (4)", self.dstrd));
        }
        if self.mps_min > self.mps_max || self.mps_max > 15 {
            return Err(format!("mps_min {} / mps_max {} are inconsistent", self.mps_min, self.mps_max));
        }
        self.cost.validate()?;
        if self.mdts > 0 && self.mdts as u32 + 12 + self.mps_min as u32 > 30 {
            return Err(format!("mdts {} gives a transfer over 1 GiB", self.mdts));
        }
        Ok(())
    }
}
