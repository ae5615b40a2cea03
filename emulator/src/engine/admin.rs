//! Admin commands (§5): Identify, features, and the I/O queues' life cycle.

use super::{Cq, Done, Engine, QueueMem, Sq, VERSION};
use crate::walk::walk_prp;
use tutti_driver::spec::identify::{nidt, oncs, put_descriptor, set_ascii_field};
use tutti_driver::spec::opcode::{cns, feature};
use tutti_driver::spec::{
    AdminOpcode, IdentifyController, IdentifyNamespace, LbaFormat, Psdt, Status, SubmissionEntry,
};
use tutti_driver::spec::{CQE_SIZE, SQE_SIZE};
use zerocopy::IntoBytes;

/// PCI vendor id reported in Identify Controller.
const VENDOR_ID: u16 = 0x1de5;
/// DLFEAT (§5.15.2.2): deallocated blocks read as zeroes (bits 2:0 = 001b), and
/// the Deallocate bit of Write Zeroes is supported (bit 3).
const DLFEAT: u8 = 0x01 | 0x08;
/// VWC bits 2:1 = 11b: Flush accepts NSID FFFFFFFFh (§5.15.2.1); bit 0: a cache is present.
const VWC_FLUSH_ALL: u8 = 0b110;
const FEATURE_NOT_SAVEABLE: Status = Status::command_specific(0x0d);
/// Active namespace lists hold up to 1024 NSIDs (§5.15.2, CNS 02h).
const NSID_LIST_LEN: usize = 1024;

fn qid_of(sqe: &SubmissionEntry) -> u16 {
    sqe.cdw10 as u16
}

/// Queue entries from CDW10 QSIZE, which is 0-based.
fn entries_of(sqe: &SubmissionEntry) -> u32 {
    (sqe.cdw10 >> 16) + 1
}

impl Engine {
    pub(super) fn admin_command(&mut self, sqe: &SubmissionEntry) -> Done {
        // Over PCIe admin commands use PRPs (§4.2 PSDT) and are never fused.
        if sqe.psdt() != Psdt::Prp || sqe.fuse() != 0 {
            return Done::err(Status::INVALID_FIELD);
        }
        let result = match AdminOpcode::from_raw(sqe.opcode()) {
            Some(AdminOpcode::Identify) => self.identify(sqe),
            Some(AdminOpcode::SetFeatures) => self.set_features(sqe),
            Some(AdminOpcode::GetFeatures) => self.get_features(sqe),
            Some(AdminOpcode::CreateIoCq) => self.create_cq(sqe),
            Some(AdminOpcode::CreateIoSq) => self.create_sq(sqe),
            Some(AdminOpcode::DeleteIoSq) => self.delete_sq(sqe),
            Some(AdminOpcode::DeleteIoCq) => self.delete_cq(sqe),
            // §5.1: DW0 bit 0 set = command not aborted. Commands here run to
            // completion before a later Abort can be fetched.
            Some(AdminOpcode::Abort) => Ok(1),
            Some(AdminOpcode::GetLogPage) | None => Err(Status::INVALID_OPCODE),
        };
        result.into()
    }

    /// Copies `bytes` to the command's PRP data buffer.
    fn to_host(&self, sqe: &SubmissionEntry, bytes: &[u8]) -> Result<(), Status> {
        let iommu = &self.shared.iommu;
        let segs = walk_prp(sqe.prp1(), sqe.prp2(), bytes.len() as u64, self.page_size(), |a, b| {
            iommu.dma_read(a, b)
        })?;
        let mut pos = 0usize;
        for seg in segs {
            let n = seg.len as usize;
            iommu.dma_write(seg.iova, &bytes[pos..pos + n]).map_err(|_| Status::DATA_TRANSFER_ERROR)?;
            pos += n;
        }
        Ok(())
    }

