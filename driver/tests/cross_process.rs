//! A client process on a lease: its own queue pairs on a controller another
//! process (the owner, standing in for the daemon) runs, its own memory
//! reached through the owner's IOMMU, and what the owner does when it dies.
//!
//! The client is this test binary run again (`--exact child_process`) with
//! `CHILD_ENV` naming what it does; the register file's memfd is its fd 3
//! and a socket to the owner its fd 4. Over the socket a line protocol
//! stands in for the daemon: INFO, CLAIM, RELEASE, CREATE, DELETE, MAP,
//! UNMAP, FREE, READY.

// Test code: a panic is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tutti_driver::command::{Command as NvmeCommand, DataMode};
use tutti_driver::controller::{Controller, ControllerInfo, ControllerOptions, QueueAdmin};
use tutti_driver::spec::Status;
use tutti_driver::transport::remote::{BrokeredDma, DmaBroker};
use tutti_driver::transport::{DmaSpace, IovaSegment, Registers};
use tutti_driver::{DriverError, Result};
use tutti_emulator::{
    EmuIommu, EmulatedConfig, EmulatedController, FaultAction, FaultInjector, FaultMatch, NamespaceConfig,
    RegisterFile,
};

const CHILD_ENV: &str = "TUTTI_DRIVER_TEST_CHILD";
const REGS_LEN_ENV: &str = "TUTTI_DRIVER_TEST_REGS_LEN";
const OWNER: u64 = 42;
const NSID: u32 = 1;
const LBA: u32 = 512;
/// What the client writes (and the owner reads back) at `CLIENT_LBA`.
const CLIENT_LBA: u64 = 64;
const CLIENT_BYTES: usize = 300 << 10;
const CLIENT_SEED: u64 = 0x5eed;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn start_owner(name: &str) -> (EmulatedController, Arc<Controller>) {
    let cfg = EmulatedConfig {
        name: name.into(),
        namespaces: vec![NamespaceConfig::with_bytes(32 << 20, LBA)],
        max_io_queue_pairs: 4,
        ..EmulatedConfig::default()
    };
    let emu = EmulatedController::start(cfg).unwrap();
    let opts = ControllerOptions { io_queue_pairs: 4, ..ControllerOptions::default() };
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), opts).unwrap();
    (emu, ctrl)
}

/// What the owner's server saw of its client.
#[derive(Default)]
struct Seen {
    qids: Vec<u16>,
    iovas: Vec<u64>,
    ready: bool,
}

/// The owner's side of the line protocol, until the client closes the socket.
/// With `stall`, every command on a queue the client claims executes only
/// after a minute (so it is still in flight when the client is killed).
fn serve(
    stream: UnixStream,
    ctrl: Arc<Controller>,
    iommu: EmuIommu,
    stall: Option<Arc<FaultInjector>>,
    pid: i32,
    seen: Arc<Mutex<Seen>>,
) {
    let mut out = stream.try_clone().unwrap();
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(u64::MAX);
        let reply: Result<String> = match w.first().copied() {
            Some("INFO") => Ok(serde_json::to_string(ctrl.info()).unwrap()),
            Some("CLAIM") => ctrl.claim_io_qid("test client").map(|q| {
                if let Some(f) = &stall {
                    let when = FaultMatch { qid: Some(q), ..FaultMatch::default() };
                    f.inject(when, FaultAction::DelayExecution(Duration::from_secs(60)), None);
                }
                seen.lock().unwrap().qids.push(q);
                q.to_string()
            }),
            Some("RELEASE") => {
                ctrl.release_io_qid(num(1) as u16);
                Ok(String::new())
            }
            Some("CREATE") => {
                let (qid, depth, sq, cq) = (num(1) as u16, num(2) as u32, num(3), num(4));
                // Queue memory must be the client's own.
                if !iommu.owned_by(sq, depth as usize * 64, OWNER)
                    || !iommu.owned_by(cq, depth as usize * 16, OWNER)
                {
                    Err(DriverError::invalid("queue memory is not the client's"))
                } else {
                    ctrl.create_queues_at(qid, depth, sq, cq).map(|()| String::new())
                }
            }
            Some("DELETE") => ctrl.delete_io_queues(num(1) as u16).map(|()| String::new()),
            Some("MAP") => iommu.map_remote(pid, num(1), num(2) as usize, OWNER).map(|iova| {
                seen.lock().unwrap().iovas.push(iova);
                iova.to_string()
            }),
            Some("UNMAP") => iommu.unmap(num(1), OWNER).map(|()| String::new()),
            Some("FREE") => Ok(ctrl.free_io_queue_pairs().to_string()),
            Some("READY") => {
                seen.lock().unwrap().ready = true;
                Ok(String::new())
            }
            _ => Err(DriverError::invalid(format!("unknown request {line:?}"))),
        };
        let text = match reply {
            Ok(v) => format!("OK {v}\n"),
            Err(e) => format!("ERR {e}\n"),
        };
        if out.write_all(text.as_bytes()).is_err() {
            break;
        }
    }
}

