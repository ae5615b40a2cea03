use super::*;

fn ident() -> Identity {
    Identity { model: "m".into(), gpu: "g".into(), layers: 2 }
}

fn small_table() -> SlackTable {
    let grid = TableGrid {
        input: Axis::new(vec![100, 200]).unwrap(),
        prefix: Axis::new(vec![0, 1000]).unwrap(),
        decode_context: Axis::new(vec![0, 1000]).unwrap(),
    };
    SlackTable::from_fn(
        ident(),
        "test",
        grid,
        |n, p, l| SlackEntry {
            window_ns: u64::from(n) * 10 + u64::from(p) + u64::from(l),
            sm_budget: 4 + l,
            max_iocbs: n + p,
        },
        |c| SlackEntry { window_ns: 1000 + u64::from(c), sm_budget: 2, max_iocbs: c },
    )
    .unwrap()
}

#[test]
fn lookup_hits_buckets_exactly_and_interpolates_between() {
    let t = small_table();
    let at = t.lookup(RequestShape::new(200, 1000), 1).unwrap();
    assert_eq!(at, SlackEntry { window_ns: 3001, sm_budget: 5, max_iocbs: 1200 });
    let mid = t.lookup(RequestShape::new(150, 500), 0).unwrap();
    // The stored function is bilinear, so interpolation reproduces it.
    assert_eq!(mid.window_ns, 1500 + 500);
    assert_eq!(mid.max_iocbs, 650);
    assert_eq!(mid.sm_budget, 4);
    // Outside the grid: clamped to the edge.
    let big = t.lookup(RequestShape::new(10_000, 5000), 0).unwrap();
    assert_eq!(big.window_ns, 3000);
    assert_eq!(t.decode_lookup(500), SlackEntry { window_ns: 1500, sm_budget: 2, max_iocbs: 500 });
}

#[test]
fn lookup_rejects_a_layer_the_model_does_not_have() {
    let e = small_table().lookup(RequestShape::new(100, 0), 2).unwrap_err();
    assert!(matches!(e, SchedError::LayerOutOfRange { layer: 2, layers: 2 }), "{e}");
}

#[test]
fn save_and_load_round_trip() {
    let dir = std::env::temp_dir().join(format!("tutti-sched-table-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.json");
    let t = small_table();
    t.save(&path).unwrap();
    let back = SlackTable::load(&path, &ident()).unwrap();
    assert_eq!(back, t);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn loading_for_another_model_or_gpu_names_the_mismatch() {
    let json = small_table().to_json().unwrap();
    let dir = std::env::temp_dir().join(format!("tutti-sched-ident-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.json");
    std::fs::write(&path, json).unwrap();
    let other = Identity { model: "llama-3-70b".into(), gpu: "g".into(), layers: 80 };
    let e = SlackTable::load(&path, &other).unwrap_err().to_string();
    assert!(e.contains("model 'm' (expected 'llama-3-70b')"), "{e}");
    assert!(e.contains("2 layers (expected 80)"), "{e}");
    assert!(!e.contains("gpu"), "{e}");
    let other_gpu = Identity { gpu: "a100".into(), ..ident() };
    let e = SlackTable::load(&path, &other_gpu).unwrap_err().to_string();
    assert!(e.contains("gpu 'g' (expected 'a100')"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wrong_version_is_reported_as_a_version_error() {
    let json = small_table().to_json().unwrap().replace("\"version\":1", "\"version\":7");
    let e = SlackTable::from_json(&json, "x.json").unwrap_err();
    assert!(matches!(e, SchedError::Version { found: 7, expected: 1, .. }), "{e}");
}

#[test]
fn a_flipped_digit_fails_the_checksum() {
    let json = small_table().to_json().unwrap();
    let flipped = json.replacen("\"window_ns\":[1000,", "\"window_ns\":[1900,", 1);
    assert_ne!(flipped, json, "test must actually change a number");
    let e = SlackTable::from_json(&flipped, "x.json").unwrap_err();
    assert!(matches!(e, SchedError::Checksum { .. }), "{e}");
}

#[test]
fn truncated_or_foreign_files_are_corrupt_not_a_panic() {
    let json = small_table().to_json().unwrap();
    for bad in [&json[..json.len() / 2], "{}", "[1,2]", "{\"format\":\"other\",\"version\":1}"] {
        let e = SlackTable::from_json(bad, "x.json").unwrap_err();
        assert!(matches!(e, SchedError::Corrupt { .. }), "{bad}: {e}");
    }
    let missing = SlackTable::load_unchecked(Path::new("/nonexistent/tutti/table.json")).unwrap_err();
    assert!(missing.to_string().contains("/nonexistent/tutti/table.json"), "{missing}");
}

#[test]
fn a_body_with_inconsistent_columns_is_corrupt_even_with_a_matching_checksum() {
    let mut body = small_table().body();
    body.prefill.window_ns.pop();
    let bytes = serde_json::to_vec(&body).unwrap();
    let header = FileHeader {
        format: FORMAT_NAME.into(),
        version: 1,
        checksum: crc32fast::hash(&bytes),
        table: serde_json::to_value(&body).unwrap(),
    };
    let json = serde_json::to_string(&header).unwrap();
    let e = SlackTable::from_json(&json, "x.json").unwrap_err().to_string();
    assert!(e.contains("prefill has columns of lengths"), "{e}");
}

#[test]
fn window_scale_scales_windows_and_caps() {
    let t = small_table().with_window_scale(1.5).unwrap();
    let e = t.entry(0, 0, 0).unwrap();
    assert_eq!(e.window_ns, 1500);
    assert_eq!(e.max_iocbs, 150);
    assert!(small_table().with_window_scale(0.0).is_err());
}
