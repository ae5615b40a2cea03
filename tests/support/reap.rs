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
