//! The benchmark suite behind `make bench`: every figure is a ratio against a baseline measured
//! on the same kind of server in the same run, interleaved over several rounds, median reported.
//!
//! Sections (all by default, or name some: `cargo run --release --example bench -- contention`):
//! - `single`: LOCK.ACQUIRE / RELEASE / RENEW / FENCE under redis-benchmark against SET NX PX,
//!   the compare-and-delete and compare-and-PEXPIRE scripts through EVALSHA, and GET;
//! - `contention`: 16 clients on one lock, server-side WAIT against polling, pub/sub wake-up
//!   and spinning; handoff latency against a PING round trip;
//! - `memory`: bytes per held and per released lock against a SET PX string;
//! - `scale`: acquire with 1M locks against 1k, and 1M leases that end together;
//! - `shared`: the SHARED acquire/release cycle against the exclusive one, and 64 readers + 4
//!   writers on one lock against the same 68 clients all exclusive;
//! - `sync`: grants, renewals and handoffs that wait for a replica (`SYNC 1`) against the same
//!   without it, on a primary with one replica;
//! - `profile`: where the server's CPU time goes (perf) for ACQUIRE, RELEASE and RENEW and
//!   their baselines, grouped (lease index, rest of the module, keyspace, Lua, kernel...).
//!
//! The servers are redis-server (`$REDIS_SERVER`) with `$LOCK_MODULE` (`make bench` sets the
//! release build), each started and stopped by the test harness' Server guard, on loopback.
//! `BENCH_QUICK=1` runs every section small, for a fast check; its figures are not for quoting.
//! A full run writes the tables to bench/results.md (`$BENCH_RESULTS` when set) and the handoff samples of the chart to
//! target/bench/handoff.csv (bench/chart.sh draws bench/handoff.png from it).

#[path = "../tests/common/mod.rs"]
mod common;
mod contention;
mod crowd;
mod memory;
mod profile;
mod scale;
mod shared;
mod single;
mod sync;
mod util;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use util::{progress, Pinning, Settings};

const SECTIONS: [&str; 7] = [
    "single",
    "contention",
    "memory",
    "scale",
    "shared",
    "sync",
    "profile",
];

/// The 1-minute load average (Linux), to show when something else ran beside the bench.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// The sections other benches keep in bench/results.md, markers included: bench/peers/peers.py's
/// (`make bench-peers`) and bench/peers_pg.rs's (`make bench-peers-pg`).
fn kept_sections(results: &str) -> Vec<&str> {
    const MARKERS: [(&str, &str); 2] = [
        ("<!-- bench-peers: begin", "<!-- bench-peers: end -->"),
        ("<!-- bench-peers-pg: begin", "<!-- bench-peers-pg: end -->"),
    ];
    MARKERS
        .iter()
        .filter_map(|(begin, end)| {
            let start = results.find(begin)?;
            let stop = start + results[start..].find(end)? + end.len();
            Some(&results[start..stop])
        })
        .collect()
}

fn main() {
    let started = Instant::now();
    let load_before = load_average();
    let args: Vec<String> = std::env::args().skip(1).collect();
    for arg in &args {
        if !SECTIONS.contains(&arg.as_str()) {
            eprintln!(
                "bench: unknown section {arg:?}; sections: {}",
                SECTIONS.join(" ")
            );
            std::process::exit(2);
        }
    }
    let wanted = |name: &str| args.is_empty() || args.iter().any(|a| a == name);
    if let Err(message) = util::check_redis_benchmark() {
        eprintln!("bench: {message}");
        std::process::exit(1);
    }
    if load_before.parse::<f64>().is_ok_and(|l| l > 1.0) {
        eprintln!(
            "bench: load average {load_before} before starting: something else is running, and \
             the figures will be noisier"
        );
    }
    let settings = Settings::from_env();
    let pinning = Pinning::setup();
    // "Redis 7.0.15", "Valkey 9.1.2": the server's own name (Valkey's redis_version is 7.2.4).
    let version = {
        let server = pinning.server(util::bench_config());
        let identity = server.identity();
        let (major, minor, patch) = identity.version;
        format!("{:?} {major}.{minor}.{patch}", identity.product)
    };
    progress(
        started,
        &format!(
            "{version}, module {}, {}{}",
            common::module_path().display(),
            pinning.describe(),
            if settings.quick { ", BENCH_QUICK" } else { "" }
        ),
    );

    let mut sections = Vec::new();
    let mut goals: Vec<(String, bool)> = Vec::new();
    let mut show = |table: String, more: Vec<(String, bool)>| {
        println!("{table}");
        sections.push(table);
        goals.extend(more);
    };
    if wanted("single") {
        let out = single::run(&settings, &pinning, started);
        show(out.table, out.goals);
    }
    let mut chart = None;
    if wanted("contention") {
        let out = contention::run(&settings, &pinning, started);
        chart = Some(out.chart);
        show(out.table, out.goals);
    }
    if wanted("memory") {
        let out = memory::run(&settings, &pinning, started);
        show(out.table, out.goals);
    }
    if wanted("scale") {
        let out = scale::run(&settings, &pinning, started);
        show(out.table, out.goals);
    }
    if wanted("shared") {
        let out = shared::run(&settings, &pinning, started);
        show(out.table, out.goals);
    }
    if wanted("sync") {
        let out = sync::run(&settings, &pinning, started);
        show(out.table, out.goals);
    }
    if wanted("profile") {
        let out = profile::run(&settings, &pinning, started);
        show(out.table, out.goals);
    }

    let mut summary = String::from("### Goals\n\n| goal | |\n|---|---|\n");
    for (goal, met) in &goals {
        let _ = writeln!(summary, "| {goal} | {} |", util::verdict(*met));
    }
    println!("{summary}");

    let cores = pinning.cores;
    let mut report = format!(
        "<!-- Written by `make bench` (bench/main.rs); do not edit by hand. -->\n\n\
         {version} on {cores} cores, {}; {:.0} s in all; load average {load_before} before, \
         {} after (the bench alone brings it to about 2){}.\n\n",
        pinning.describe(),
        started.elapsed().as_secs_f64(),
        load_average(),
        if settings.quick {
            " (BENCH_QUICK: small runs, not for quoting)"
        } else {
            ""
        }
    );
    for section in &sections {
        report.push_str(section);
        report.push('\n');
    }
    report.push_str(&summary);

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir).expect("create target/bench");
    let results = if let Some(path) = std::env::var_os("BENCH_RESULTS") {
        // `make bench-servers` collects one file per server.
        path.into()
    } else if settings.quick || !args.is_empty() {
        // A quick or partial run never replaces the full results.
        out_dir.join("results.md")
    } else {
        root.join("bench/results.md")
    };
    // The comparisons with etcd and ZooKeeper (`make bench-peers`) and with PostgreSQL (`make
    // bench-peers-pg`) have their own sections in the same file; a run of this bench carries them
    // over.
    let previous = std::fs::read_to_string(&results).unwrap_or_default();
    for kept in kept_sections(&previous) {
        report.push('\n');
        report.push_str(kept);
        report.push('\n');
    }
    std::fs::write(&results, &report).expect("write results");
    if let Some(chart) = chart {
        let mut csv = String::from("series,handoff_us\n");
        for (series, us) in chart {
            let _ = writeln!(csv, "{series},{us:.2}");
        }
        std::fs::write(out_dir.join("handoff.csv"), csv).expect("write handoff.csv");
    }
    progress(
        started,
        &format!("done; tables written to {}", results.display()),
    );
}
