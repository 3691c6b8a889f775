//! `make bench-budget`: the short check CI runs so that no change gives back what the hot path
//! has won. In one run, on one server with the release module:
//!
//! - the work inside each command of LOCK.ACQUIRE (fresh keys), LOCK.RELEASE, LOCK.RENEW and
//!   LOCK.FENCE against `SET key token NX PX ttl`, the compare-and-delete and compare-and-PEXPIRE
//!   scripts (EVALSHA) and GET: instructions executed inside the server's `call()` per request
//!   (what INFO commandstats' `usec_per_call` times), counted by valgrind's callgrind, which
//!   counts the same instructions on every run whatever else the machine does (`usec_per_call`
//!   swung by 10 to 15% from run to run on a 2-core VM: too much to see a 15% regression). The
//!   ratio is baseline / module, so above 1 the module does less;
//! - the same ACQUIREs with `lock.long-hold` set (every grant gets a long-hold crossing), and
//!   with 16 namespaces in `lock.namespaces` (every key in one, its rules kept), against each
//!   off: what a configured feature costs a grant (off / on, so 1 is nothing);
//! - used_memory per held lock against a `SET key token PX ttl` string (module / baseline, so
//!   below 1 the lock costs less).
//!
//! Under valgrind the CPU's SHA-256 instructions are not offered, so the token digest runs in
//! software there (about 7,000 instructions instead of a few hundred): the counts overstate a
//! command that takes a digest, by the same amount on every run.
//!
//! Each ratio is checked against its floor (its ceiling, for memory) in bench/budget: the
//! figures measured when the floors were last set, less a margin wider than this check's noise
//! and narrower than a 15% regression. A miss exits 1. A change that must cost more says so by
//! lowering its floor in bench/budget, in the same commit, with the measured reason.

#[path = "../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod util;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{Conn, Reply, Server};
use util::{load_script, lua, median, preload, progress, redis_benchmark, Pinning};

/// Measured rounds of every pair (module first every other round); the counts repeat within
/// a fraction of a percent, so a few do.
const ROUNDS: usize = 3;
/// Requests per counted redis-benchmark run.
const REQUESTS: usize = 5_000;
/// Locks (and strings) held while RENEW, FENCE and RELEASE run.
const HELD: usize = 5_000;
/// Strings in the keyspace before a fresh-key ACQUIRE or SET run: its tables are sized for the
/// run, so no rehash falls into it on either side.
const FILLER: usize = 10_000;
/// Locks (and strings) per memory measurement.
const MEMORY_KEYS: usize = 50_000;
const TOKEN: &str = "budget-token-0123456789abcdef0123";
const TTL: &str = "600000";

/// The measured pairs, named as in bench/budget.
const PAIRS: [&str; 4] = ["acquire", "release", "renew", "fence"];

/// A redis-server under valgrind's callgrind that instruments nothing until asked, and then
/// counts only what runs inside the server's `call()`: the commands themselves, not the reading
/// of requests or the writing of replies.
struct Counted {
    server: Server,
    dir: PathBuf,
    dumps: usize,
}

impl Counted {
    fn start(pinning: &Pinning) -> Counted {
        let dir = std::env::temp_dir().join(format!("lock-budget-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("budget scratch directory");
        let real = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let wrapper = dir.join("redis-server");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no \
                 --collect-atstart=no --toggle-collect=call --callgrind-out-file={}/cg.out \
                 --log-file={}/valgrind.log {real} \"$@\"\n",
                dir.display(),
                dir.display()
            ),
        )
        .expect("write the callgrind wrapper");
        let status = Command::new("chmod")
            .arg("+x")
            .arg(&wrapper)
            .status()
            .expect("chmod");
        assert!(status.success());
        std::env::set_var("REDIS_SERVER", &wrapper);
        let server = pinning.server(util::bench_config());
        std::env::set_var("REDIS_SERVER", &real);
        Counted {
            server,
            dir,
            dumps: 0,
        }
    }

