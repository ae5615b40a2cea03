//! `tutti identify --emulated`: the LBA format in use and the command set of
//! each namespace, in text and JSON.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn identify(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .arg("identify")
        .arg("--emulated")
        .args(args)
        .output()
        .expect("run tutti");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_lba_format_and_command_set_are_shown() {
    let (ok, text) = identify(&["--emu-namespaces", "2"]);
    assert!(ok);
    assert!(text.contains("NVM command set; LBA format 0: 512 B data, no metadata"), "{text}");
    assert!(!text.contains("not usable"), "{text}");

    let (ok, text) = identify(&["--emu-metadata", "8", "--lba-size", "4096"]);
    assert!(ok);
    assert!(text.contains("4096 B data + 8 B metadata (separate buffer)"), "{text}");
    assert!(text.contains("not usable by tutti"), "{text}");

    let (ok, json) = identify(&["--emu-zoned", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let ns = &v["namespaces"][0];
    assert_eq!(ns["command_set"], "zoned", "{ns}");
    assert_eq!(ns["format"]["data_size"], 512);
    assert_eq!(ns["format"]["metadata_size"], 0);
    assert_eq!(ns["format"]["extended"], false);
    assert_eq!(ns["format"]["pi_type"], 0);

    let (ok, json) = identify(&["--emu-metadata", "16", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(v["namespaces"][0]["format"]["metadata_size"], 16);
    assert_eq!(v["namespaces"][0]["command_set"], "nvm");
}