    fn identify(&mut self, sqe: &SubmissionEntry) -> Result<u32, Status> {
        match sqe.cdw10 as u8 {
            cns::NAMESPACE => self.to_host(sqe, self.identify_namespace(sqe.nsid)?.as_bytes())?,
            cns::CONTROLLER => self.to_host(sqe, self.identify_controller().as_bytes())?,
            cns::ACTIVE_NAMESPACES => self.to_host(sqe, self.active_namespaces(sqe.nsid)?.as_bytes())?,
            cns::NAMESPACE_DESCRIPTORS => {
                let (_, ns) = self.namespace(sqe.nsid)?;
                let mut page = [0u8; 4096];
                let mut eui = [0u8; 8];
                eui[..4].copy_from_slice(&sqe.nsid.to_be_bytes());
                let at = put_descriptor(&mut page, 0, nidt::EUI64, &eui);
                put_descriptor(&mut page, at, nidt::CSI, &[ns.command_set]);
                self.to_host(sqe, &page)?
            }
            _ => return Err(Status::INVALID_FIELD),
        }
        Ok(0)
    }

    fn identify_controller(&self) -> IdentifyController {
        let cfg = &self.shared.cfg;
        let mut id = IdentifyController::new_zeroed();
        id.vid = VENDOR_ID;
        id.ssvid = VENDOR_ID;
        set_ascii_field(&mut id.sn, &cfg.serial);
        set_ascii_field(&mut id.mn, &cfg.model);
        set_ascii_field(&mut id.fr, &cfg.firmware);
        id.mdts = cfg.mdts;
        id.cntlid = 1;
        id.ver = VERSION;
        id.sqes = 0x66;
        id.cqes = 0x44;
        id.nn = cfg.namespaces.len() as u32;
        id.oncs = oncs::DATASET_MANAGEMENT | oncs::WRITE_ZEROES;
        id.vwc = VWC_FLUSH_ALL | cfg.volatile_write_cache as u8;
        // SGLS bit 16 (§5.15.2.1): the SGL walker honours Bit Bucket descriptors in reads.
        id.sgls = cfg.sgl.to_sgls() | if cfg.sgl.available() { 1 << 16 } else { 0 };
        id
    }

    fn identify_namespace(&self, nsid: u32) -> Result<IdentifyNamespace, Status> {
        let (_, ns) = self.namespace(nsid)?;
        let mut id = IdentifyNamespace::new_zeroed();
        id.nsze = ns.blocks;
        id.ncap = ns.blocks;
        id.nuse = ns.blocks;
        // Two standard formats, plus the configured one if it is neither.
        id.lbaf[0] = LbaFormat::new(9, 0).0;
        id.lbaf[1] = LbaFormat::new(12, 0).0;
        id.flbas = match (ns.lba_shift, ns.metadata_size) {
            (9, 0) => 0,
            (12, 0) => 1,
            (other, ms) => {
                id.lbaf[2] = LbaFormat::new(other, ms).0;
                2
            }
        };
        id.nlbaf = id.flbas.max(1);
        if ns.extended_metadata {
            id.flbas |= 0x10;
        }
        id.dps = ns.pi_type;
        id.dlfeat = DLFEAT;
        Ok(id)
    }

    fn active_namespaces(&self, after: u32) -> Result<[u32; NSID_LIST_LEN], Status> {
        if after >= 0xffff_fffe {
            return Err(Status::INVALID_NAMESPACE);
        }
        let mut list = [0u32; NSID_LIST_LEN];
        let nn = self.shared.cfg.namespaces.len() as u32;
        for (slot, nsid) in list.iter_mut().zip((1..=nn).filter(|&n| n > after)) {
            *slot = nsid;
        }
        Ok(list)
    }

    fn queue_count_dw0(sq: u16, cq: u16) -> u32 {
        (sq as u32 - 1) | (cq as u32 - 1) << 16
    }

    fn io_queues_exist(&self) -> bool {
        self.sqs.iter().skip(1).any(Option::is_some) || self.cqs.iter().skip(1).any(Option::is_some)
    }

