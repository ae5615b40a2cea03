//! A child process a test starts (a daemon, a client) that is killed when
//! the test ends with it still running, passed or failed, so that no child
//! outlives its test holding the test's output pipe open. Test crates include
//! this file by path:
//!
//! ```ignore
//! #[path = "../../tests/support/reap.rs"]
//! mod reap;
//! let mut daemon = reap::Reap(Command::new(..).spawn().unwrap());
//! ```

pub struct Reap(pub std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl std::ops::Deref for Reap {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reap {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

/// Starts `cmd` with its stdout piped (stderr inherited) and returns the child, killed on drop,
/// and its stdout lines, read on a thread and sent through the channel as they come, so that a
/// test can wait for one with a deadline (`recv_timeout`).
#[allow(dead_code)] // not every test crate that includes this file reads a child's lines
pub fn spawn_lines(cmd: &mut std::process::Command) -> (Reap, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut child = Reap(
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::inherit()).spawn().unwrap(),
    );
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Starts `cmd` (stdout piped, stderr inherited) and waits, up to 60 s, for the first line it
/// prints on stdout; the rest of its stdout is not read.
#[allow(dead_code)] // not every test crate that includes this file reads a child's lines
pub fn spawn_first_line(cmd: &mut std::process::Command) -> (Reap, String) {
    let (mut child, lines) = spawn_lines(cmd);
    match lines.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(line) => (child, line),
        Err(e) => {
            panic!("{:?} printed no line within 60 s ({e}); exit: {:?}", cmd.get_program(), child.try_wait())
        }
    }
}
