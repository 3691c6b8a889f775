//! What every bench section shares: settings, statistics, CPU pinning, servers, Lua preloads,
//! INFO fields and the redis-benchmark runner.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Config, Conn, Reply, Server};

/// How big a run is: `BENCH_QUICK=1` makes every section small (a fast check, not for figures).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub quick: bool,
    /// Interleaved rounds of the single-command and scale rows.
    pub rounds: usize,
    /// Rounds of the contention section (each runs all four strategies).
    pub contention_rounds: usize,
    /// Requests per redis-benchmark run, pipeline 1 and pipeline 16.
    pub requests_p1: usize,
    pub requests_p16: usize,
    /// Locks (and strings) held while RENEW and FENCE run against random ones.
    pub held_keys: usize,
    /// Seconds each contention strategy runs per round.
    pub contention_secs: f64,
    /// One-waiter handoffs per round.
    pub handoff_rounds: usize,
    /// Locks per memory measurement.
    pub memory_locks: usize,
    /// The large side of the scale rows, and the mass expiry.
    pub scale_locks: usize,
    pub scale_small: usize,
    /// Fresh-key acquires per scale run (kept below what would make a 1M-key dict grow).
    pub scale_requests: usize,
    /// Interleaved rounds of the scale throughput rows.
    pub scale_rounds: usize,
    /// Seconds each acquire/release cycle variant runs per round (shared section).
    pub cycle_secs: f64,
    /// Rounds of the cycle variants, each round running all of them in rotating order.
    pub cycle_rounds: usize,
    /// Seconds of each readers-and-writers run, and its rounds (each runs both mixes).
    pub readers_writers_secs: f64,
    pub readers_writers_rounds: usize,
    /// Requests per redis-benchmark run of the 1000-client rows over 10k locks (single section).
    pub crowd_requests: usize,
}

impl Settings {
    pub fn from_env() -> Settings {
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        if quick {
            Settings {
                quick,
                rounds: 2,
                contention_rounds: 1,
                requests_p1: 8_000,
                requests_p16: 40_000,
                held_keys: 20_000,
                contention_secs: 0.6,
                handoff_rounds: 300,
                memory_locks: 20_000,
                scale_locks: 100_000,
                scale_small: 1_000,
                scale_requests: 20_000,
                scale_rounds: 2,
                cycle_secs: 0.4,
                cycle_rounds: 2,
                readers_writers_secs: 1.0,
                readers_writers_rounds: 1,
                crowd_requests: 10_000,
            }
        } else {
            Settings {
                quick,
                rounds: 9,
                contention_rounds: 3,
                requests_p1: 15_000,
                requests_p16: 75_000,
                held_keys: 100_000,
                contention_secs: 2.0,
                handoff_rounds: 2_000,
                memory_locks: 100_000,
                scale_locks: 1_000_000,
                scale_small: 1_000,
                scale_requests: 30_000,
                scale_rounds: 9,
                cycle_secs: 1.0,
                cycle_rounds: 5,
                readers_writers_secs: 3.0,
                readers_writers_rounds: 3,
                crowd_requests: 30_000,
            }
        }
    }
}

/// A 36-byte token (a UUID's length), the same for the module and its baselines.
pub const TOKEN: &str = "6f1c2a9e-4b7d-4e02-9a55-3c8d0f7b21e4";

pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Where the load runs: the bench pins itself (and so its threads and the redis-benchmark
/// processes it starts) to one core and every server it starts to another, when the machine
/// has two cores and `taskset` exists.
pub struct Pinning {
    /// CPUs this machine has (counted before the bench pins itself).
    pub cores: usize,
    pub enabled: bool,
    pub server_cpu: usize,
    pub client_cpu: usize,
}

impl Pinning {
    pub fn setup() -> Pinning {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let disabled = Pinning {
            cores,
            enabled: false,
            server_cpu: 0,
            client_cpu: 0,
        };
        if cores < 2 || std::env::var("BENCH_NO_PIN").is_ok_and(|v| !v.is_empty()) {
            return disabled;
        }
        let pinning = Pinning {
            cores,
            enabled: true,
            server_cpu: 0,
            client_cpu: 1,
        };
        if !taskset(std::process::id(), pinning.client_cpu) {
            return disabled;
        }
        pinning
    }

    /// Starts a server with the module and pins it (all its threads) to the server core.
    pub fn server(&self, config: Config) -> Server {
        let server = Server::start_with(config);
        if self.enabled && !taskset(server.pid(), self.server_cpu) {
            eprintln!(
                "bench: could not pin redis-server {} to CPU {}",
                server.pid(),
                self.server_cpu
            );
        }
        server
    }

    pub fn describe(&self) -> String {
        if self.enabled {
            format!(
                "redis-server pinned to CPU {}, load generators to CPU {} (taskset)",
                self.server_cpu, self.client_cpu
            )
        } else {
            "not pinned (fewer than 2 cores, no taskset, or BENCH_NO_PIN)".to_string()
        }
    }
}

/// Pins every thread of process `pid` to `cpu` (a warning when it cannot).
pub fn pin(pid: u32, cpu: usize) {
    if !taskset(pid, cpu) {
        eprintln!("bench: could not pin process {pid} to CPU {cpu}");
    }
}

/// `taskset -a -p -c cpu pid`: every thread of the process onto one CPU.
fn taskset(pid: u32, cpu: usize) -> bool {
    Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The default test-server configuration, as a benchmark server.
pub fn bench_config() -> Config {
    Config::default()
}

/// One field of INFO `section` as text.
pub fn info_field(conn: &mut Conn, section: &str, field: &str) -> Option<String> {
    let info = conn.call(&["INFO", section]).text();
    info.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

pub fn info_u64(conn: &mut Conn, section: &str, field: &str) -> u64 {
    info_field(conn, section, field)
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
        .parse()
        .unwrap_or_else(|_| panic!("INFO {field} is not an integer"))
}

pub fn flushall(conn: &mut Conn) {
    // SYNC: Valkey flushes in the background by default (lazyfree-lazy-user-flush yes).
    assert_eq!(conn.call(&["FLUSHALL", "SYNC"]), Reply::status("OK"));
}

/// `FLUSHDB` of the connection's database.
pub fn flushdb(conn: &mut Conn) {
    assert_eq!(conn.call(&["FLUSHDB", "SYNC"]), Reply::status("OK"));
}

pub fn select(conn: &mut Conn, db: usize) {
    assert_eq!(conn.call(&["SELECT", &db.to_string()]), Reply::status("OK"));
}

/// `SCRIPT LOAD`: the SHA1 for EVALSHA.
pub fn load_script(conn: &mut Conn, source: &str) -> String {
    conn.call(&["SCRIPT", "LOAD", source]).text()
}

/// The client-side Lua scripts that the module replaces (what redis-py, Redlock and Redisson
/// send), and the bench's own preload and cleanup scripts.
pub mod lua {
    /// Compare-and-delete: redis-py's `Lock.release`, Redlock's unlock.
    pub const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
         return redis.call('del', KEYS[1]) else return 0 end";
    /// Compare-and-delete plus a wake-up message to the waiters (Redisson's unlock).
    pub const RELEASE_PUBLISH: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
         redis.call('del', KEYS[1]); redis.call('publish', ARGV[2], '0'); return 1 \
         else return 0 end";
    /// Compare-and-PEXPIRE: redis-py's `Lock.extend(replace_ttl=True)`.
    pub const RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
         return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
    /// Preload: `LOCK.ACQUIRE prefix%012d token ttl` for i in [from, to). The key format is
    /// redis-benchmark's `__rand_int__` (12 digits, zero-padded).
    pub const PRELOAD_LOCKS: &str = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) - 1 do \
         redis.call('LOCK.ACQUIRE', ARGV[3] .. string.format('%012d', i), ARGV[4], ARGV[5]) \
         end return 1";
    /// Preload: `SET prefix%012d token PX ttl` for i in [from, to).
    pub const PRELOAD_STRINGS: &str = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) - 1 do \
         redis.call('SET', ARGV[3] .. string.format('%012d', i), ARGV[4], 'PX', ARGV[5]) \
         end return 1";
    /// `LOCK.RELEASE prefix%012d token` for i in [from, to).
    pub const RELEASE_LOCKS: &str = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) - 1 do \
         redis.call('LOCK.RELEASE', ARGV[3] .. string.format('%012d', i), ARGV[4]) \
         end return 1";
    /// Releases and unlinks every lock matching a pattern (scale cleanup); replies the count.
    pub const DROP_LOCKS: &str = "local ks = redis.call('KEYS', ARGV[1]) \
         for _, k in ipairs(ks) do redis.call('LOCK.RELEASE', k, ARGV[2]); \
         redis.call('UNLINK', k) end return #ks";
    /// Unlinks every key matching a pattern; replies the count.
    pub const DROP_KEYS: &str = "local ks = redis.call('KEYS', ARGV[1]) \
         for _, k in ipairs(ks) do redis.call('UNLINK', k) end return #ks";
}

/// Runs a `for i in [0, count)` preload script in batches of `batch` keys.
pub fn preload(
    conn: &mut Conn,
    sha: &str,
    prefix: &str,
    count: usize,
    batch: usize,
    mut tail: impl FnMut() -> Vec<String>,
) {
    let mut from = 0;
    while from < count {
        let to = (from + batch).min(count);
        let mut args = vec![
            "EVALSHA".to_string(),
            sha.to_string(),
            "0".to_string(),
            from.to_string(),
            to.to_string(),
            prefix.to_string(),
        ];
        args.extend(tail());
        let reply = conn.call(&args);
        assert_eq!(reply, Reply::Int(1), "preload {prefix}: {reply:?}");
        from = to;
    }
}