    fn control(&self, args: &[&str]) {
        let out = Command::new("callgrind_control")
            .args(args)
            .arg(self.server.pid().to_string())
            .output()
            .expect("run callgrind_control (valgrind)");
        assert!(out.status.success(), "callgrind_control {args:?} failed");
    }

    /// Instructions executed inside `call()` while `work` runs (given the server), and the
    /// calls to the allocator (malloc, calloc, realloc) among them.
    fn instructions(&mut self, work: impl FnOnce(&Server)) -> Counts {
        self.control(&["--instr=on"]);
        self.control(&["--zero"]);
        work(&self.server);
        self.control(&["--dump"]);
        self.control(&["--instr=off"]);
        self.dumps += 1;
        let dump = self.dir.join(format!("cg.out.{}", self.dumps));
        let text =
            std::fs::read_to_string(&dump).unwrap_or_else(|e| panic!("{}: {e}", dump.display()));
        let instructions = text
            .lines()
            .find_map(|line| line.strip_prefix("summary:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no summary in {}", dump.display()));
        Counts {
            instructions,
            allocations: allocations(&text),
            dump,
        }
    }
}

/// Where a command's instructions go: the inclusive count of each of `parts` (a function's
/// path, as callgrind_annotate names it) in a dump.
fn attribute(dump: &Path, parts: &[(&'static str, &'static str)]) -> Vec<(&'static str, u64)> {
    let out = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(dump)
        .output()
        .expect("run callgrind_annotate (valgrind)");
    let text = String::from_utf8_lossy(&out.stdout);
    parts
        .iter()
        .map(|(label, function)| {
            // A line is `count (share)  file:function [object]`; a function inlined into
            // others is listed once per source file it spans: its largest line is the
            // function itself.
            let count = text
                .lines()
                .filter(|line| {
                    line.split_once(':')
                        .is_some_and(|(_, name)| name.split(' ').next() == Some(function))
                })
                .filter_map(|line| line.split_whitespace().next())
                .filter_map(|n| n.replace(',', "").parse::<u64>().ok())
                .max()
                .unwrap_or(0);
            (*label, count)
        })
        .collect()
}

/// The parts of a fresh-key LOCK.ACQUIRE shown by the budget: what the operability features
/// cost a lock nobody waits for or asks about (the address and name WHO shows, the ages index
/// behind INFO's oldest hold and LONGHOLDS), beside what every grant needs.
const ACQUIRE_PARTS: [(&str, &str); 7] = [
    (
        "token digest (SHA-256, software under valgrind)",
        "redis_lock::lock::token::TokenDigest::of",
    ),
    ("replication of the effect (RM_Replicate)", "RM_Replicate"),
    (
        "storing the value (RM_ModuleTypeSetValue)",
        "RM_ModuleTypeSetValue",
    ),
    ("lease index", "redis_lock::service::leases::follow"),
    ("effect encoding", "redis_lock::lock::codec::State::of"),
    (
        "WHO: the connection's address and name",
        "redis_lock::host::server::Connection::of",
    ),
    (
        "ages index (INFO oldest hold, LONGHOLDS)",
        "redis_lock::service::holds::follow_change",
    ),
];

/// What one counted run did inside `call()`.
struct Counts {
    instructions: u64,
    /// The dump, for [`attribute`].
    dump: PathBuf,
    /// Calls to malloc, calloc and realloc, and those of the module among them (through
    /// RM_Alloc, RM_Calloc and RM_Realloc: the module's global allocator).
    allocations: (u64, u64),
}

/// The calls to malloc, calloc and realloc in a callgrind dump, and to the module API's
/// allocation functions: every `calls=` line under a `cfn=` naming one of them. Names are
/// compressed: a function's first mention is `(id) name`, later ones `(id)` alone.
fn allocations(dump: &str) -> (u64, u64) {
    let mut names: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    let mut callee = (false, false);
    let mut calls = (0, 0);
    for line in dump.lines() {
        if let Some(rest) = line
            .strip_prefix("cfn=")
            .or_else(|| line.strip_prefix("fn="))
        {
            let name = match rest.split_once(' ') {
                Some((id, name)) => {
                    names.insert(id, name);
                    name
                }
                None => names.get(rest).copied().unwrap_or_default(),
            };
            let call = line.starts_with("cfn=");
            callee = (
                call && matches!(name, "malloc" | "calloc" | "realloc"),
                call && matches!(name, "RM_Alloc" | "RM_Calloc" | "RM_Realloc"),
            );
        } else if let Some(rest) = line.strip_prefix("calls=") {
            let n = rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            if callee.0 {
                calls.0 += n;
            }
            if callee.1 {
                calls.1 += n;
            }
        }
    }
    calls
}

