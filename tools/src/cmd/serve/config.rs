//! `tutti serve --config FILE`: the daemon's flags as a TOML file.
//!
//! Every key stands for one flag of `tutti serve` ([`KEYS`]) and is checked by that flag's own
//! parser, so a file and a command line accept exactly the same values. A flag given on the
//! command line (or through its environment variable) wins over the file; a key the table does
//! not know is an error naming it, and so is a value the flag refuses.
//!
//! ```toml
//! socket = "/run/tutti/tuttid.sock"
//! group = "tutti"
//! metrics = "127.0.0.1:9464"
//! log = "info"
//!
//! [drives]
//! vfio = ["0000:01:00.0", "0000:02:00.0"]   # or: emulated = 4 (and an [emulated] table)
//!
//! [pool]
//! open = "open-or-create"
//! layers = 32
//! kv_heads = 8
//! head_dim = 128
//! block_tokens = 16
//! dtype = "bf16"
//!
//! [limits]
//! io_timeout_ms = 2000
//! ```

use std::ffi::OsString;
use std::path::Path;

/// How a key's value becomes command-line words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `--flag VALUE`.
    Value,
    /// A boolean: `--flag` when true, nothing when false.
    Switch,
    /// An array: `--flag A,B,C`.
    List,
}

/// One key of the file: its dotted name, the long flag it stands for, how it is written.
pub(crate) struct Key {
    pub key: &'static str,
    pub flag: &'static str,
    kind: Kind,
}

const fn k(key: &'static str, flag: &'static str, kind: Kind) -> Key {
    Key { key, flag, kind }
}

/// Every key of the file. A test (in `main.rs`, which has the whole command line) checks
/// that every flag of `tutti serve` has one, but [`NOT_IN_FILE`].
pub(crate) const KEYS: &[Key] = &[
    k("socket", "socket", Kind::Value),
    k("group", "group", Kind::Value),
    k("metrics", "metrics", Kind::Value),
    k("log", "log", Kind::Value),
    k("drives.vfio", "drives", Kind::List),
    k("drives.noiommu", "noiommu", Kind::Switch),
    k("drives.emulated", "emulated", Kind::Value),
    k("pool.open", "open", Kind::Value),
    k("pool.layers", "layers", Kind::Value),
    k("pool.kv_heads", "kv-heads", Kind::Value),
    k("pool.head_dim", "head-dim", Kind::Value),
    k("pool.block_tokens", "block-tokens", Kind::Value),
    k("pool.dtype", "dtype", Kind::Value),
    k("limits.io_timeout_ms", "io-timeout-ms", Kind::Value),
    k("limits.idle_exit_s", "idle-exit-s", Kind::Value),
    k("emulated.lba_size", "lba-size", Kind::Value),
    k("emulated.capacity_mib", "capacity-mib", Kind::Value),
    k("emulated.mdts", "mdts", Kind::Value),
    k("emulated.sgl", "sgl", Kind::Value),
    k("emulated.dir", "dir", Kind::Value),
    k("emulated.prefault", "emu-prefault", Kind::Switch),
    k("emulated.namespaces", "emu-namespaces", Kind::Value),
    k("emulated.queue_pairs", "emu-queue-pairs", Kind::Value),
    k("emulated.metadata", "emu-metadata", Kind::Value),
    k("emulated.zoned", "emu-zoned", Kind::Switch),
    k("emulated.read_gbps", "emu-read-gbps", Kind::Value),
    k("emulated.write_gbps", "emu-write-gbps", Kind::Value),
    k("emulated.latency_us", "emu-latency-us", Kind::Value),
    k("emulated.read_latency_us", "emu-read-latency-us", Kind::Value),
    k("emulated.write_latency_us", "emu-write-latency-us", Kind::Value),
    k("emulated.mixed_efficiency", "emu-mixed-efficiency", Kind::Value),
    k("emulated.mixed_read_share", "emu-mixed-read-share", Kind::Value),
];

/// The flags of `tutti serve` that have no key: what the file is, and how the start is printed.
#[cfg(test)]
pub(crate) const NOT_IN_FILE: &[&str] = &["config", "check-config", "json", "help", "version"];

/// What the command line said, so that the file does not override it.
pub trait Given {
    /// Whether `--flag` was given on the command line or through its environment variable.
    fn given(&self, flag: &str) -> bool;
}

/// The extra command-line words the file at `path` stands for: one flag per key, leaving out
/// the flags `given` says were given. Every value is checked by its flag's parser (`check`
/// parses `tutti serve --flag VALUE` alone) before anything is returned.
pub fn flags_from_file(
    path: &Path,
    given: &dyn Given,
    check: &dyn Fn(&[OsString]) -> Result<(), String>,
) -> anyhow::Result<Vec<OsString>> {
    let at = path.display();
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("--config {at}: cannot read it: {e}"))?;
    let table: toml::Table =
        text.parse().map_err(|e: toml::de::Error| anyhow::anyhow!("--config {at}: not valid TOML: {e}"))?;
    let mut leaves = Vec::new();
    flatten("", &table, &mut leaves).map_err(|e| anyhow::anyhow!("--config {at}: {e}"))?;
    let mut out = Vec::new();
    for (key, value) in leaves {
        let Some(spec) = KEYS.iter().find(|k| k.key == key) else {
            return Err(anyhow::anyhow!("--config {at}: unknown key `{key}`; {}", known_near(&key)));
        };
        let words = words(spec, &value).map_err(|e| anyhow::anyhow!("--config {at}: key `{key}`: {e}"))?;
        check(&words).map_err(|e| anyhow::anyhow!("--config {at}: key `{key}` = {value}: {e}"))?;
        if given.given(spec.flag) {
            tracing::info!(
                key,
                flag = spec.flag,
                "the command line's --{} wins over the config file",
                spec.flag
            );
            continue;
        }
        out.extend(words);
    }
    Ok(out)
}