/// Starts the client with the register file at fd 3 and its end of a socket at fd 4.
fn spawn_client(mode: &str, emu: &EmulatedController) -> (Child, UnixStream) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let regs = emu.register_file();
    let (regs_fd, sock_fd) = (regs.memfd().as_raw_fd(), theirs.as_raw_fd());
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_process", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .env(REGS_LEN_ENV, regs.len().to_string());
    // SAFETY: dup2 is async-signal-safe; both descriptors stay open in the
    // parent until spawn returns. dup2 leaves FD_CLOEXEC clear on 3 and 4.
    unsafe {
        cmd.pre_exec(move || {
            // Above 4 first, so that neither lands on the other's target.
            let (r, s) = (libc::fcntl(regs_fd, libc::F_DUPFD, 10), libc::fcntl(sock_fd, libc::F_DUPFD, 10));
            if r < 0 || s < 0 || libc::dup2(r, 3) < 0 || libc::dup2(s, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop(theirs);
    (child, ours)
}

/// Runs the owner's server for `child` on a thread.
fn serve_client(
    child: &Child,
    sock: UnixStream,
    ctrl: &Arc<Controller>,
    emu: &EmulatedController,
    stall: bool,
) -> (Arc<Mutex<Seen>>, std::thread::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (c, i, s, pid) = (ctrl.clone(), emu.iommu().clone(), seen.clone(), child.id() as i32);
    let f = stall.then(|| emu.faults().clone());
    (seen, std::thread::spawn(move || serve(sock, c, i, f, pid, s)))
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            panic!("client did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_process_writes_and_reads_its_own_memory_through_a_lease() {
    let (emu, ctrl) = start_owner("emu-lease-rt");
    let (mut child, sock) = spawn_client("roundtrip", &emu);
    let (seen, server) = serve_client(&child, sock, &ctrl, &emu, false);
    let st = wait_exit(&mut child, Duration::from_secs(60));
    server.join().unwrap();
    assert!(st.success(), "client failed: {st}");
    assert!(!seen.lock().unwrap().qids.is_empty(), "the client claimed a queue pair");
    assert_eq!(emu.iommu().regions_of(OWNER), 0, "the client unmapped everything it mapped");
    assert_eq!(ctrl.free_io_queue_pairs(), 4, "the client's queue ids went back");
    assert!(emu.stats().iommu_faults >= 1, "the client's stray IOVA faulted in the owner's IOMMU");

    // The owner reads what the client wrote from its own memory.
    let mut pair = ctrl.create_io_queue_pair(16).unwrap();
    let buf = ctrl.dma().alloc(CLIENT_BYTES).unwrap();
    pair.read_buf(NSID, CLIENT_LBA, &buf, 0, CLIENT_BYTES, DataMode::Auto).unwrap();
    let mut got = vec![0u8; CLIENT_BYTES];
    buf.copy_out(0, &mut got).unwrap();
    assert!(got == pattern(CLIENT_SEED, CLIENT_BYTES), "the owner reads back the client's bytes");
}

#[test]
fn a_client_killed_with_commands_in_flight_releases_its_lease() {
    let (emu, ctrl) = start_owner("emu-lease-kill");
    let mut own = ctrl.create_io_queue_pair(16).unwrap();
    // What the client's writes would overwrite, if any ran.
    let before = pattern(77, 31 * 8 * LBA as usize);
    let probe = ctrl.dma().alloc(before.len()).unwrap();
    probe.copy_in(0, &before).unwrap();
    own.write_buf(NSID, 20_000, &probe, 0, probe.len(), DataMode::Auto).unwrap();
    let faults_before = emu.stats().iommu_faults;
    let (mut child, sock) = spawn_client("hold", &emu);
    let (seen, server) = serve_client(&child, sock, &ctrl, &emu, true);
    let start = Instant::now();
    while !seen.lock().unwrap().ready {
        assert!(start.elapsed() < Duration::from_secs(60), "client never got its commands in flight");
        assert!(child.try_wait().unwrap().is_none(), "client exited early");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (qid, iovas) = {
        let s = seen.lock().unwrap();
        (s.qids[0], s.iovas.clone())
    };
    child.kill().unwrap();
    child.wait().unwrap();
    server.join().unwrap();

    // Nothing of the dead process is reachable, though still mapped.
    assert!(emu.iommu().regions_of(OWNER) > 0);
    let mut b = [0u8; 8];
    for &iova in &iovas {
        assert!(emu.iommu().dma_read(iova, &mut b).is_err(), "IOVA {iova:#x} of a dead process was read");
        assert!(emu.iommu().dma_write(iova, &b).is_err(), "IOVA {iova:#x} of a dead process was written");
    }
    // What the daemon does for a client that went away.
    ctrl.delete_io_queues(qid).unwrap();
    ctrl.release_io_qid(qid);
    assert!(emu.iommu().unmap_owner(OWNER) >= 3, "SQ, CQ, scratch and data regions dropped");
    assert_eq!(emu.iommu().regions_of(OWNER), 0);
    assert!(emu.stats().iommu_faults > faults_before);
    emu.faults().clear();

    // The controller goes on serving the owner's own pair; the client's
    // stalled writes were aborted unexecuted (§5.6), not run late.
    assert!(!ctrl.status().unwrap().fatal(), "a dead client's queues made the controller fatal");
    assert_eq!(emu.stats().late_executions, 0);
    probe.fill(0);
    own.read_buf(NSID, 20_000, &probe, 0, probe.len(), DataMode::Auto).unwrap();
    let mut after = vec![0u8; probe.len()];
    probe.copy_out(0, &mut after).unwrap();
    assert!(after == before, "a killed client's aborted write reached the media");
    let data = pattern(9, 64 << 10);
    let buf = ctrl.dma().alloc(data.len()).unwrap();
    buf.copy_in(0, &data).unwrap();
    own.write_buf(NSID, 4096, &buf, 0, data.len(), DataMode::Auto).unwrap();
    buf.fill(0);
    own.read_buf(NSID, 4096, &buf, 0, data.len(), DataMode::Auto).unwrap();
    let mut got = vec![0u8; data.len()];
    buf.copy_out(0, &mut got).unwrap();
    assert!(got == data);
    // The qid can be leased again.
    let again = ctrl.create_io_queue_pair(16).unwrap();
    drop(again);
}

// ---- the client side ----

/// The client's socket to the owner; every call bounded by a deadline.
struct Link(Mutex<(BufReader<UnixStream>, UnixStream)>);

impl Link {
    fn call(&self, req: &str) -> Result<String> {
        let mut g = self.0.lock().unwrap();
        let (r, w) = &mut *g;
        w.write_all(format!("{req}\n").as_bytes()).map_err(|e| DriverError::io("sending to the owner", e))?;
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| DriverError::io("reading from the owner", e))?;
        let line = line.trim_end();
        if let Some(v) = line.strip_prefix("OK") {
            Ok(v.trim().to_string())
        } else if let Some(e) = line.strip_prefix("ERR") {
            Err(DriverError::invalid(format!("owner: {}", e.trim())))
        } else {
            Err(DriverError::invalid(format!("owner sent {line:?}")))
        }
    }
}

impl QueueAdmin for Link {
    fn claim_qid(&self, _purpose: &str) -> Result<u16> {
        Ok(self.call("CLAIM")?.parse().unwrap())
    }
    fn release_qid(&self, qid: u16) {
        let _ = self.call(&format!("RELEASE {qid}"));
    }
    fn create_queues(&self, qid: u16, depth: u32, sq: u64, cq: u64) -> Result<()> {
        self.call(&format!("CREATE {qid} {depth} {sq} {cq}")).map(drop)
    }
    fn delete_queues(&self, qid: u16) -> Result<()> {
        self.call(&format!("DELETE {qid}")).map(drop)
    }
    fn free(&self) -> u16 {
        self.call("FREE").unwrap().parse().unwrap()
    }
}

impl DmaBroker for Link {
    fn map(&self, addr: u64, len: usize) -> Result<u64> {
        Ok(self.call(&format!("MAP {addr} {len}"))?.parse().unwrap())
    }
    fn unmap(&self, iova: u64) {
        let _ = self.unmap_checked(iova);
    }
    fn unmap_checked(&self, iova: u64) -> Result<()> {
        self.call(&format!("UNMAP {iova}")).map(drop)
    }
}

/// Only does something in a client started by `spawn_client`.
#[test]
fn child_process() {
    let Ok(mode) = std::env::var(CHILD_ENV) else { return };
    let len: usize = std::env::var(REGS_LEN_ENV).unwrap().parse().unwrap();
    // SAFETY: fds 3 and 4 were set up by the parent for this process alone.
    let (regs_fd, sock) = unsafe { (OwnedFd::from_raw_fd(3), UnixStream::from_raw_fd(4)) };
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let link = Arc::new(Link(Mutex::new((BufReader::new(sock.try_clone().unwrap()), sock))));
    let regs: Arc<dyn Registers> = Arc::new(RegisterFile::from_fd("leased", regs_fd, len).unwrap());
    let info: ControllerInfo = serde_json::from_str(&link.call("INFO").unwrap()).unwrap();
    let dma: Arc<dyn DmaSpace> = Arc::new(BrokeredDma::new("leased", link.clone(), 4096).unwrap());
    let ctrl = Controller::leased(regs, dma, info, link.clone()).unwrap();
    assert!(matches!(
        ctrl.admin_command(NvmeCommand::identify_controller(), None),
        Err(DriverError::NotOwner { .. })
    ));
    match mode.as_str() {
        "roundtrip" => client_roundtrip(&ctrl),
        "hold" => client_hold(&ctrl, &link),
        other => panic!("unknown client mode {other}"),
    }
}

fn client_roundtrip(ctrl: &Arc<Controller>) {
    let free = ctrl.free_io_queue_pairs();
    let mut pair = ctrl.create_io_queue_pair(32).unwrap();
    assert_eq!(ctrl.free_io_queue_pairs(), free - 1);
    // Plain heap memory of this process, mapped by the owner.
    let src = pattern(CLIENT_SEED, CLIENT_BYTES);
    let mut dst = vec![0u8; CLIENT_BYTES + 8192];
    {
        // SAFETY: `src` outlives the mapping (dropped at the end of this block); the device only reads it.
        let m = unsafe { ctrl.dma().map(src.as_ptr().cast_mut(), src.len()).unwrap() };
        pair.write(NSID, CLIENT_LBA, m.segments(), DataMode::Auto).unwrap();
        // Into an unaligned spot of other memory, by PRP and (if offered) SGL.
        let at = 100;
        // SAFETY: `dst` outlives the mapping and nothing reads it while mapped.
        let d = unsafe { ctrl.dma().map(dst.as_mut_ptr().add(at), CLIENT_BYTES).unwrap() };
        pair.read(NSID, CLIENT_LBA, d.segments(), DataMode::Auto).unwrap();
        drop(d);
        assert!(dst[at..at + CLIENT_BYTES] == src[..], "read back what was written");
    }
    // A DmaBuffer of the brokered space.
    let buf = ctrl.dma().alloc(8192).unwrap();
    buf.copy_in(0, &src[..8192]).unwrap();
    pair.write_buf(NSID, 8000, &buf, 0, 8192, DataMode::Prp).unwrap();
    buf.fill(0);
    pair.read_buf(NSID, 8000, &buf, 0, 8192, DataMode::Prp).unwrap();
    let mut got = vec![0u8; 8192];
    buf.copy_out(0, &mut got).unwrap();
    assert!(got[..] == src[..8192]);
    // An IOVA the owner never mapped for anyone faults: a Data Transfer Error.
    let stray = [IovaSegment { iova: 0x7f_0000_0000, len: LBA as u64 }];
    match pair.read(NSID, 0, &stray, DataMode::Prp) {
        Err(DriverError::CommandFailed { status, .. }) => {
            assert_eq!(status.with_dnr(false), Status::DATA_TRANSFER_ERROR)
        }
        other => panic!("a read into an unmapped IOVA gave {other:?}"),
    }
    // Recovery goes through the owner too.
    pair.recover().unwrap();
    pair.read_buf(NSID, 8000, &buf, 0, 512, DataMode::Prp).unwrap();
    drop(buf);
    drop(pair);
    assert_eq!(ctrl.free_io_queue_pairs(), free);
}

fn client_hold(ctrl: &Arc<Controller>, link: &Link) {
    let mut pair = ctrl.create_io_queue_pair(32).unwrap();
    let src = pattern(3, 64 << 10);
    // SAFETY: `src` lives until this process is killed; the device only reads it.
    let m = unsafe { ctrl.dma().map(src.as_ptr().cast_mut(), src.len()).unwrap() };
    // The owner stalls this queue's commands (late execution); keep the queue full.
    for i in 0..31u64 {
        let segs = m.translate(0, 4096).unwrap();
        pair.submit_data(NvmeCommand::write(NSID, 20_000 + i * 8, 8), &segs, DataMode::Prp, i).unwrap();
    }
    pair.ring();
    link.call("READY").unwrap();
    // Killed from here on; bounded in case the owner never does.
    std::thread::sleep(Duration::from_secs(60));
    panic!("the owner did not kill this client");
}

// ---- in one process ----

/// Routes a leased controller's queue management to its owner in the same process.
struct Direct(Arc<Controller>);

impl QueueAdmin for Direct {
    fn claim_qid(&self, purpose: &str) -> Result<u16> {
        self.0.claim_io_qid(purpose)
    }
    fn release_qid(&self, qid: u16) {
        self.0.release_io_qid(qid)
    }
    fn create_queues(&self, qid: u16, depth: u32, sq: u64, cq: u64) -> Result<()> {
        self.0.create_queues_at(qid, depth, sq, cq)
    }
    fn delete_queues(&self, qid: u16) -> Result<()> {
        self.0.delete_io_queues(qid)
    }
    fn free(&self) -> u16 {
        self.0.free_io_queue_pairs()
    }
}

#[test]
fn a_leased_controller_refuses_admin_commands_and_never_touches_the_device_on_drop() {
    let (emu, owner) = start_owner("emu-lease-drop");
    let mut own = owner.create_io_queue_pair(8).unwrap();
    let leased = Controller::leased(
        emu.registers(),
        emu.dma_space(),
        owner.info().clone(),
        Arc::new(Direct(owner.clone())),
    )
    .unwrap();
    assert!(leased.is_leased() && !owner.is_leased());
    let err = leased.admin_command(NvmeCommand::identify_controller(), None).unwrap_err();
    assert!(matches!(err, DriverError::NotOwner { .. }), "{err}");
    assert!(err.to_string().contains("emu-lease-drop"), "{err}");
    assert_eq!(leased.free_io_queue_pairs(), 3);
    {
        let mut pair = leased.create_io_queue_pair(8).unwrap();
        assert_eq!(owner.free_io_queue_pairs(), 2);
        let buf = leased.dma().alloc(4096).unwrap();
        buf.copy_in(0, &pattern(1, 4096)).unwrap();
        pair.write_buf(NSID, 0, &buf, 0, 4096, DataMode::Auto).unwrap();
        let shared = leased.shared_io_queue_pair(4).unwrap();
        assert_eq!(owner.free_io_queue_pairs(), 1);
        drop(shared);
    }
    assert_eq!(owner.free_io_queue_pairs(), 3);
    leased.shutdown().unwrap();
    drop(leased);
    // The owner's controller is still up and its pair still works.
    assert!(owner.status().unwrap().ready() && !owner.is_shut_down());
    let buf = owner.dma().alloc(4096).unwrap();
    own.read_buf(NSID, 0, &buf, 0, 4096, DataMode::Auto).unwrap();
    let mut got = vec![0u8; 4096];
    buf.copy_out(0, &mut got).unwrap();
    assert!(got == pattern(1, 4096));
}

#[test]
fn a_lease_on_a_controller_that_is_not_up_or_does_not_match_is_refused() {
    let (emu, owner) = start_owner("emu-lease-bad");
    let admin = Arc::new(Direct(owner.clone()));
    let mut wrong = owner.info().clone();
    wrong.max_queue_entries += 1;
    let e = Controller::leased(emu.registers(), emu.dma_space(), wrong, admin.clone()).unwrap_err();
    assert!(e.to_string().contains("MQES"), "{e}");
    let mut wrong = owner.info().clone();
    wrong.max_transfer = 1 << 40;
    assert!(Controller::leased(emu.registers(), emu.dma_space(), wrong, admin.clone()).is_err());
    let mut wrong = owner.info().clone();
    wrong.namespaces[0].lba_size = 3;
    assert!(Controller::leased(emu.registers(), emu.dma_space(), wrong, admin.clone()).is_err());
    // A controller nobody brought up (CSTS.RDY = 0).
    let idle = EmulatedController::start(EmulatedConfig {
        name: "emu-idle".into(),
        namespaces: vec![NamespaceConfig::with_bytes(1 << 20, LBA)],
        ..EmulatedConfig::default()
    })
    .unwrap();
    let e = Controller::leased(idle.registers(), idle.dma_space(), owner.info().clone(), admin).unwrap_err();
    assert!(e.to_string().contains("RDY"), "{e}");
    // The info a daemon sends survives JSON.
    let json = serde_json::to_string(owner.info()).unwrap();
    assert_eq!(&serde_json::from_str::<ControllerInfo>(&json).unwrap(), owner.info());
}

#[test]
fn register_file_from_fd_maps_the_same_registers_and_refuses_bad_sizes() {
    let (emu, owner) = start_owner("emu-regs");
    let rf = emu.register_file();
    let dup = || rf.memfd().try_clone_to_owned().unwrap();
    let mapped = RegisterFile::from_fd("client", dup(), rf.len()).unwrap();
    assert_eq!(mapped.read64(0).unwrap(), owner.cap().0, "CAP seen through the second mapping");
    rf.set32(0x1000, 0xabcd);
    assert_eq!(mapped.get32(0x1000), 0xabcd);
    for bad in [0, 0x1000, rf.len() - 4, rf.len() + 4096, rf.len() - 4096, 32 << 20] {
        let e = RegisterFile::from_fd("client", dup(), bad).err().expect("bad length refused");
        assert!(e.to_string().contains("client"), "{e}");
    }
    // A file that is not sealed could shrink under the mapping.
    // SAFETY: a NUL-terminated name and plain flags.
    let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a new descriptor nothing else owns.
    let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscall on our descriptor.
    assert_eq!(unsafe { libc::ftruncate(unsealed.as_fd().as_raw_fd(), 8192) }, 0);
    let e = RegisterFile::from_fd("client", unsealed, 8192).err().expect("unsealed refused");
    assert!(e.to_string().contains("sealed"), "{e}");
    // Nor can the owner's file be shrunk by whoever holds it.
    // SAFETY: plain syscall on a descriptor we own.
    assert_ne!(unsafe { libc::ftruncate(dup().as_raw_fd(), 0) }, 0);
}

#[test]
fn remote_regions_are_owned_bounded_and_die_with_their_process() {
    let mmu = EmuIommu::new("remote");
    let me = std::process::id() as i32;
    let mut mem = vec![0u8; 10_000];
    let addr = mem.as_mut_ptr() as u64 + 100;
    let iova = mmu.map_remote(me, addr, 5000, 7).unwrap();
    assert_eq!(iova % 4096, addr % 4096, "page offset kept");
    assert_eq!(mmu.regions_of(7), 1);
    mmu.dma_write(iova + 10, b"remote").unwrap();
    let mut back = [0u8; 6];
    mmu.dma_read(iova + 10, &mut back).unwrap();
    assert_eq!(&back, b"remote");
    let word = iova + 200 - iova % 4;
    mmu.dma_store_u32(word, 0x0102_0304).unwrap();
    let at = (addr + 200 - iova % 4 - mem.as_ptr() as u64) as usize;
    assert_eq!(mem[at..at + 4], 0x0102_0304u32.to_ne_bytes());
    assert!(mmu.dma_store_u32(word + 1, 0).is_err(), "unaligned word store");

    // Past the region's pages (the guard page) faults, and is counted.
    let faults = mmu.fault_count();
    let page_end = (addr + 5000).next_multiple_of(4096);
    assert!(mmu.dma_read(iova + (page_end - addr), &mut back).is_err());
    assert_eq!(mmu.fault_count(), faults + 1);
    // Someone else's IOVA, or not the one map_remote returned, is refused.
    assert!(mmu.unmap(iova, 8).is_err());
    assert!(mmu.unmap(iova + 1, 7).is_err());
    assert!(mmu.map_remote(me, addr, 10, 0).is_err(), "owner 0 is this process's own");
    assert!(mmu.map_remote(me, 0, 10, 7).is_err());
    assert!(mmu.map_remote(me, u64::MAX - 10, 100, 7).is_err());
    mmu.unmap(iova, 7).unwrap();
    assert!(mmu.dma_read(iova + 10, &mut back).is_err(), "unmapped");
    assert_eq!(mem[110..116], *b"remote");

    // A process that is gone: refused when mapping, and faults when it dies after.
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id() as i32;
    gone.wait().unwrap();
    assert!(mmu.map_remote(gone_pid, addr, 10, 7).is_err());
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let iova = mmu.map_remote(sleeper.id() as i32, 0x1000, 4096, 9).unwrap();
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert!(mmu.dma_write(iova, b"x").is_err());
    assert_eq!(mmu.unmap_owner(9), 1);
    assert_eq!(mmu.unmap_owner(9), 0);
}

/// Maps memory of this process for the device as `owner` (a stand-in for a client
/// process: the IOMMU treats the region as another process's, by pid).
struct Via(EmuIommu, u64);

impl DmaBroker for Via {
    fn map(&self, addr: u64, len: usize) -> Result<u64> {
        self.0.map_remote(std::process::id() as i32, addr, len, self.1)
    }
    fn unmap(&self, iova: u64) {
        let _ = self.0.unmap(iova, self.1);
    }
}

#[test]
fn a_clients_commands_reach_only_memory_mapped_for_that_client() {
    let (emu, owner) = start_owner("emu-scope");
    let iommu = emu.iommu().clone();
    let (a, b) = (11u64, 12u64);
    // Client A: queues and buffers all mapped for owner A.
    let dma: Arc<dyn DmaSpace> =
        Arc::new(BrokeredDma::new("client-a", Arc::new(Via(iommu.clone(), a)), 4096).unwrap());
    let leased = Controller::leased(
        emu.registers(),
        dma.clone(),
        owner.info().clone(),
        Arc::new(Direct(owner.clone())),
    )
    .unwrap();
    let mut pair = leased.create_io_queue_pair(8).unwrap();
    let mine = dma.alloc(4096).unwrap();
    mine.copy_in(0, &pattern(3, 4096)).unwrap();
    pair.write_buf(NSID, 8, &mine, 0, 4096, DataMode::Auto).unwrap();
    // Client B's memory, mapped for B: A's commands cannot read it or write into it.
    let theirs = vec![0x77u8; 8192];
    let page = (theirs.as_ptr() as u64).next_multiple_of(4096);
    let iova_b = iommu.map_remote(std::process::id() as i32, page, 4096, b).unwrap();
    let faults = iommu.fault_count();
    let seg = [IovaSegment { iova: iova_b, len: 4096 }];
    let w = pair.write(NSID, 16, &seg, DataMode::Auto).unwrap_err();
    assert!(w.to_string().to_lowercase().contains("data transfer"), "{w}");
    let r = pair.read(NSID, 8, &seg, DataMode::Auto).unwrap_err();
    assert!(r.to_string().to_lowercase().contains("data transfer"), "{r}");
    assert!(iommu.fault_count() >= faults + 2);
    let off = (page - theirs.as_ptr() as u64) as usize;
    assert!(theirs[off..off + 4096].iter().all(|&x| x == 0x77), "B's memory was not written by A's read");
    // The owner's own queues (its own memory) reach clients' regions: it moves
    // data for clients that could lease no queue pair.
    let mut own = owner.create_io_queue_pair(8).unwrap();
    own.read(NSID, 8, &seg, DataMode::Auto).unwrap();
    assert_eq!(&theirs[off..off + 4096], &pattern(3, 4096)[..], "the owner's read landed in B's memory");
    // A's own memory still works both ways.
    let back = dma.alloc(4096).unwrap();
    pair.read_buf(NSID, 8, &back, 0, 4096, DataMode::Auto).unwrap();
    let mut got = vec![0u8; 4096];
    back.copy_out(0, &mut got).unwrap();
    assert_eq!(got, pattern(3, 4096));
    iommu.unmap(iova_b, b).unwrap();
}