impl Drop for Counted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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

    let mut counted = Counted::start(&pinning);
    let mut conn = counted.server.conn();
    let release_sha = load_script(&mut conn, lua::RELEASE);
    let renew_sha = load_script(&mut conn, lua::RENEW);
    let locks_sha = load_script(&mut conn, lua::PRELOAD_LOCKS);
    let strings_sha = load_script(&mut conn, lua::PRELOAD_STRINGS);
    let tail = || vec![TOKEN.to_string(), TTL.to_string()];

    // Each measure: its ratio, and what it is a ratio of (module / baseline: instructions per
    // request, or bytes).
    let mut ratios: Vec<(&'static str, f64, f64, f64)> = Vec::new();
    // Where a fresh-key ACQUIRE's instructions go (the last round's).
    let mut acquire_parts: Vec<(&'static str, f64)> = Vec::new();
    // Each pair's calls to the allocator per request: module (all, the module's own), baseline.
    let mut allocations: Vec<(&'static str, f64, f64, f64)> = Vec::new();
    for name in PAIRS {
        let mut per_round = Vec::with_capacity(ROUNDS);
        let mut costs = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
        let mut allocs = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let mut run = |conn: &mut Conn, module: bool| -> (f64, f64, f64) {
                util::flushall(conn);
                if name == "acquire" {
                    // Keys enough that the keyspace's tables are sized for the run: no rehash
                    // in the middle of it, on either side (it made the ratio swing by 10%).
                    preload(conn, &strings_sha, "x:", FILLER, 20_000, tail);
                } else {
                    let (sha, prefix) = if module {
                        (&locks_sha, "l:")
                    } else {
                        (&strings_sha, "s:")
                    };
                    preload(conn, sha, prefix, HELD, 20_000, tail);
                }
                let command: Vec<&str> = match (name, module) {
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
                let keyspace = if name == "acquire" { 100_000_000 } else { HELD };
                let counts = counted.instructions(|server| {
                    redis_benchmark(server, 50, REQUESTS, 16, keyspace, &command);
                });
                let per_request = |n: u64| n as f64 / REQUESTS as f64;
                if name == "acquire" && module {
                    acquire_parts = attribute(&counts.dump, &ACQUIRE_PARTS)
                        .into_iter()
                        .map(|(part, n)| (part, per_request(n)))
                        .collect();
                }
                (
                    per_request(counts.instructions),
                    per_request(counts.allocations.0),
                    per_request(counts.allocations.1),
                )
            };
            let (baseline, module) = util::pair(round % 2 == 1, |module| run(&mut conn, module));
            per_round.push(baseline.0 / module.0);
            costs.0.push(module.0);
            costs.1.push(baseline.0);
            allocs.0.push(module.1);
            allocs.1.push(module.2);
            allocs.2.push(baseline.1);
        }
        allocations.push((
            name,
            median(&allocs.0),
            median(&allocs.1),
            median(&allocs.2),
        ));
        let ratio = median(&per_round);
        let rounds: Vec<String> = per_round.iter().map(|r| format!("{r:.3}")).collect();
        progress(
            started,
            &format!("{name}: {ratio:.3}x (rounds {})", rounds.join(" ")),
        );
        ratios.push((name, ratio, median(&costs.0), median(&costs.1)));
    }

    // Features configured on against off: fresh-key ACQUIREs with the config set against it at
    // its default. The ratio is off / on, so 1 says the feature costs a grant nothing.
    // lock.long-hold 300000: every grant has a long-hold crossing, before its lease ends.
    // lock.namespaces with 16 namespaces: every key is in the last one defined, in enforce mode
    // with rules the requests keep (judged, counted, never refused).
    let namespaces = (0..15)
        .map(|n| format!("team-{n} prefix=t{n}: mode=enforce max-ttl=60000"))
        .chain(std::iter::once(format!(
            "locks prefix=l: mode=enforce min-ttl=1000 max-ttl={TTL} max-wait=60000"
        )))
        .collect::<Vec<_>>()
        .join("; ");
    for (name, config, on_value) in [
        ("long-hold", "lock.long-hold", "300000"),
        ("namespaces", "lock.namespaces", namespaces.as_str()),
    ] {
        let off_value = match conn.call(&["CONFIG", "GET", config]).items().get(1) {
            Some(value) => value.text(),
            None => panic!("CONFIG GET {config}"),
        };
        let mut per_round = Vec::with_capacity(ROUNDS);
        let mut costs = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
        for round in 0..ROUNDS {
            let mut run = |conn: &mut Conn, on: bool| -> f64 {
                util::flushall(conn);
                let value = if on { on_value } else { off_value.as_str() };
                let set = conn.call(&["CONFIG", "SET", config, value]);
                assert_eq!(set, Reply::status("OK"), "CONFIG SET {config} {value}");
                preload(conn, &strings_sha, "x:", FILLER, 20_000, tail);
                let command = ["LOCK.ACQUIRE", "l:__rand_int__", TOKEN, TTL];
                let counts = counted.instructions(|server| {
                    redis_benchmark(server, 50, REQUESTS, 16, 100_000_000, &command);
                });
                counts.instructions as f64 / REQUESTS as f64
            };
            let (off, on) = util::pair(round % 2 == 1, |on| run(&mut conn, on));
            per_round.push(off / on);
            costs.0.push(on);
            costs.1.push(off);
        }
        let set = conn.call(&["CONFIG", "SET", config, &off_value]);
        assert_eq!(set, Reply::status("OK"), "CONFIG SET {config} back");
        let ratio = median(&per_round);
        progress(started, &format!("{name}: {ratio:.3}x"));
        ratios.push((name, ratio, median(&costs.0), median(&costs.1)));
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
        let unit = if *name == "memory" { "B" } else { "instr" };
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
            "| {name} | {module:.0} {unit} | {baseline:.0} {unit} | {ratio:.3}x | {bound} | {} |",
            if met { "within" } else { "OVER BUDGET" }
        );
        if !met {
            failed.push(format!("{name}: {ratio:.2}x, budget {bound}"));
        }
    }
    report.push_str(
        "\n| allocations per request | module (server and module) | of which the module's | \
         baseline |\n|---|---|---|---|\n",
    );
    for (name, module, own, baseline) in &allocations {
        let _ = writeln!(
            report,
            "| {name} | {module:.2} | {own:.2} | {baseline:.2} |"
        );
    }
    let acquire = ratios.first().map_or(0.0, |r| r.2);
    report
        .push_str("\n| inside a fresh-key LOCK.ACQUIRE | instructions | share |\n|---|---|---|\n");
    for (part, n) in &acquire_parts {
        let share = if acquire > 0.0 {
            n / acquire * 100.0
        } else {
            0.0
        };
        let _ = writeln!(report, "| {part} | {n:.0} | {share:.1}% |");
    }
    println!("{report}");
    // `make bench` keeps the tables beside its own (bench/budget.md).
    if let Ok(path) = std::env::var("BENCH_BUDGET_OUT") {
        let page = format!(
            "<!-- Written by `make bench` (bench/budget.rs); do not edit by hand. -->\n\n\
             Instructions inside each command (callgrind), memory per held lock, the calls to \
             the allocator per command and where a fresh-key ACQUIRE's instructions go; Redis \
             7.0.15, release build. The floors are in [budget](budget).\n\n{report}"
        );
        if let Err(e) = std::fs::write(&path, page) {
            eprintln!("bench-budget: cannot write {path}: {e}");
        }
    }
    // Stops the server now: process::exit below would skip its guard.
    drop(conn);
    drop(counted);
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
