//! Tests of `config`: the emulated drives' cost fields.

use super::*;
use crate::io_config::TUTTI_EXECUTOR_GIO_HOST;

const MB: u64 = 1_000_000;

fn emulated() -> tutti_runtime_config_t {
    tutti_runtime_config_t {
        struct_size: std::mem::size_of::<tutti_runtime_config_t>() as u32,
        drives: TUTTI_DRIVES_EMULATED,
        emulated_count: 2,
        emulated_capacity_bytes: 8 << 20,
        executor: TUTTI_EXECUTOR_GIO_HOST,
        open_mode: TUTTI_OPEN_CREATE,
        geometry: tutti_geometry_t {
            layers: 2,
            kv_heads: 2,
            head_dim: 16,
            tokens_per_block: 4,
            dtype: TUTTI_DTYPE_F16,
        },
        ..Default::default()
    }
}

fn refused(c: &tutti_runtime_config_t) -> String {
    // SAFETY: every pointer in `c` is NULL.
    match unsafe { RuntimeConfig::from_c(c) } {
        Ok(_) => panic!("accepted {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_bandwidth_fields_reach_the_emulated_controllers() {
    let c = tutti_runtime_config_t {
        emulated_read_bytes_per_sec: 6000 * MB,
        emulated_write_bytes_per_sec: 2000 * MB,
        emulated_latency_us: 10,
        emulated_read_latency_us: 80,
        emulated_write_latency_us: 20,
        emulated_mixed_efficiency: 0.4,
        emulated_mixed_read_share: 0.75,
        ..emulated()
    };
    // SAFETY: every pointer in `c` is NULL.
    let cfg = unsafe { RuntimeConfig::from_c(&c) }.expect("valid");
    let (rig, _specs) = cfg.start_drives().expect("drives");
    assert_eq!(rig.emulated.len(), 2);
    for emu in &rig.emulated {
        let cost = &emu.config().cost;
        assert_eq!((cost.read_bytes_per_sec, cost.write_bytes_per_sec), (Some(6000 * MB), Some(2000 * MB)));
        assert_eq!(cost.per_command, Duration::from_micros(10));
        assert_eq!(cost.read_latency, Duration::from_micros(80));
        assert_eq!(cost.write_latency, Duration::from_micros(20));
        assert_eq!(cost.mixed, Some(MixedModel { efficiency: 0.4, read_share: 0.75 }));
    }
    // The share defaults to an even split.
    let c = tutti_runtime_config_t {
        emulated_read_bytes_per_sec: MB,
        emulated_mixed_efficiency: 0.5,
        ..emulated()
    };
    let cost = emulated_cost(&c).expect("valid");
    assert_eq!(cost.mixed, Some(MixedModel { efficiency: 0.5, read_share: 0.5 }));
    assert_eq!(cost.write_bytes_per_sec, None);
}

#[test]
fn all_zero_is_no_cost_and_an_abi_1_4_struct_is_read_without_the_new_fields() {
    let cost = emulated_cost(&emulated()).expect("valid");
    assert!(cost.read_bytes_per_sec.is_none() && cost.write_bytes_per_sec.is_none() && cost.mixed.is_none());
    assert!(cost.per_command.is_zero() && cost.read_latency.is_zero() && cost.write_latency.is_zero());
    // A 1.4 caller's struct ends before the 1.5 fields: whatever follows it is not read.
    let mut c = tutti_runtime_config_t {
        emulated_read_bytes_per_sec: 1,
        emulated_latency_us: u32::MAX,
        emulated_mixed_efficiency: f64::NAN,
        ..emulated()
    };
    c.struct_size = 112;
    // SAFETY: `c` is a whole 1.5 struct, so 112 bytes are readable.
    let got = unsafe { ptr::sized_in_prefix(&c) }.expect("1.4 size accepted");
    assert_eq!(got.emulated_read_bytes_per_sec, 0);
    assert_eq!(got.emulated_latency_us, 0);
    assert_eq!(got.emulated_mixed_efficiency, 0.0);
    emulated_cost(&got).expect("no cost");
}

#[test]
fn bad_bandwidth_fields_are_refused_by_name() {
    let cases: [(tutti_runtime_config_t, &str); 8] = [
        (tutti_runtime_config_t { emulated_latency_us: 10_000_001, ..emulated() }, "emulated_latency_us"),
        (
            tutti_runtime_config_t { emulated_read_latency_us: u32::MAX, ..emulated() },
            "emulated_read_latency_us",
        ),
        (
            tutti_runtime_config_t { emulated_mixed_efficiency: 0.4, ..emulated() },
            "needs emulated_read_bytes_per_sec",
        ),
        (
            tutti_runtime_config_t {
                emulated_read_bytes_per_sec: MB,
                emulated_mixed_efficiency: 1.5,
                ..emulated()
            },
            "emulated_mixed_efficiency",
        ),
        (
            tutti_runtime_config_t {
                emulated_read_bytes_per_sec: MB,
                emulated_mixed_efficiency: f64::NAN,
                ..emulated()
            },
            "emulated_mixed_efficiency",
        ),
        (
            tutti_runtime_config_t {
                emulated_read_bytes_per_sec: MB,
                emulated_mixed_efficiency: 0.4,
                emulated_mixed_read_share: 1.0,
                ..emulated()
            },
            "emulated_mixed_read_share",
        ),
        (
            tutti_runtime_config_t { emulated_mixed_read_share: 0.5, ..emulated() },
            "emulated_mixed_read_share",
        ),
        (
            tutti_runtime_config_t {
                drives: TUTTI_DRIVES_VFIO,
                vfio_count: 1,
                emulated_write_bytes_per_sec: MB,
                ..emulated()
            },
            "emulated_write_bytes_per_sec",
        ),
    ];
    for (c, what) in cases {
        let e = refused(&c);
        assert!(e.contains(what), "{what}: {e}");
    }
}
