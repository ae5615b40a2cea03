//! The shared pool: its shape and controllers for a client's first call, and the index
//! operations (lookups, pins, load references, reservations and their settling), each
//! remembered per client so a departed client's holds can be given back.

use super::reply::{cap, err, from_obj, invalid, ok, Reply};
use super::Service;
use crate::proto::{ControllerKind, ControllerReply, ErrorKind, PoolReply, Response, MAX_FILES, MAX_HASHES};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use tutti_objstore::{BlockHash, DataPathReport, FileId, IdentityId, PoolControl, Verdict};

impl Service {
    /// `Pool`: the pool's shape and how to reach each controller (an emulated one's
    /// register file comes as an fd; a VFIO one's fds come with `VfioFds`).
    pub(super) fn pool_reply(&self) -> Reply {
        let mut fds = Vec::new();
        let mut controllers = Vec::new();
        for (i, s) in self.ctrls.iter().enumerate() {
            if let Some(dev) = &s.vfio {
                // Its fds come with VfioFds (two per controller; a frame carries at most 8).
                controllers.push(ControllerReply {
                    kind: ControllerKind::Vfio { group: dev.iommu_group() },
                    info: s.ctrl.info().clone(),
                });
                continue;
            }
            let Some(emu) = &s.emulated else {
                return Err(err(
                    ErrorKind::Io,
                    format!("controller {i} ({}) is neither emulated nor a VFIO device", s.ctrl.name()),
                ));
            };
            let regs = emu.register_file();
            let fd = regs.memfd().try_clone_to_owned().map_err(|e| {
                err(ErrorKind::Io, format!("duplicating the register file of {}: {e}", s.ctrl.name()))
            })?;
            fds.push(fd);
            controllers.push(ControllerReply {
                kind: ControllerKind::Emulated {
                    register_len: tutti_driver::transport::Registers::len(&**regs) as u64,
                },
                info: s.ctrl.info().clone(),
            });
        }
        let reply = PoolReply { shape: self.pool.shape().clone(), controllers, drives: self.drives.clone() };
        Ok((Response::Pool(Box::new(reply)), fds))
    }

    /// Counts the data-path report a client's `EndLoad` or `Settle` carries (before the
    /// request itself is checked: the counters are the client's word, not the pool's state).
    pub(super) fn note_report(&self, client: u64, report: Option<Box<DataPathReport>>) {
        if let Some(r) = report {
            self.counters.report(client, *r, self.drives.len());
        }
    }

    /// `Stats`: the pool's counters.
    pub(super) fn stats(&self) -> Reply {
        ok(self.pool.stats().map(Response::Stats).map_err(from_obj)?)
    }

    /// `Lookup`: the files holding a prefix of `hashes`, pinned for the client.
    pub(super) fn lookup(&self, client: u64, identity: IdentityId, hashes: &[BlockHash]) -> Reply {
        cap("hashes", hashes.len(), MAX_HASHES)?;
        let found = self.pool.lookup(identity, hashes).map_err(from_obj)?;
        self.counters.lookup(hashes.len(), found.files.len());
        if found.pin != 0 {
            self.with_client(client, |c| c.pins.insert(found.pin));
        }
        ok(Response::Lookup(found))
    }

    /// `Contains`: how long a prefix of `hashes` the pool holds.
    pub(super) fn contains(&self, identity: IdentityId, hashes: &[BlockHash]) -> Reply {
        cap("hashes", hashes.len(), MAX_HASHES)?;
        ok(Response::Count(self.pool.contains(identity, hashes).map_err(from_obj)? as u64))
    }

    /// `Unpin`: drops a pin a lookup gave the client (pin 0 is none).
    pub(super) fn unpin(&self, client: u64, pin: u64) -> Reply {
        if pin == 0 {
            return ok(Response::Ok);
        }
        if !self.with_client(client, |c| c.pins.remove(&pin)).unwrap_or(false) {
            return Err(invalid(format!("pin {pin} is not this client's")));
        }
        self.pool.unpin(pin).map_err(from_obj)?;
        ok(Response::Ok)
    }

    /// `BeginLoad`: takes a load reference on each of `files` for the client.
    pub(super) fn begin_load(&self, client: u64, identity: IdentityId, files: &[FileId]) -> Reply {
        cap("files", files.len(), MAX_FILES)?;
        self.pool.begin_load(identity, files).map_err(from_obj)?;
        self.counters.load_references.fetch_add(files.len() as u64, Ordering::Relaxed);
        self.with_client(client, |c| {
            for f in files {
                *c.loads.entry(*f).or_default() += 1;
            }
        });
        ok(Response::Ok)
    }

    /// `EndLoad`: drops load references the client holds, all or nothing.
    pub(super) fn end_load(&self, client: u64, files: &[FileId]) -> Reply {
        cap("files", files.len(), MAX_FILES)?;
        // Only references this client holds, all or nothing.
        let held = self
            .with_client(client, |c| {
                let mut need: HashMap<FileId, u32> = HashMap::new();
                for f in files {
                    *need.entry(*f).or_default() += 1;
                }
                if need.iter().any(|(f, n)| c.loads.get(f).copied().unwrap_or(0) < *n) {
                    return false;
                }
                for (f, n) in need {
                    if let Some(h) = c.loads.get_mut(&f) {
                        *h -= n;
                        if *h == 0 {
                            c.loads.remove(&f);
                        }
                    }
                }
                true
            })
            .unwrap_or(false);
        if !held {
            return Err(invalid("end-load names files this client holds no load reference on"));
        }
        self.pool.end_load(files).map_err(from_obj)?;
        ok(Response::Ok)
    }

    /// `Reserve`: files for the blocks of `hashes` the pool lacks, held for the client's store.
    pub(super) fn reserve(&self, client: u64, identity: IdentityId, hashes: &[BlockHash]) -> Reply {
        cap("hashes", hashes.len(), MAX_HASHES)?;
        let (id, entries) = {
            // Evictions may append to the journals.
            let _held = self.hold_for_metadata(client);
            self.pool.reserve(identity, hashes).map_err(from_obj)?
        };
        let news = entries.iter().filter(|e| matches!(e, tutti_objstore::Reserved::New { .. })).count();
        self.with_client(client, |c| c.reservations.insert(id, news));
        ok(Response::Reserved { id, entries })
    }

    /// `Settle`: commits or gives up each new file of the client's reservation `id`.
    pub(super) fn settle(&self, client: u64, id: u64, verdicts: &[Verdict]) -> Reply {
        let news = self.with_client(client, |c| c.reservations.get(&id).copied()).flatten();
        let Some(news) = news else {
            return Err(invalid(format!("reservation {id} is not this client's")));
        };
        if verdicts.len() != news {
            return Err(invalid(format!(
                "reservation {id} has {news} new files, {} verdicts given",
                verdicts.len()
            )));
        }
        let results = {
            // Committing flushes the drives and appends to the journals.
            let _held = self.hold_for_metadata(client);
            self.pool.settle(id, verdicts).map_err(from_obj)?
        };
        self.with_client(client, |c| c.reservations.remove(&id));
        ok(Response::Settled(results))
    }
}
