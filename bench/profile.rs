//! Profile: where the server's CPU time goes for each command and its baseline. `perf record`
//! samples the pinned redis-server while redis-benchmark runs one command (pipeline 16), and the
//! samples are grouped by where they land: the module's lease index, the rest of the module,
//! Redis' keyspace lookup, Lua, the allocator, the kernel's socket work, and Redis' own command
//! path. Each group's share times the run's server CPU per request (schedstat) gives µs per
//! request, so a command and its baseline compare group by group. Instruction counts are
//! bench/profile.sh's (callgrind); this shows time, cache misses included.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Conn, Server};
use crate::util::{
    self, flushall, load_script, lua, preload, progress, redis_benchmark_db, select, LoadRun,
    Pinning, Settings, TOKEN,
};

const CLIENTS: usize = 50;
const PIPELINE: usize = 16;
const FRESH_RANGE: usize = 1_000_000_000;
const HEADING: &str = "### Profile: where the server's time goes\n\n";
/// Keys per database for the rows on existing keys: below 2^19, so no database is still
/// rehashing into a larger table when the runs start (see the warm-up in `run`).
const HELD: usize = 500_000;

/// Where a sample landed.
const GROUPS: [&str; 8] = [
    "module: lease index (B-tree)",
    "module: commands, state, effects",
    "Redis: keyspace lookup (dict)",
    "Redis: Lua scripting",
    "Redis: protocol, dispatch, replies, propagation",
    "allocator (jemalloc, zmalloc)",
    "libc and vDSO (memcmp, memcpy, clock)",
    "kernel (sockets, syscalls)",
];

pub struct Outcome {
    pub table: String,
    pub goals: Vec<(String, bool)>,
}

/// One profiled run: server CPU per request, and the share of samples per group (and per
/// symbol, for the top list).
struct Profile {
    label: &'static str,
    run: LoadRun,
    groups: [f64; GROUPS.len()],
    top: Vec<(f64, String)>,
}

fn group_of(dso: &str, symbol: &str) -> usize {
    let lua = symbol.starts_with("lua")
        || symbol.contains("Lua")
        || symbol.starts_with("eval")
        || symbol.starts_with("script")
        || symbol.starts_with("SHA1");
    if dso.starts_with("libredis_lock") {
        if symbol.contains("lease_index") || symbol.contains("btree") {
            0
        } else {
            1
        }
    } else if dso.starts_with("[kernel") {
        7
    } else if dso.starts_with("libjemalloc")
        || ["zmalloc", "zfree", "zcalloc", "zrealloc", "ztrymalloc"]
            .iter()
            .any(|z| symbol.starts_with(z))
    {
        5
    } else if dso.starts_with("libc") || dso.starts_with("[vdso") || dso.starts_with("libm") {
        6
    } else if lua {
        3
    } else if symbol.starts_with("dict")
        || symbol.starts_with("siphash")
        || symbol.starts_with("lookupKey")
        || symbol.starts_with("dbFind")
    {
        2
    } else {
        4
    }
}

/// `perf` is installed and may sample a process here.
fn perf_works() -> Result<(), String> {
    match Command::new("perf").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        _ => return Err("perf not found (Debian: apt-get install linux-perf)".into()),
    }
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())
        .unwrap_or(3);
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if paranoid > 2 && !root {
        return Err(format!(
            "perf may not sample here (perf_event_paranoid {paranoid})"
        ));
    }
    Ok(())
}

