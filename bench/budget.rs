//! `make bench-budget`: the short check CI runs so that no change gives back what the hot path
//! has won. In one run, on one server (the release module, pinned apart from the load):
//!
//! - server CPU per request of LOCK.ACQUIRE (fresh keys), LOCK.RELEASE, LOCK.RENEW and
//!   LOCK.FENCE against `SET key token NX PX ttl`, the compare-and-delete and compare-and-PEXPIRE
//!   scripts (EVALSHA) and GET: INFO commandstats' `usec_per_call`, the time inside each command
//!   (steadier than throughput on a shared machine), after CONFIG RESETSTAT, redis-benchmark with
//!   50 clients and pipeline 16, median of interleaved rounds; the ratio is baseline / module, so
//!   above 1 the module costs less;
//! - used_memory per held lock against a `SET key token PX ttl` string (module / baseline, so
//!   below 1 the lock costs less).
//!
//! Each ratio is checked against its floor (its ceiling, for memory) in bench/budget: the
//! figures measured when the floors were last raised, less a margin wide enough for the noise
//! of this check and narrow enough that a regression of 15% fails it. A miss exits 1. A change
//! that must cost more says so by lowering its floor in bench/budget, in the same commit, with
//! the measured reason (README, "Performance").

#[path = "../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod util;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use common::{Conn, Reply};
use util::{load_script, lua, median, preload, progress, redis_benchmark, Pinning};

/// Rounds of every pair, module and baseline interleaved (which goes first alternates).
const ROUNDS: usize = 9;
/// Requests per redis-benchmark run.
const REQUESTS: usize = 100_000;
/// Locks (and strings) held while RENEW, FENCE and RELEASE run.
const HELD: usize = 60_000;
/// Locks (and strings) per memory measurement.
const MEMORY_KEYS: usize = 50_000;
const TOKEN: &str = "budget-token-0123456789abcdef0123";
const TTL: &str = "600000";

/// One measured pair: the module's command, the baseline's, and the commandstats names.
struct Pair {
    name: &'static str,
    module_stat: &'static str,
    baseline_stat: &'static str,
}

const PAIRS: [Pair; 4] = [
    Pair {
        name: "acquire",
        module_stat: "lock.acquire",
        baseline_stat: "set",
    },
    Pair {
        name: "release",
        module_stat: "lock.release",
        baseline_stat: "evalsha",
    },
    Pair {
        name: "renew",
        module_stat: "lock.renew",
        baseline_stat: "evalsha",
    },
    Pair {
        name: "fence",
        module_stat: "lock.fence",
        baseline_stat: "get",
    },
];

/// `usec_per_call` of `command` in INFO commandstats (since the last CONFIG RESETSTAT).
fn usec_per_call(conn: &mut Conn, command: &str) -> f64 {
    let info = conn.call(&["INFO", "commandstats"]).text();
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|field| field.strip_prefix("usec_per_call="))
        })
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("INFO commandstats has no usec_per_call for {command}"))
}

/// The floors: `name minimum` per line (`memory` is a maximum); `#` starts a comment.
fn floors(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty())
        .map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next().unwrap_or_default().to_string();
            let value = words
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("bench/budget: no number in {line:?}"));
            (name, value)
        })
        .collect()
}

