//! `tutti serve --metrics`: the exposition after real clients stored and loaded (every number
//! checked against what they did, `promtool check metrics` clean), and a real Prometheus server
//! (Debian's `prometheus`) on loopback scraping it and answering a query through its HTTP API.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod serving;

#[path = "../../tests/support/skip.rs"]
mod skip;

use serving::{http_get, sample, tutti, Engine, Serve, TempDir, CHUNKS};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

fn serve(dir: &TempDir) -> Serve {
    let mut c = tutti();
    c.args(["serve", "--json", "--metrics", "127.0.0.1:0", "--emulated", "2", "--capacity-mib", "16"])
        .args(["--layers", "4", "--kv-heads", "2", "--head-dim", "64", "--dir"])
        .arg(&dir.0)
        .arg("--socket")
        .arg(dir.join("s.sock"));
    Serve::start(c)
}

/// `promtool check metrics` on `text`: its verdict and what it said.
fn promtool(text: &str) -> (bool, String) {
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    (
        out.status.success(),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn the_exposition_counts_what_the_clients_did_and_promtool_finds_nothing_wrong() {
    let dir = TempDir::new("metrics");
    let serve = serve(&dir);
    let url = serve.hello["metrics"].as_str().unwrap().to_string();
    let addr = url.trim_start_matches("http://").trim_end_matches("/metrics").to_string();
    let pool = serve.hello["pool"].as_str().unwrap().to_string();
    let s = |name: &str, labels: &str| format!("{name}{{pool=\"{pool}\"{labels}}}");

    // Two engines: three rounds of storing 4 blocks and loading them back, then one lookup
    // that misses; one engine leaves before the scrape, the other stays.
    const ROUNDS: u64 = 3;
    let stay = Engine::connect(&serve.socket(), "stays").unwrap();
    {
        let leave = Engine::connect(&serve.socket(), "leaves").unwrap();
        for (i, e) in [&stay, &leave].into_iter().enumerate() {
            for r in 0..ROUNDS {
                let seed = i as u64 * 1000 + r * CHUNKS as u64;
                assert_eq!(e.store(seed).unwrap(), CHUNKS);
                assert_eq!(e.load(seed).unwrap(), (CHUNKS as usize, true));
            }
        }
        assert_eq!(leave.load(40_000).unwrap(), (0, true));
    }
    let block_bytes = 2 * 4 * 4096u64; // 2 × layers × object bytes
    let moved = 2 * ROUNDS * CHUNKS as u64 * block_bytes;
    // The departed engine's report stays counted; wait (bounded) until the daemon released it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let (code, text) = http_get(&addr, "/metrics").unwrap();
        assert_eq!(code, 200);
        if sample(&text, &s("tutti_clients", "")) == Some(1.0) {
            break text;
        }
        assert!(Instant::now() < deadline, "the leaving engine is still listed:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let v = |name: &str, labels: &str| {
        sample(&text, &s(name, labels)).unwrap_or_else(|| panic!("no {name}{labels}:\n{text}"))
    };
    // What the daemon saw.
    assert_eq!(v("tutti_lookups_total", ""), (2 * ROUNDS + 1) as f64);
    assert_eq!(v("tutti_lookup_hit_blocks_total", ""), (2 * ROUNDS * CHUNKS as u64) as f64);
    assert_eq!(v("tutti_lookup_miss_blocks_total", ""), CHUNKS as f64);
    assert_eq!(v("tutti_files_committed_total", ""), (2 * ROUNDS * CHUNKS as u64) as f64);
    assert_eq!(v("tutti_requests_total", ",request=\"settle\""), (2 * ROUNDS) as f64);
    assert_eq!(v("tutti_load_references_total", ""), (2 * ROUNDS * CHUNKS as u64) as f64);
    assert_eq!(v("tutti_clients_connected_total", ""), 2.0, "{text}");
    assert_eq!(v("tutti_files_by_state", ",state=\"valid\""), (2 * ROUNDS * CHUNKS as u64) as f64);
    assert!(v("tutti_leased_queue_pairs", "") >= 2.0, "the staying engine's pairs: {text}");
    assert!(v("tutti_arbitration_metadata_holds_total", "") > 0.0);
    let media: f64 =
        (0..2).map(|c| v("tutti_emulated_read_bytes_total", &format!(",controller=\"emu{c}\""))).sum();
    assert!(media >= moved as f64 / 2.0, "the drives read what the engines loaded: {media} of {moved}");
    // What the engines reported, the departed one included.
    assert_eq!(v("tutti_loaded_bytes_total", ""), moved as f64, "{text}");
    assert_eq!(v("tutti_stored_bytes_total", ""), moved as f64, "{text}");
    assert_eq!(
        v("tutti_layers_total", ",direction=\"load\""),
        (2 * ROUNDS * 4) as f64,
        "one job of 4 layers per load"
    );
    assert_eq!(v("tutti_layer_load_seconds_count", ""), (2 * ROUNDS * 4) as f64);
    assert_eq!(v("tutti_layer_store_seconds_count", ""), (2 * ROUNDS * 4) as f64);
    assert!(v("tutti_layer_load_seconds_sum", "") > 0.0);
    assert_eq!(v("tutti_layer_load_seconds_bucket", ",le=\"+Inf\""), (2 * ROUNDS * 4) as f64);
    let per_drive: f64 = (0..2)
        .map(|d| v("tutti_drive_loaded_bytes_total", &format!(",drive=\"{d}\",device=\"emu{d}\",nsid=\"1\"")))
        .sum();
    assert_eq!(per_drive, v("tutti_loaded_bytes_total", ""), "the drives' shares add up");
    let commands: f64 = (0..2)
        .map(|d| v("tutti_drive_commands_total", &format!(",drive=\"{d}\",device=\"emu{d}\",nsid=\"1\"")))
        .sum();
    assert_eq!(commands, v("tutti_commands_total", ""), "every command of the engines' layers, by drive");
    assert_eq!(
        v("tutti_drive_command_errors_total", ",drive=\"0\",device=\"emu0\",nsid=\"1\",kind=\"timeout\""),
        0.0
    );
    assert_eq!(v("tutti_reporting_clients", ""), 1.0);
    assert_eq!(v("tutti_client_reports_refused_total", ""), 0.0);
    assert!(text.contains("tutti_pool_info{") && text.contains("kv_heads=\"2\""), "{text}");

    // Prometheus's own checker finds nothing to say.
    if have("promtool") {
        let (ok, said) = promtool(&text);
        assert!(ok && said.trim().is_empty(), "promtool check metrics: {said}");
        // Negative control: it does object to a broken exposition.
        let (ok, said) = promtool(
            &text.replace("# TYPE tutti_lookups_total counter\n", "# TYPE tutti_lookups_total gauge\n"),
        );
        assert!(!ok || !said.trim().is_empty(), "promtool accepted a counter typed as a gauge");
    } else {
        skip::skip("no promtool on PATH (scripts/setup-prometheus puts it in ~/.cache/tutti/prometheus/bin; scripts/test adds that to PATH)");
    }

    // Anything but GET /metrics is answered, not served.
    assert_eq!(http_get(&addr, "/nothing").unwrap().0, 404);
    assert_eq!(http_get(&addr, "/").unwrap().0, 200);
    drop(stay);
    assert!(serve.terminate().success());
    assert!(std::net::TcpStream::connect(&addr).is_err(), "the metrics port is closed after the stop");
}

#[test]
fn a_real_prometheus_scrapes_tuttid_and_answers_a_query_through_its_api() {
    if !have("prometheus") {
        return skip::skip(
            "no prometheus on PATH (scripts/setup-prometheus puts it in ~/.cache/tutti/prometheus/bin; scripts/test adds that to PATH)",
        );
    }
    let dir = TempDir::new("prom");
    let serve = serve(&dir);
    let target = serve.hello["metrics"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_string();
    let engine = Engine::connect(&serve.socket(), "engine").unwrap();
    for r in 0..2u64 {
        assert_eq!(engine.store(r * CHUNKS as u64).unwrap(), CHUNKS);
        assert_eq!(engine.load(r * CHUNKS as u64).unwrap(), (CHUNKS as usize, true));
    }
    let want = 2 * CHUNKS as u64 * 2 * 4 * 4096;

    // Prometheus on loopback: a free port (taken and given back), its data in the test's dir.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let web = format!("127.0.0.1:{port}");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: tuttid\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let mut prom = serving::reap::Reap(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let query = "/api/v1/query?query=tutti_loaded_bytes_total";
    let deadline = Instant::now() + Duration::from_secs(90);
    let answer = loop {
        if let Some(status) = prom.try_wait().unwrap() {
            panic!(
                "prometheus exited ({status}): {}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
        }
        if let Ok((200, body)) = http_get(&web, query) {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            if v["data"]["result"].as_array().is_some_and(|r| !r.is_empty()) {
                break v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never had tutti_loaded_bytes_total; its log: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let result = &answer["data"]["result"][0];
    assert_eq!(result["metric"]["job"], "tuttid", "{answer}");
    assert_eq!(result["metric"]["pool"], serve.hello["pool"], "{answer}");
    let value: f64 = result["value"][1].as_str().unwrap().parse().unwrap();
    assert_eq!(value, want as f64, "{answer}");
    // The scrape itself was healthy.
    let (_, up) = http_get(&web, "/api/v1/query?query=up").unwrap();
    assert!(up.contains("\"1\""), "{up}");
    prom.kill().unwrap();
    let _ = prom.wait();
    drop(engine);
    assert!(serve.terminate().success());
}