    fn set_features(&mut self, sqe: &SubmissionEntry) -> Result<u32, Status> {
        if sqe.cdw10 & (1 << 31) != 0 {
            return Err(FEATURE_NOT_SAVEABLE);
        }
        match sqe.cdw10 as u8 {
            feature::NUMBER_OF_QUEUES => {
                // §5.21.1.7: allocated during initialization, before any I/O queue is created
                // (queues created and deleted again still count, as on QEMU's controller).
                if self.io_queues_exist() || self.features.queues_created {
                    return Err(Status::COMMAND_SEQUENCE_ERROR);
                }
                let (nsqr, ncqr) = (sqe.cdw11 & 0xffff, sqe.cdw11 >> 16);
                if nsqr == 0xffff || ncqr == 0xffff {
                    return Err(Status::INVALID_FIELD);
                }
                let max = self.shared.cfg.max_io_queue_pairs as u32;
                self.features.sq_granted = (nsqr + 1).min(max) as u16;
                self.features.cq_granted = (ncqr + 1).min(max) as u16;
                Ok(Self::queue_count_dw0(self.features.sq_granted, self.features.cq_granted))
            }
            feature::VOLATILE_WRITE_CACHE if self.shared.cfg.volatile_write_cache => {
                self.features.write_cache = sqe.cdw11 & 1 != 0;
                Ok(0)
            }
            _ => Err(Status::INVALID_FIELD),
        }
    }

    fn get_features(&mut self, sqe: &SubmissionEntry) -> Result<u32, Status> {
        // SEL (CDW10 bits 10:8): 0 current, 1 default, 2 saved (= default: nothing is saveable),
        // 3 capabilities (bit 2: changeable).
        let select = (sqe.cdw10 >> 8) & 0x7;
        let fid = sqe.cdw10 as u8;
        let max = self.shared.cfg.max_io_queue_pairs;
        let known = fid == feature::NUMBER_OF_QUEUES
            || (fid == feature::VOLATILE_WRITE_CACHE && self.shared.cfg.volatile_write_cache);
        if !known || select > 3 {
            return Err(Status::INVALID_FIELD);
        }
        if select == 3 {
            return Ok(1 << 2);
        }
        let current = select == 0;
        Ok(match fid {
            feature::NUMBER_OF_QUEUES if current => {
                Self::queue_count_dw0(self.features.sq_granted, self.features.cq_granted)
            }
            feature::NUMBER_OF_QUEUES => Self::queue_count_dw0(max, max),
            _ if current => self.features.write_cache as u32,
            _ => 1,
        })
    }

    fn check_queue_size(&self, entries: u32) -> Result<(), Status> {
        if entries < 2 || entries > self.shared.cfg.max_queue_entries {
            return Err(Status::INVALID_QUEUE_SIZE);
        }
        Ok(())
    }

    /// The memory of a new queue: PRP1 is its base (PC = 1) or a PRP list of its pages (PC = 0).
    fn queue_mem(
        &self,
        prp1: u64,
        contiguous: bool,
        entries: u32,
        entry_size: usize,
    ) -> Result<QueueMem, Status> {
        let page = self.page_size();
        if prp1 & (page - 1) != 0 {
            return Err(Status::INVALID_FIELD);
        }
        if contiguous {
            return Ok(QueueMem::Contiguous(prp1));
        }
        if self.shared.cfg.contiguous_queues_required {
            // CAP.CQR = 1 (§3.1.1): PC = 0 is invalid.
            return Err(Status::INVALID_FIELD);
        }
        let count = (entries as u64 * entry_size as u64).div_ceil(page) as usize;
        let mut raw = vec![0u8; count * 8];
        self.shared.iommu.dma_read(prp1, &mut raw).map_err(|_| Status::DATA_TRANSFER_ERROR)?;
        let mut pages = Vec::with_capacity(count);
        for word in raw.chunks_exact(8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(word);
            let p = u64::from_le_bytes(b);
            if p & (page - 1) != 0 {
                return Err(Status::PRP_OFFSET_INVALID);
            }
            pages.push(p);
        }
        Ok(QueueMem::Pages(pages))
    }