/// The dotted name and value of every leaf of `table`.
fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<(String, toml::Value)>) -> Result<(), String> {
    for (name, value) in table {
        let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        match value {
            toml::Value::Table(t) => {
                if !KEYS.iter().any(|k| k.key.starts_with(&format!("{key}."))) {
                    return Err(format!("unknown table [{key}]; {}", tables()));
                }
                flatten(&key, t, out)?;
            }
            v => out.push((key, v.clone())),
        }
    }
    Ok(())
}

/// The keys that share `key`'s table, to help whoever mistyped it.
fn known_near(key: &str) -> String {
    let table = key.rsplit_once('.').map_or("", |(t, _)| t);
    let same: Vec<&str> = KEYS
        .iter()
        .filter(|k| k.key.rsplit_once('.').map_or("", |(t, _)| t) == table)
        .map(|k| k.key)
        .collect();
    if same.is_empty() {
        tables()
    } else {
        format!("the keys there are {}", same.join(", "))
    }
}

fn tables() -> String {
    let tables: std::collections::BTreeSet<&str> =
        KEYS.iter().filter_map(|k| k.key.split_once('.').map(|(t, _)| t)).collect();
    format!("the tables are [{}]", tables.into_iter().collect::<Vec<_>>().join("], ["))
}

/// The command-line words of one key's value.
fn words(spec: &Key, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let flag = OsString::from(format!("--{}", spec.flag));
    let scalar = |v: &toml::Value| -> Result<String, String> {
        match v {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(i) => Ok(i.to_string()),
            toml::Value::Float(f) => Ok(f.to_string()),
            other => Err(format!("expected a string or a number, not {}", other.type_str())),
        }
    };
    match spec.kind {
        Kind::Switch => match value {
            toml::Value::Boolean(true) => Ok(vec![flag]),
            toml::Value::Boolean(false) => Ok(Vec::new()),
            other => Err(format!("expected true or false, not {}", other.type_str())),
        },
        Kind::Value => Ok(vec![flag, scalar(value)?.into()]),
        Kind::List => {
            let toml::Value::Array(items) = value else {
                return Err(format!("expected an array, not {}", value.type_str()));
            };
            let items = items.iter().map(scalar).collect::<Result<Vec<_>, _>>()?;
            if items.iter().any(|i| i.contains(',')) {
                return Err("an item holds a comma; give each one as its own array element".into());
            }
            if items.is_empty() {
                return Ok(Vec::new());
            }
            Ok(vec![flag, items.join(",").into()])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct None_;
    impl Given for None_ {
        fn given(&self, _: &str) -> bool {
            false
        }
    }
    struct Socket;
    impl Given for Socket {
        fn given(&self, flag: &str) -> bool {
            flag == "socket"
        }
    }

    fn file(text: &str) -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "tutti-config-unit-{}-{}.toml",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&p, text).unwrap();
        p
    }

    fn ok(_: &[OsString]) -> Result<(), String> {
        Ok(())
    }

    fn strings(v: Vec<OsString>) -> Vec<String> {
        v.into_iter().map(|s| s.into_string().unwrap()).collect()
    }

    #[test]
    fn keys_become_flags_and_given_flags_are_left_out() {
        let p = file(
            "socket = \"/tmp/x.sock\"\n[drives]\nvfio = [\"0000:01:00.0\", \"0000:02:00.0/1\"]\nnoiommu = true\n\
             [pool]\nkv_heads = 4\n[emulated]\nzoned = false\nread_gbps = 1.5\n",
        );
        let all = strings(flags_from_file(&p, &None_, &ok).unwrap());
        // Tables and keys come in name order.
        assert_eq!(
            all,
            [
                "--noiommu",
                "--drives",
                "0000:01:00.0,0000:02:00.0/1",
                "--emu-read-gbps",
                "1.5",
                "--kv-heads",
                "4",
                "--socket",
                "/tmp/x.sock",
            ]
        );
        let some = strings(flags_from_file(&p, &Socket, &ok).unwrap());
        assert!(!some.contains(&"--socket".to_string()), "{some:?}");
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn unknown_keys_tables_and_wrong_types_are_named() {
        let err = |t: &str| flags_from_file(&file(t), &None_, &ok).unwrap_err().to_string();
        let e = err("[pool]\nkv_head = 4\n");
        assert!(e.contains("unknown key `pool.kv_head`") && e.contains("pool.kv_heads"), "{e}");
        let e = err("[geometry]\nlayers = 4\n");
        assert!(e.contains("unknown table [geometry]") && e.contains("[pool]"), "{e}");
        let e = err("sockets = \"x\"\n");
        assert!(e.contains("unknown key `sockets`"), "{e}");
        let e = err("[drives]\nnoiommu = \"yes\"\n");
        assert!(e.contains("key `drives.noiommu`") && e.contains("expected true or false"), "{e}");
        let e = err("[drives]\nvfio = \"0000:01:00.0\"\n");
        assert!(e.contains("key `drives.vfio`") && e.contains("expected an array"), "{e}");
        let e = err("[pool\nlayers = 4\n");
        assert!(e.contains("not valid TOML"), "{e}");
        let refuse = |w: &[OsString]| Err(format!("refused {w:?}"));
        let e = flags_from_file(&file("[pool]\nlayers = 0\n"), &None_, &refuse).unwrap_err().to_string();
        assert!(e.contains("key `pool.layers` = 0: refused"), "{e}");
    }
}
