//! Who is on the other end of a connection, and whether they may talk to tuttid.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use crate::error::{DaemonError, Result};

/// The credentials the kernel recorded for a peer when it connected (SO_PEERCRED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

impl PeerCred {
    /// The credentials of the process at the other end of `stream`. For a client socket
    /// this is the process that called `listen` on the server side.
    pub fn of(stream: &UnixStream) -> Result<PeerCred> {
        // Not rustix's `socket_peercred`: its pid is non-zero by type, and the kernel reports
        // pid 0 for a peer outside this process's pid namespace.
        let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` and `len` are live locals of the sizes passed; the kernel writes at
        // most `len` bytes into `cred` and the fd is borrowed from `stream` for the call.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(DaemonError::io("reading the peer's credentials (SO_PEERCRED)", e));
        }
        Ok(PeerCred { pid: cred.pid, uid: cred.uid, gid: cred.gid })
    }
}

/// Which peers the daemon serves. Root and the daemon's own uid are always allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccessPolicy {
    /// Only the daemon's own uid (and root).
    #[default]
    OwnerOnly,
    /// Also any process whose primary or supplementary groups include this gid.
    OwnerAndGroup(u32),
}

impl AccessPolicy {
    /// Checks `peer` against the policy for a daemon running as `own_uid`.
    /// The error is the message the peer is sent.
    pub fn check(&self, peer: &PeerCred, own_uid: u32) -> Result<(), String> {
        if peer.uid == 0 || peer.uid == own_uid {
            return Ok(());
        }
        if let AccessPolicy::OwnerAndGroup(gid) = *self {
            if peer.gid == gid || supplementary_groups(peer.pid).contains(&gid) {
                return Ok(());
            }
            return Err(format!(
                "uid {} (pid {}) is neither tuttid's owner (uid {own_uid}) nor in its group (gid {gid})",
                peer.uid, peer.pid
            ));
        }
        Err(format!(
            "uid {} (pid {}) is not tuttid's owner (uid {own_uid}); only the owner may connect",
            peer.uid, peer.pid
        ))
    }
}

/// The supplementary groups of process `pid`, from /proc; empty when it cannot be read
/// (the process is gone, or /proc is not mounted), which refuses rather than allows.
fn supplementary_groups(pid: i32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    parse_groups(&status)
}

fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|rest| rest.split_whitespace().filter_map(|g| g.parse().ok()).collect())
        .unwrap_or_default()
}

/// The uid tuttid runs as (effective: the one that owns the files it creates).
pub fn own_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: u32 = 1000;

    fn peer(uid: u32, gid: u32) -> PeerCred {
        // A pid that is not running: /proc has no groups for it.
        PeerCred { pid: i32::MAX, uid, gid }
    }

    #[test]
    fn owner_only_allows_the_owner_and_root() {
        let p = AccessPolicy::OwnerOnly;
        assert!(p.check(&peer(OWNER, 5), OWNER).is_ok());
        assert!(p.check(&peer(0, 0), OWNER).is_ok());
        let why = p.check(&peer(1001, 1000), OWNER).unwrap_err();
        assert!(why.contains("uid 1001") && why.contains("uid 1000"), "{why}");
    }

    #[test]
    fn group_policy_allows_members_only() {
        let p = AccessPolicy::OwnerAndGroup(700);
        assert!(p.check(&peer(1001, 700), OWNER).is_ok());
        assert!(p.check(&peer(OWNER, 1), OWNER).is_ok());
        let why = p.check(&peer(1001, 701), OWNER).unwrap_err();
        assert!(why.contains("gid 700"), "{why}");
    }

    #[test]
    fn supplementary_groups_come_from_proc_status() {
        assert_eq!(parse_groups("Name:\tx\nGroups:\t4 24 700 \nNgid:\t0\n"), vec![4, 24, 700]);
        assert!(parse_groups("Name:\tx\nGroups:\t\n").is_empty());
        assert!(parse_groups("").is_empty());
    }

    #[test]
    fn peer_of_a_socket_pair_is_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = PeerCred::of(&a).unwrap();
        assert_eq!(cred.pid as u32, std::process::id());
        assert_eq!(cred.uid, own_uid());
    }
}