    /// Create I/O Completion Queue (§5.3).
    fn create_cq(&mut self, sqe: &SubmissionEntry) -> Result<u32, Status> {
        let (qid, entries) = (qid_of(sqe), entries_of(sqe));
        if qid == 0 || qid > self.features.cq_granted || self.cqs[qid as usize].is_some() {
            return Err(Status::INVALID_QID);
        }
        self.check_queue_size(entries)?;
        let mem = self.queue_mem(sqe.prp1(), sqe.cdw11 & 1 != 0, entries, CQE_SIZE)?;
        self.zero_cq_doorbell(qid);
        let mut cq = Cq::new(mem, entries, 0);
        cq.remote = cq.mem.is_remote(&self.shared.iommu);
        self.cqs[qid as usize] = Some(cq);
        self.features.queues_created = true;
        Ok(0)
    }

    /// Create I/O Submission Queue (§5.4).
    fn create_sq(&mut self, sqe: &SubmissionEntry) -> Result<u32, Status> {
        let (qid, entries) = (qid_of(sqe), entries_of(sqe));
        let cqid = (sqe.cdw11 >> 16) as u16;
        if qid == 0 || qid > self.features.sq_granted || self.sqs[qid as usize].is_some() {
            return Err(Status::INVALID_QID);
        }
        // The admin CQ (0) only takes admin completions.
        if cqid == 0 || self.cqs.get(cqid as usize).is_none_or(Option::is_none) {
            return Err(Status::CQ_INVALID);
        }
        self.check_queue_size(entries)?;
        let mem = self.queue_mem(sqe.prp1(), sqe.cdw11 & 1 != 0, entries, SQE_SIZE)?;
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.bound_sqs += 1;
        }
        self.zero_sq_doorbell(qid);
        let mut sq = Sq::new(mem, entries, cqid);
        sq.remote = sq.mem.is_remote(&self.shared.iommu);
        // I/O queues are scoped to their memory's owner (an unmapped ring has
        // none, and then every command of it fails its DMA).
        sq.owner = Some(sq.mem.owner(&self.shared.iommu).unwrap_or(u64::MAX));
        self.sqs[qid as usize] = Some(sq);
        Ok(0)
    }

    /// Delete I/O Submission Queue (§5.6): commands still in progress are aborted first.
    fn delete_sq(&mut self, sqe: &SubmissionEntry) -> Result<u32, Status> {
        let qid = qid_of(sqe);
        if qid == 0 || self.sqs.get(qid as usize).is_none_or(Option::is_none) {
            return Err(Status::INVALID_QID);
        }
        self.abort_pending_for_sq(qid);
        if let Some(sq) = self.sqs[qid as usize].take() {
            if let Some(cq) = self.cqs[sq.cqid as usize].as_mut() {
                cq.bound_sqs = cq.bound_sqs.saturating_sub(1);
            }
        }
        self.zero_sq_doorbell(qid);
        Ok(0)
    }

    /// Delete I/O Completion Queue (§5.5): refused while an SQ still posts to it.
    fn delete_cq(&mut self, sqe: &SubmissionEntry) -> Result<u32, Status> {
        let qid = qid_of(sqe);
        let Some(cq) = self.cqs.get(qid as usize).and_then(Option::as_ref).filter(|_| qid != 0) else {
            return Err(Status::INVALID_QID);
        };
        if cq.bound_sqs > 0 {
            return Err(Status::INVALID_QUEUE_DELETION);
        }
        self.cqs[qid as usize] = None;
        self.pending.retain(|p| p.cqid != qid);
        self.zero_cq_doorbell(qid);
        Ok(0)
    }
}