fn record(pid: u32, out: &Path) -> Option<Child> {
    Command::new("perf")
        .args(["record", "-q", "-F", "2999", "-o"])
        .arg(out)
        .args(["-p", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// Stops `perf record` (SIGINT writes its file) and waits for it, at most 30 s.
fn stop(mut perf: Child) {
    crate::common::signal("-INT", perf.id());
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = perf.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = perf.kill();
    let _ = perf.wait();
}

/// Reads a perf.data file: (share in %, dso, symbol) per symbol.
fn samples(data: &Path) -> Vec<(f64, String, String)> {
    let Ok(out) = Command::new("perf")
        .args([
            "report",
            "--no-children",
            "--sort",
            "dso,sym",
            "--stdio",
            "-i",
        ])
        .arg(data)
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let share = words.next()?.strip_suffix('%')?.parse::<f64>().ok()?;
            let dso = words.next()?.to_string();
            let _kind = words.next()?;
            let symbol = words.collect::<Vec<_>>().join(" ");
            Some((share, dso, symbol))
        })
        .collect()
}

/// Runs `command` under redis-benchmark while perf samples the server.
fn profiled(
    server: &Server,
    dir: &Path,
    label: &'static str,
    requests: usize,
    (db, range): (usize, usize),
    command: &[&str],
) -> Profile {
    let data = dir.join(format!(
        "{}.data",
        label.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    ));
    let perf = record(server.pid(), &data);
    // perf attaches within milliseconds; the run lasts seconds.
    std::thread::sleep(Duration::from_millis(300));
    let run = redis_benchmark_db(server, db, CLIENTS, requests, PIPELINE, range, command);
    if let Some(perf) = perf {
        stop(perf);
    }
    let mut groups = [0.0; GROUPS.len()];
    let mut top = Vec::new();
    for (share, dso, symbol) in samples(&data) {
        groups[group_of(&dso, &symbol)] += share;
        top.push((share, format!("{symbol} ({dso})")));
    }
    top.truncate(6);
    Profile {
        label,
        run,
        groups,
        top,
    }
}

pub fn run(settings: &Settings, pinning: &Pinning, started: Instant) -> Outcome {
    if let Err(why) = perf_works() {
        eprintln!("bench: profile left out: {why}");
        return Outcome {
            table: format!("{HEADING}Left out: {why}.\n"),
            goals: Vec::new(),
        };
    }
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench/perf");
    let _ = std::fs::create_dir_all(&dir);
    let server = pinning.server(util::bench_config());
    let mut conn: Conn = server.conn();
    let release_sha = load_script(&mut conn, lua::RELEASE);
    let renew_sha = load_script(&mut conn, lua::RENEW);
    let locks_sha = load_script(&mut conn, lua::PRELOAD_LOCKS);
    let strings_sha = load_script(&mut conn, lua::PRELOAD_STRINGS);
    let n = settings.requests_p16 * 4;
    progress(
        started,
        &format!("profile: preloading {HELD} locks and twice as many strings"),
    );
    flushall(&mut conn);
    // Each family in its own database: locks in 0, strings for the scripts in 1 and for DEL in
    // 2; the fresh keys of ACQUIRE and SET in 3 and 4.
    select(&mut conn, 0);
    preload(&mut conn, &locks_sha, "l:", HELD, 50_000, || {
        vec![TOKEN.into(), "3600000".into()]
    });
    for db in [1, 2] {
        select(&mut conn, db);
        preload(&mut conn, &strings_sha, "s:", HELD, 50_000, || {
            vec![TOKEN.into(), "3600000".into()]
        });
    }
    select(&mut conn, 0);
    // A table that grew during the preload is still being rehashed, a step per command: a few
    // lookups each finish that before anything is measured.
    for db in 0..3 {
        redis_benchmark_db(
            &server,
            db,
            CLIENTS,
            100_000,
            PIPELINE,
            HELD,
            &["EXISTS", "x"],
        );
    }
    let mut profiles = Vec::new();
    let mut go = |label, place, command: &[&str]| {
        progress(started, &format!("profile: {label}"));
        profiles.push(profiled(&server, &dir, label, n, place, command));
    };
    // ACQUIRE first, before the released locks' reclaim times come up; then RENEW, which leaves
    // the locks held for RELEASE.
    go(
        "LOCK.ACQUIRE (fresh keys)",
        (3, FRESH_RANGE),
        &["LOCK.ACQUIRE", "a:__rand_int__", TOKEN, "60000"],
    );
    go(
        "SET key token NX PX ttl",
        (4, FRESH_RANGE),
        &["SET", "b:__rand_int__", TOKEN, "NX", "PX", "60000"],
    );
    go(
        "LOCK.RENEW",
        (0, HELD),
        &["LOCK.RENEW", "l:__rand_int__", TOKEN, "3600000"],
    );
    go(
        "EVALSHA compare-and-PEXPIRE",
        (1, HELD),
        &[
            "EVALSHA",
            &renew_sha,
            "1",
            "s:__rand_int__",
            TOKEN,
            "3600000",
        ],
    );
    // FENCE and GET read what RENEW and the script left (fence 1 is never current).
    go(
        "LOCK.FENCE",
        (0, HELD),
        &["LOCK.FENCE", "l:__rand_int__", "1"],
    );
    go("GET", (1, HELD), &["GET", "s:__rand_int__"]);
    go(
        "LOCK.RELEASE",
        (0, HELD),
        &["LOCK.RELEASE", "l:__rand_int__", TOKEN],
    );
    go(
        "EVALSHA compare-and-delete",
        (1, HELD),
        &["EVALSHA", &release_sha, "1", "s:__rand_int__", TOKEN],
    );
    // What a release cannot beat: deleting the key, without looking at it.
    go("DEL", (2, HELD), &["DEL", "s:__rand_int__"]);
    flushall(&mut conn);
    Outcome {
        table: table(&profiles, n),
        goals: Vec::new(),
    }
}

fn table(profiles: &[Profile], requests: usize) -> String {
    let mut out = String::from(HEADING);
    let _ = writeln!(
        out,
        "`perf record` (2999 Hz) on the pinned redis-server while redis-benchmark sends one \
         command, {CLIENTS} clients, pipeline {PIPELINE}, {requests} requests, on {HELD} held \
         locks and as many PX strings, each family in a database of its own. ACQUIRE and SET run \
         first, on fresh keys; RENEW runs before RELEASE and leaves the locks held for it (and \
         for FENCE, asking about fence 1, and GET); DEL \
         runs on strings of its own, as the floor of any release. One run each, so single figures are noisy; \
         the shares are what to read. A group's µs per request = its share of the samples x the \
         run's server CPU per request (schedstat), so each command reads against its baseline in \
         the next column.\n"
    );
    out.push_str("| where |");
    for p in profiles {
        let _ = write!(out, " {} |", p.label);
    }
    out.push_str("\n|---|");
    for _ in profiles {
        out.push_str("---|");
    }
    out.push('\n');
    for (i, group) in GROUPS.iter().enumerate() {
        let _ = write!(out, "| {group} |");
        for p in profiles {
            let us = p.groups[i] / 100.0 * p.run.server_cpu_us;
            let _ = write!(out, " {us:.2} ({:.0}%) |", p.groups[i]);
        }
        out.push('\n');
    }
    out.push_str("| **server CPU µs/request** |");
    for p in profiles {
        let _ = write!(out, " **{:.2}** |", p.run.server_cpu_us);
    }
    out.push_str("\n| requests/s |");
    for p in profiles {
        let _ = write!(out, " {:.0} |", p.run.rps);
    }
    let cpu = |label: &str| {
        profiles
            .iter()
            .find(|p| p.label == label)
            .map(|p| p.run.server_cpu_us)
    };
    if let (Some(del), Some(script), Some(release)) = (
        cpu("DEL"),
        cpu("EVALSHA compare-and-delete"),
        cpu("LOCK.RELEASE"),
    ) {
        let _ = write!(
            out,
            "\n\nThe ceiling of any release: DEL, which deletes without looking, costs {del:.2} \
             µs against the compare-and-delete script's {script:.2}, so a release could be at \
             most {:.2}x the script in server CPU; LOCK.RELEASE costs {release:.2} µs here \
             ({:.2}x the script, {:.2} µs over DEL).",
            script / del,
            script / release,
            release - del
        );
    }
    out.push_str("\n\nTop symbols (share of the samples):\n\n");
    for p in profiles {
        let top: Vec<String> = p
            .top
            .iter()
            .map(|(share, symbol)| format!("{share:.1}% `{}`", short(symbol)))
            .collect();
        let _ = writeln!(out, "- {}: {}", p.label, top.join(", "));
    }
    out
}

/// A symbol without its Rust generic noise: `a::b::<impl ...>::c` keeps its last two parts.
fn short(symbol: &str) -> String {
    let (name, dso) = symbol.rsplit_once(" (").unwrap_or((symbol, ""));
    let name = if name.len() > 60 {
        let parts: Vec<&str> = name.split("::").collect();
        let tail = parts[parts.len().saturating_sub(2)..].join("::");
        format!("…{tail}")
    } else {
        name.to_string()
    };
    if dso.is_empty() {
        name
    } else {
        format!("{name} ({dso}")
    }
}
