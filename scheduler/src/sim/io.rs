//! What the simulated engine and the policies share: the request's I/O and the submission side
//! of the SSD model. The engine advances time; a policy decides what to issue.

use crate::policy::Issue;
use crate::sim::ssd::{Completion, SsdArray, Tag};
use crate::{IoKind, RequestShape, SchedError};

/// The I/O one request needs, per layer and drive.
pub(crate) struct RequestIo {
    pub shape: RequestShape,
    pub reads: Vec<Vec<u32>>,
    pub writes: Vec<Vec<u32>>,
}

/// Submission side of the SSD model plus the bookkeeping the engine waits on.
pub(crate) struct Io {
    pub(super) now: f64,
    pub(super) array: SsdArray,
    iocb_bytes: f64,
    /// Read IOCBs of the current request not yet completed, per layer.
    pub(super) reads_left: Vec<u64>,
    writes_in_device: u64,
}

impl Io {
    pub(super) fn new(array: SsdArray, iocb_bytes: f64) -> Self {
        Io { now: 0.0, array, iocb_bytes, reads_left: Vec::new(), writes_in_device: 0 }
    }

    pub fn now_ns(&self) -> u64 {
        self.now.round() as u64
    }

    pub fn writes_in_device(&self) -> u64 {
        self.writes_in_device
    }

    pub fn issue(&mut self, i: Issue) -> Result<(), SchedError> {
        if i.iocbs == 0 {
            return Ok(());
        }
        if i.drive >= self.array.drives() {
            return Err(SchedError::Sim(format!("issue to drive {} of {}", i.drive, self.array.drives())));
        }
        let tag = match (i.kind, i.layer) {
            (IoKind::Read, Some(layer)) => Tag::Read { layer },
            (IoKind::Read, None) => return Err(SchedError::Sim("read issued without a layer".into())),
            (IoKind::Write, _) => {
                self.writes_in_device += u64::from(i.iocbs);
                Tag::Write
            }
        };
        self.array.submit(self.now, i.drive, tag, i.iocbs, f64::from(i.iocbs) * self.iocb_bytes);
        Ok(())
    }

    pub fn issue_all(&mut self, issues: &[Issue]) -> Result<(), SchedError> {
        issues.iter().try_for_each(|&i| self.issue(i))
    }

    pub(super) fn account(&mut self, c: &Completion) {
        match c.tag {
            Tag::Read { layer } => {
                if let Some(left) = self.reads_left.get_mut(layer as usize) {
                    *left = left.saturating_sub(u64::from(c.iocbs));
                }
            }
            Tag::Write => self.writes_in_device = self.writes_in_device.saturating_sub(u64::from(c.iocbs)),
        }
    }
}
