//! A client's session: its hello, its seat on the arbitration board, and giving back
//! everything it held when it goes.

use super::reply::{err, invalid, ok, Reply};
use super::state::{ClientState, IovaRange};
use super::Service;
use crate::proto::{ArbitrationReply, ErrorKind, Response, MAX_NAME, PROTOCOL};
use std::collections::HashSet;
use tutti_objstore::{PoolControl, Verdict};

impl Service {
    /// `Hello`: the protocol check and the client's name; every other request waits for it.
    pub(super) fn hello(&self, client: u64, protocol: u32, name: String) -> Reply {
        if protocol != PROTOCOL {
            return Err(err(
                ErrorKind::Protocol,
                format!(
                    "this tuttid speaks protocol {PROTOCOL}, the client {protocol}; use matching versions"
                ),
            ));
        }
        if name.len() > MAX_NAME {
            return Err(invalid(format!("client name of {} bytes; at most {MAX_NAME}", name.len())));
        }
        self.with_client(client, |c| {
            c.hello = true;
            c.name = name;
        });
        ok(Response::Welcome { protocol: PROTOCOL, client, daemon_pid: std::process::id() })
    }

    /// `Arbitration`: a slot on the board for the client (one each), with the board's memfd.
    pub(super) fn arbitration_seat(&self, client: u64) -> Reply {
        if let Some(s) = self.with_client(client, |c| c.seat).flatten() {
            return Err(invalid(format!("this client holds arbitration slot {} already", s.slot)));
        }
        let fd = self
            .board
            .fd()
            .try_clone_to_owned()
            .map_err(|e| err(ErrorKind::Io, format!("duplicating the arbitration board's fd: {e}")))?;
        let Some(seat) = self.board.assign() else {
            return Err(err(
                ErrorKind::Busy,
                format!("all {} arbitration slots are held by connected clients", self.board.slots()),
            ));
        };
        self.with_client(client, |c| c.seat = Some(seat));
        let reply = ArbitrationReply {
            slot: seat.slot as u32,
            generation: seat.generation,
            slots: self.board.slots() as u32,
            drives: self.board.drives() as u32,
        };
        tracing::debug!(client, slot = seat.slot, generation = seat.generation, "arbitration slot given");
        Ok((Response::Arbitration(reply), vec![fd]))
    }

    /// Gives back everything `client` held. Its queues go first: deleting a
    /// submission queue completes or aborts every command in it (§5.6), so
    /// after that no write of the client can still land in a file that is
    /// freed here, and no read into its (maybe freed) memory can happen.
    pub(super) fn release(&self, client: u64, state: ClientState) {
        self.drop_proxy(client);
        // IOVA ranges holding rings of queues that could not be deleted stay out of use.
        let mut live_rings = HashSet::new();
        for (&(ctrl, qid), &exists) in &state.qids {
            let Some(s) = self.ctrls.get(ctrl as usize) else { continue };
            if exists {
                if let Err(e) = s.ctrl.delete_io_queues(qid) {
                    tracing::error!(client, device = %s.ctrl.name(), qid, error = %e,
                        "deleting a departed client's queues failed; the queue id stays claimed");
                    if let Some(r) = state.queue_ranges.get(&(ctrl, qid)) {
                        live_rings.extend(r.iter().map(|&base| (ctrl, base)));
                    }
                    continue;
                }
            }
            s.ctrl.release_io_qid(qid);
        }
        // Its queues are gone, so none of its commands is still on a drive: what it announced
        // on the arbitration board stops counting, and nothing it held blocks a drive.
        if let Some(seat) = state.seat {
            self.board.release(seat);
            tracing::debug!(client, slot = seat.slot, "arbitration slot taken back");
        }
        for s in &self.ctrls {
            if let Some(emu) = &s.emulated {
                emu.iommu().unmap_owner(client);
            }
        }
        // The client's own MAP_DMAs: the container is shared, so the daemon can
        // unmap them (and so unpin the pages of a client that died).
        for (&(ctrl, iova), &IovaRange { len, mapped, .. }) in &state.iovas {
            let Some(dev) = self.ctrls.get(ctrl as usize).and_then(|s| s.vfio.as_ref()) else { continue };
            if live_rings.contains(&(ctrl, iova)) {
                tracing::error!(client, device = %dev.bdf(), iova, len,
                    "a departed client's IOVA range holds rings of queues that could not be deleted; it stays mapped and out of use");
                continue;
            }
            match dev.vfio_dma().release_iova(iova, len) {
                Ok(0) => tracing::debug!(
                    client,
                    ctrl,
                    iova,
                    len,
                    mapped,
                    "a departed client's IOVA range released"
                ),
                Ok(unmapped) => tracing::info!(client, device = %dev.bdf(), iova, unmapped,
                    "unmapped what a departed client had mapped itself (its pages are unpinned); range released"),
                Err(e) => tracing::error!(client, ctrl, iova, len, error = %e,
                    "releasing a departed client's IOVA range failed; the range stays out of use"),
            }
        }
        for (id, news) in state.reservations {
            // Not committed, so never visible; its files are free again.
            let _held = self.board.hold_for_metadata(None, crate::arbitration::METADATA_WAIT);
            if let Err(e) = self.pool.settle(id, &vec![Verdict::GiveUp; news]) {
                tracing::error!(client, reservation = id, error = %e, "aborting a departed client's store failed");
            }
        }
        for (f, n) in state.loads {
            for _ in 0..n {
                if let Err(e) = self.pool.end_load(&[f]) {
                    tracing::error!(client, file = f, error = %e, "dropping a departed client's load reference failed");
                }
            }
        }
        for pin in state.pins {
            if let Err(e) = self.pool.unpin(pin) {
                tracing::error!(client, pin, error = %e, "dropping a departed client's pin failed");
            }
        }
        tracing::info!(client, name = %state.name, "client released");
    }
}