/// One redis-benchmark run's result.
#[derive(Clone, Copy, Debug)]
pub struct LoadRun {
    pub rps: f64,
    /// CPU time of the server's main thread per request (µs), from its schedstat; NaN where
    /// the kernel does not tell.
    pub server_cpu_us: f64,
}

/// Nanoseconds the main thread of `pid` has run on a CPU (Linux /proc schedstat).
pub fn cpu_ns(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// How long one redis-benchmark run may take before it is killed (the longest take seconds).
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// The soft limit on open files of this process (`ulimit -n`), which the redis-benchmark
/// processes it starts inherit: one file per client. None where /proc does not tell.
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        Some(u64::MAX)
    } else {
        soft.parse().ok()
    }
}

/// The redis-benchmark binary: `$REDIS_BENCHMARK` or `redis-benchmark` from PATH.
pub fn redis_benchmark_binary() -> String {
    std::env::var("REDIS_BENCHMARK").unwrap_or_else(|_| "redis-benchmark".to_string())
}

/// Checks that redis-benchmark runs; the message names the package when it does not.
pub fn check_redis_benchmark() -> Result<(), String> {
    match Command::new(redis_benchmark_binary())
        .arg("--version")
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err(format!(
            "{} not found: install redis-tools (Debian/Ubuntu) or set REDIS_BENCHMARK",
            redis_benchmark_binary()
        )),
    }
}

/// `redis-benchmark -c clients -n requests -P pipeline -r keyspace --csv command...` against
/// database 0 of the server, from the load core (the bench's own affinity is inherited).
pub fn redis_benchmark(
    server: &Server,
    clients: usize,
    requests: usize,
    pipeline: usize,
    keyspace: usize,
    command: &[&str],
) -> LoadRun {
    redis_benchmark_db(server, 0, clients, requests, pipeline, keyspace, command)
}

/// [`redis_benchmark`] against database `db`.
pub fn redis_benchmark_db(
    server: &Server,
    db: usize,
    clients: usize,
    requests: usize,
    pipeline: usize,
    keyspace: usize,
    command: &[&str],
) -> LoadRun {
    let cpu_before = cpu_ns(server.pid());
    let child = Command::new(redis_benchmark_binary())
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args(["-P", &pipeline.to_string(), "-r", &keyspace.to_string()])
        .args(["--dbnum", &db.to_string()])
        .arg("--csv")
        .args(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-benchmark");
    // Bounded: a run that hangs (a server that stopped answering, clients it refused) is killed
    // after RUN_LIMIT and the bench stops there (the Server guards stop the servers). Until the
    // waiter has collected it, the child's pid cannot be reused, so the kill hits only it.
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let out = child.wait_with_output();
        let _ = done.send(());
        out
    });
    let timed_out = finished.recv_timeout(RUN_LIMIT).is_err();
    if timed_out {
        crate::common::signal("-KILL", pid);
    }
    let out = waiter
        .join()
        .expect("redis-benchmark waiter")
        .expect("run redis-benchmark");
    assert!(
        !timed_out,
        "redis-benchmark {command:?} ({clients} clients, {requests} requests) did not finish \
         within {} s: killed",
        RUN_LIMIT.as_secs()
    );
    let cpu = match (cpu_before, cpu_ns(server.pid())) {
        (Some(before), Some(after)) => (after - before) as f64 / 1e3 / requests as f64,
        _ => f64::NAN,
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "redis-benchmark {command:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...: the rps.
    let row = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('"') && !l.starts_with("\"test\""))
        .unwrap_or_else(|| panic!("no CSV row from redis-benchmark {command:?}: {stdout}"));
    let fields: Vec<&str> = row.split("\",\"").map(|f| f.trim_matches('"')).collect();
    let number = |i: usize| -> f64 {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("bad redis-benchmark row {row}"))
    };
    LoadRun {
        rps: number(1),
        server_cpu_us: cpu,
    }
}

/// Runs the baseline (`run(false)`) and the module (`run(true)`) one after the other, module
/// first when `module_first`, and returns (baseline, module).
pub fn pair<T>(module_first: bool, mut run: impl FnMut(bool) -> T) -> (T, T) {
    if module_first {
        let m = run(true);
        let b = run(false);
        (b, m)
    } else {
        let b = run(false);
        let m = run(true);
        (b, m)
    }
}

/// Prints progress to stderr with the time since the bench started.
pub fn progress(started: Instant, text: &str) {
    eprintln!("[{:6.1}s] {text}", started.elapsed().as_secs_f64());
}

/// "met" / "MISSED" for a goal check.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}
