use super::*;

fn shapes() -> Vec<RequestShape> {
    [(512, 0), (4096, 0), (1024, 8192), (8192, 32_768), (2048, 65_536), (16_384, 4096), (256, 120_000)]
        .iter()
        .map(|&(n, p)| RequestShape::new(n, p))
        .collect()
}

fn profiler_from(records: &[TraceRecord], layers: u32) -> Profiler {
    let mut p = Profiler::new(layers).unwrap();
    for r in records {
        p.ingest(*r).unwrap();
    }
    p
}

#[test]
fn fit_of_a_model_trace_reproduces_the_model_table() {
    let model = ComputeModel::llama3_8b_h100();
    let trace = synthetic_trace(&model, &shapes(), 8);
    let p = profiler_from(&trace, model.geometry.layers);
    let grid = TableGrid::standard().unwrap();
    let (fitted, report) =
        p.build(model.identity(), grid.clone(), model.gpu.io_partition(), "trace:test").unwrap();
    let exact = Profiler::from_model(&model, grid).unwrap();
    assert_eq!(report.requests, 7);
    assert_eq!(report.layer_samples, 7 * 32);
    assert!(report.max_rel_error < 1e-3, "{report:?}");
    for shape in [RequestShape::new(3000, 50_000), RequestShape::new(200_000, 0), RequestShape::new(128, 0)] {
        for layer in [0, 31] {
            let (a, b) = (fitted.lookup(shape, layer).unwrap(), exact.lookup(shape, layer).unwrap());
            let rel = (a.window_ns as f64 - b.window_ns as f64).abs() / b.window_ns as f64;
            assert!(rel < 1e-3, "{shape:?} layer {layer}: {a:?} vs {b:?}");
            assert_eq!(a.sm_budget, model.gpu.io_sms);
        }
    }
    let (a, b) = (fitted.decode_lookup(40_000), exact.decode_lookup(40_000));
    assert!((a.window_ns as f64 / b.window_ns as f64 - 1.0).abs() < 1e-3);
}

#[test]
fn noisy_timings_give_a_table_within_the_noise() {
    let model = ComputeModel::llama3_8b_h100();
    let mut trace = synthetic_trace(&model, &shapes(), 8);
    // Deterministic ±4% jitter on every interval.
    for (i, r) in trace.iter_mut().enumerate() {
        let f = 1.0
            + 0.04
                * if i % 3 == 0 {
                    1.0
                } else if i % 3 == 1 {
                    -1.0
                } else {
                    0.0
                };
        if let TraceRecord::Layer { start_ns, end_ns, .. } | TraceRecord::Decode { start_ns, end_ns, .. } = r
        {
            *end_ns = *start_ns + ((*end_ns - *start_ns) as f64 * f) as u64;
        }
    }
    let p = profiler_from(&trace, 32);
    let grid = TableGrid::standard().unwrap();
    let (fitted, report) = p.build(model.identity(), grid.clone(), model.gpu.io_partition(), "t").unwrap();
    assert!(report.max_rel_error > 0.01 && report.max_rel_error < 0.1, "{}", report.max_rel_error);
    let exact = Profiler::from_model(&model, grid).unwrap();
    let shape = RequestShape::new(4000, 20_000);
    let (a, b) = (fitted.lookup(shape, 5).unwrap(), exact.lookup(shape, 5).unwrap());
    assert!((a.window_ns as f64 / b.window_ns as f64 - 1.0).abs() < 0.05, "{a:?} {b:?}");
}

#[test]
fn jsonl_trace_errors_name_the_line() {
    let text = "# a comment\n\
        {\"kind\":\"request\",\"request\":1,\"input_tokens\":100,\"prefix_tokens\":0}\n\
        \n\
        {\"kind\":\"layer\",\"request\":1,\"layer\":0,\"start_ns\":10,\"end_ns\":5}\n";
    let e = Profiler::new(2).unwrap().ingest_jsonl(text.as_bytes()).unwrap_err().to_string();
    assert!(e.starts_with("trace line 4:") && e.contains("before it starts"), "{e}");
    let garbage = "{\"kind\":\"layer\",\"request\":1}\n";
    let e = Profiler::new(2).unwrap().ingest_jsonl(garbage.as_bytes()).unwrap_err().to_string();
    assert!(e.starts_with("trace line 1:") && e.contains("missing field"), "{e}");
    let ok = "{\"kind\":\"request\",\"request\":1,\"input_tokens\":100,\"prefix_tokens\":0}\n\
        {\"kind\":\"layer\",\"request\":1,\"layer\":1,\"start_ns\":10,\"end_ns\":50}\n";
    assert_eq!(Profiler::new(2).unwrap().ingest_jsonl(ok.as_bytes()).unwrap(), 2);
}

#[test]
fn inconsistent_records_are_rejected() {
    let mut p = Profiler::new(2).unwrap();
    assert!(p.record_layer(9, 0, 0, 1).unwrap_err().to_string().contains("never began"));
    p.begin_request(1, RequestShape::new(10, 0)).unwrap();
    assert!(p.begin_request(1, RequestShape::new(10, 0)).unwrap_err().to_string().contains("twice"));
    assert!(p.begin_request(2, RequestShape::new(0, 5)).is_err());
    assert!(p.record_layer(1, 2, 0, 1).unwrap_err().to_string().contains("layer 2 but the model has 2"));
    p.record_layer(1, 0, 0, 1).unwrap();
    assert!(p.record_layer(1, 0, 0, 1).unwrap_err().to_string().contains("recorded twice"));
    assert!(p.record_decode_step(1, 10, 5, 1).is_err());
}

#[test]
fn build_reports_missing_layers_decode_and_identity_mismatch() {
    let model = ComputeModel::llama3_8b_h100();
    let io = model.gpu.io_partition();
    let grid = TableGrid::standard().unwrap();
    let mut p = Profiler::new(32).unwrap();
    p.begin_request(1, RequestShape::new(100, 0)).unwrap();
    p.record_layer(1, 0, 0, 1000).unwrap();
    let e = p.build(model.identity(), grid.clone(), io, "t").unwrap_err().to_string();
    assert!(e.contains("no timing recorded for layer 1"), "{e}");

    let no_decode: Vec<TraceRecord> = synthetic_trace(&model, &shapes(), 0);
    let e = profiler_from(&no_decode, 32).build(model.identity(), grid.clone(), io, "t").unwrap_err();
    assert!(e.to_string().contains("no decode steps"), "{e}");

    let full = profiler_from(&synthetic_trace(&model, &shapes(), 2), 32);
    let wrong = Identity { layers: 80, ..model.identity() };
    assert!(full.build(wrong, grid, io, "t").unwrap_err().to_string().contains("80 layers"));
}
