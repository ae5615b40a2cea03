//! One owner per media file, at the controller level: a second controller on a
//! file a live controller holds is refused naming the holder, and dropping the
//! first releases the file before `drop` returns.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tutti_driver::DriverError;
use tutti_emulator::{EmulatedConfig, EmulatedController, MediaConfig, NamespaceConfig};

#[test]
fn second_controller_on_a_media_file_is_refused_until_the_first_is_dropped() {
    let path = std::env::temp_dir().join(format!("tutti-driver-owner-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let cfg = EmulatedConfig {
        media: MediaConfig::File(path.clone()),
        namespaces: vec![NamespaceConfig::with_bytes(1 << 20, 4096)],
        ..EmulatedConfig::default()
    };
    let first = EmulatedController::start(cfg.clone()).unwrap();
    let err = match EmulatedController::start(EmulatedConfig { name: "second".into(), ..cfg.clone() }) {
        Err(e) => e,
        Ok(_) => panic!("a second controller on {} was started", path.display()),
    };
    let msg = err.to_string();
    assert!(matches!(err, DriverError::InUse(_)), "{err:?}");
    assert!(
        msg.contains("second:")
            && msg.contains(path.to_str().unwrap())
            && msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    drop(first);
    // Released by the time drop returned: no retry loop needed.
    let again = EmulatedController::start(cfg).unwrap();
    drop(again);
    let _ = std::fs::remove_file(&path);
}