fn main() {
    let started = Instant::now();
    if let Err(message) = util::check_redis_benchmark() {
        eprintln!("bench-budget: {message}");
        std::process::exit(1);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let budget_path = root.join("bench/budget");
    let budget = floors(&std::fs::read_to_string(&budget_path).expect("read bench/budget"));
    let pinning = Pinning::setup();
    progress(
        started,
        &format!(
            "module {}, {}",
            common::module_path().display(),
            pinning.describe()
        ),
    );

    let server = pinning.server(util::bench_config());
    let mut conn = server.conn();
    let release_sha = load_script(&mut conn, lua::RELEASE);
    let renew_sha = load_script(&mut conn, lua::RENEW);
    let locks_sha = load_script(&mut conn, lua::PRELOAD_LOCKS);
    let strings_sha = load_script(&mut conn, lua::PRELOAD_STRINGS);
    let tail = || vec![TOKEN.to_string(), TTL.to_string()];

    // Each measure: its ratio, and what it is a ratio of (module / baseline, µs or bytes).
    let mut ratios: Vec<(&'static str, f64, f64, f64)> = Vec::new();
    for pair in &PAIRS {
        let mut per_round = Vec::with_capacity(ROUNDS);
        let mut costs = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
        for round in 0..ROUNDS {
            let run = |conn: &mut Conn, module: bool| -> f64 {
                util::flushall(conn);
                if pair.name != "acquire" {
                    let (sha, prefix) = if module {
                        (&locks_sha, "l:")
                    } else {
                        (&strings_sha, "s:")
                    };
                    preload(conn, sha, prefix, HELD, 20_000, tail);
                }
                let command: Vec<&str> = match (pair.name, module) {
                    ("acquire", true) => vec!["LOCK.ACQUIRE", "l:__rand_int__", TOKEN, TTL],
                    ("acquire", false) => {
                        vec!["SET", "s:__rand_int__", TOKEN, "NX", "PX", TTL]
                    }
                    ("release", true) => vec!["LOCK.RELEASE", "l:__rand_int__", TOKEN],
                    ("release", false) => {
                        vec!["EVALSHA", &release_sha, "1", "s:__rand_int__", TOKEN]
                    }
                    ("renew", true) => vec!["LOCK.RENEW", "l:__rand_int__", TOKEN, TTL],
                    ("renew", false) => {
                        vec!["EVALSHA", &renew_sha, "1", "s:__rand_int__", TOKEN, TTL]
                    }
                    ("fence", true) => vec!["LOCK.FENCE", "l:__rand_int__", "1"],
                    _ => vec!["GET", "s:__rand_int__"],
                };
                // Fresh keys for ACQUIRE; the held ones for the rest.
                let keyspace = if pair.name == "acquire" {
                    100_000_000
                } else {
                    HELD
                };
                assert_eq!(conn.call(&["CONFIG", "RESETSTAT"]), Reply::status("OK"));
                redis_benchmark(&server, 50, REQUESTS, 16, keyspace, &command);
                usec_per_call(
                    conn,
                    if module {
                        pair.module_stat
                    } else {
                        pair.baseline_stat
                    },
                )
            };
            let (baseline, module) = util::pair(round % 2 == 1, |module| run(&mut conn, module));
            per_round.push(baseline / module);
            costs.0.push(module);
            costs.1.push(baseline);
        }
        let ratio = median(&per_round);
        progress(started, &format!("{}: {ratio:.2}x", pair.name));
        ratios.push((pair.name, ratio, median(&costs.0), median(&costs.1)));
    }

    // Memory: bytes per held lock against bytes per SET PX string, median of the rounds.
    let mut per_round = Vec::with_capacity(ROUNDS);
    let mut sizes = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for _ in 0..ROUNDS {
        let mut bytes = |sha: &str, prefix: &str| -> f64 {
            util::flushall(&mut conn);
            let before = util::info_u64(&mut conn, "memory", "used_memory");
            preload(&mut conn, sha, prefix, MEMORY_KEYS, 10_000, tail);
            let after = util::info_u64(&mut conn, "memory", "used_memory");
            (after.saturating_sub(before)) as f64 / MEMORY_KEYS as f64
        };
        let lock = bytes(&locks_sha, "l:");
        let string = bytes(&strings_sha, "s:");
        per_round.push(lock / string);
        sizes.0.push(lock);
        sizes.1.push(string);
    }
    let memory = median(&per_round);
    progress(started, &format!("memory: {memory:.2}x"));
    ratios.push(("memory", memory, median(&sizes.0), median(&sizes.1)));

    let mut report = String::from(
        "| measure | module | baseline | ratio | budget | verdict |\n|---|---|---|---|---|---|\n",
    );
    let mut failed = Vec::new();
    for (name, ratio, module, baseline) in &ratios {
        let unit = if *name == "memory" { "B" } else { "µs" };
        let Some((_, limit)) = budget.iter().find(|(n, _)| n == name) else {
            failed.push(format!("{name}: no budget in bench/budget"));
            continue;
        };
        let (met, bound) = if *name == "memory" {
            (*ratio <= *limit, format!("<= {limit:.2}x"))
        } else {
            (*ratio >= *limit, format!(">= {limit:.2}x"))
        };
        let _ = writeln!(
            report,
            "| {name} | {module:.2} {unit} | {baseline:.2} {unit} | {ratio:.2}x | {bound} | {} |",
            if met { "within" } else { "OVER BUDGET" }
        );
        if !met {
            failed.push(format!("{name}: {ratio:.2}x, budget {bound}"));
        }
    }
    println!("{report}");
    progress(started, "done");
    if !failed.is_empty() {
        eprintln!(
            "bench-budget: over budget: {}. A change that must cost more lowers its floor in \
             bench/budget, with the measured reason.",
            failed.join("; ")
        );
        std::process::exit(1);
    }
}
