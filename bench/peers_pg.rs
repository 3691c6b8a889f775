//! `make bench-peers-pg`: the module's `LOCK.ACQUIRE ... WAIT` against PostgreSQL's session-level
//! advisory locks (`pg_advisory_lock` / `pg_advisory_unlock`), one workload for both, driven by
//! Rust threads (one connection each) so the driver is not what sets the pace.
//!
//! - Contention: N workers (16 and 64) take turns on one lock, an empty critical section each
//!   turn: critical sections per second, handoff latency (the next holder's acquire returning,
//!   minus the previous holder's release being sent, on one monotonic clock), fairness (the
//!   longest wait, the fewest and most grants of a worker).
//! - Many waiters: 1,000 and 4,096 connections queued on one lock that one client holds: memory
//!   per waiter (the module: INFO used_memory; PostgreSQL: the PSS of all its processes), then
//!   the holder releases and every waiter is granted once in turn (the drain): its time, and
//!   the handoff per waiter.
//!
//! redis-server runs the release module (`$LOCK_MODULE`, the Makefile sets it) through the test
//! harness' guard; PostgreSQL is a private cluster: initdb into a temporary directory, then
//! `postgres -D dir -p port -k dir` on 127.0.0.1, run as the `postgres` user when the bench runs
//! as root, stopped (fast shutdown) at the end. Both servers are pinned to CPU 0 and the bench's
//! threads to CPU 1 (taskset) when the machine has two cores. The postgres binaries: `$PG_BIN`,
//! else `postgres` on PATH, else the newest /usr/lib/postgresql/*/bin.
//!
//! Writes the section "PostgreSQL advisory locks" of bench/results.md (between its markers,
//! leaving the rest of the file alone) and prints it; `BENCH_QUICK=1`: short rounds and smaller
//! crowds, into target/bench/peers-pg.md only.

#[path = "../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod util;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::{Conn, Reply, Server};
use util::{info_u64, median, micros, percentile, progress, Pinning};

pub const BEGIN: &str =
    "<!-- bench-peers-pg: begin. Written by `make bench-peers-pg` (bench/peers_pg.rs); do not edit by hand. -->";
pub const END: &str = "<!-- bench-peers-pg: end -->";

const KEY: &str = "bench:pg:lock";
/// The advisory lock's key (a bigint) on the PostgreSQL side.
const PG_KEY: i64 = 1;
/// Lease and wait of each contention acquire (the brief's workload).
const TTL: &str = "30000";
const WAIT: &str = "10000";
/// How long a queued waiter of the many-waiters run may wait (queueing 4,096 takes a while).
const DRAIN_WAIT: Duration = Duration::from_secs(300);
/// The largest crowd run with PostgreSQL's default `deadlock_timeout`: with 4,096 waiters
/// their deadlock checks kept the lock table busy for minutes (the bench's budget is 5).
const DEFAULT_DEADLOCK_MAX: usize = 1000;
/// How long the queue stands, from the last waiter queued to the holder's release.
const HOLD: Duration = Duration::from_millis(1500);
/// How long each queued waiter waits for its grant before it gives up (module: `WAIT`;
/// PostgreSQL: `lock_timeout`): bounds a drain that crawls.
const DRAIN_LIMIT_SECS: u64 = 60;
/// Stack of the many-waiters threads (thousands of them; each only blocks on a socket).
const WAITER_STACK: usize = 256 * 1024;

#[derive(Clone, Debug)]
struct Settings {
    quick: bool,
    rounds: usize,
    secs: f64,
    workers: Vec<usize>,
    waiters: Vec<usize>,
}

impl Settings {
    fn from_env() -> Settings {
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let waiters = std::env::var("BENCH_PG_WAITERS").ok().map(|v| {
            v.split(',')
                .map(|n| {
                    n.trim()
                        .parse()
                        .expect("BENCH_PG_WAITERS: numbers, comma-separated")
                })
                .collect::<Vec<usize>>()
        });
        let mut settings = if quick {
            Settings {
                quick,
                rounds: 1,
                secs: 1.0,
                workers: vec![16, 64],
                waiters: vec![100, 1000],
            }
        } else {
            Settings {
                quick,
                rounds: 3,
                secs: 4.0,
                workers: vec![16, 64],
                waiters: vec![1000, 4096],
            }
        };
        if let Some(waiters) = waiters {
            settings.waiters = waiters;
        }
        settings
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Module,
    Postgres,
    /// PostgreSQL with `deadlock_timeout` set to 10 minutes in the waiters' sessions: no
    /// deadlock check while they wait (many-waiters run only).
    PostgresLate,
}

impl System {
    fn label(self) -> &'static str {
        match self {
            System::Module => "module: `LOCK.ACQUIRE ... WAIT`",
            System::Postgres => "PostgreSQL: `pg_advisory_lock`",
            System::PostgresLate => "PostgreSQL, `deadlock_timeout` 10 min",
        }
    }
}

// --- The PostgreSQL cluster -------------------------------------------------------------------

/// A private PostgreSQL cluster in a temporary directory; stopped (fast shutdown) on drop.
struct Pg {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    version: String,
}

/// The directory of `initdb` and `postgres`.
fn pg_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return PathBuf::from(dir);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        if dir.join("postgres").is_file() && dir.join("initdb").is_file() {
            return dir;
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
                .filter(|bin| bin.join("postgres").is_file())
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().unwrap_or_else(|| {
        panic!("no postgres binary: apt-get install postgresql (make bench-peers-pg does), or set PG_BIN")
    })
}

/// The uid and gid the cluster runs as: `postgres`'s when the bench runs as root (postgres
/// refuses root), else none (the bench's own).
fn pg_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions; getpwnam gets a NUL-terminated name and its result
    // is read before any other call that could reuse its buffer.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let pw = libc::getpwnam(c"postgres".as_ptr());
        assert!(
            !pw.is_null(),
            "running as root and there is no postgres user to run the cluster as"
        );
        Some(((*pw).pw_uid, (*pw).pw_gid))
    }
}

fn as_pg_user(cmd: &mut Command, user: Option<(u32, u32)>) {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    // Should the bench die without its Drop (a kill), the server gets SIGINT: fast shutdown.
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec here.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT);
            Ok(())
        });
    }
}

impl Pg {
    fn start(pinning: &Pinning, max_connections: usize) -> Pg {
        let bin = pg_bin();
        let user = pg_user();
        let dir = tempfile::Builder::new()
            .prefix("bench-pg")
            .tempdir()
            .expect("temp dir");
        let data = dir.path().join("data");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown temp dir");
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .stdin(Stdio::null());
        as_pg_user(&mut initdb, user);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let version = Command::new(bin.join("postgres"))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let log = std::fs::File::create(dir.path().join("postgres.log")).expect("log file");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path().join("postgres.log"), Some(uid), Some(gid))
                .expect("chown log");
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
            l.local_addr().expect("local addr").port()
        };
        // Pinned at the start, so every backend it forks stays on the server core.
        let mut cmd = if pinning.enabled {
            let mut c = Command::new("taskset");
            c.args(["-c", &pinning.server_cpu.to_string()])
                .arg(bin.join("postgres"));
            c
        } else {
            Command::new(bin.join("postgres"))
        };
        cmd.arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .arg("-k")
            .arg(dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", &format!("max_connections={max_connections}")])
            // Nothing here writes data; durability settings only keep initdb's tables cheap.
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "shared_buffers=128MB"]);
        // More settings for a try: BENCH_PG_SETTINGS="deadlock_timeout=10s work_mem=8MB".
        for setting in std::env::var("BENCH_PG_SETTINGS")
            .unwrap_or_default()
            .split_whitespace()
        {
            cmd.args(["-c", setting]);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log);
        as_pg_user(&mut cmd, user);
        let child = cmd.spawn().expect("spawn postgres");
        let mut pg = Pg {
            dir,
            port,
            child: Some(child),
            version,
        };
        let start = Instant::now();
        loop {
            if pg.try_client().is_ok() {
                break;
            }
            let exited = pg
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            assert!(
                !exited && start.elapsed() < Duration::from_secs(60),
                "postgres did not start; log:\n{}",
                pg.log()
            );
            thread::sleep(Duration::from_millis(50));
        }
        pg
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    fn try_client(&self) -> Result<postgres::Client, postgres::Error> {
        postgres::Config::new()
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .connect(postgres::NoTls)
    }

    fn client(&self) -> postgres::Client {
        self.try_client().expect("connect to postgres")
    }

    /// The postmaster's pid (with taskset in front, taskset execs into postgres: same pid).
    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// PSS (kB) summed over the postmaster and every process it forked.
    fn pss_kb(&self) -> u64 {
        let postmaster = self.pid();
        let mut total = pss_of(postmaster);
        for pid in children_of(postmaster) {
            total += pss_of(pid);
        }
        total
    }

    fn processes(&self) -> usize {
        children_of(self.pid()).len() + 1
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGINT: fast shutdown (backends are told to end, the postmaster waits for them).
            common::signal("-INT", child.id());
            let start = Instant::now();
            while !matches!(child.try_wait(), Ok(Some(_))) {
                if start.elapsed() > Duration::from_secs(20) {
                    // SIGQUIT: immediate shutdown (the cluster is thrown away anyway).
                    eprintln!("bench-peers-pg: postgres did not stop within 20 s: SIGQUIT");
                    common::signal("-QUIT", child.id());
                    let _ = child.wait();
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The pids whose parent is `parent` (Linux /proc).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // pid (comm) state ppid ...: the comm may hold spaces, so after the last ')'.
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// A process's proportional set size in kB (/proc/<pid>/smaps_rollup), 0 when unreadable.
fn pss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

// --- Contention ---------------------------------------------------------------------------------

/// One connection's way of taking and giving back the lock.
trait Locker: Send {
    /// Blocks until granted (true) or the wait ran out (false).
    fn acquire(&mut self) -> bool;
    fn release(&mut self);
}

struct ModuleLocker {
    conn: Conn,
    id: usize,
    turn: u64,
    token: String,
}

impl Locker for ModuleLocker {
    fn acquire(&mut self) -> bool {
        self.turn += 1;
        self.token = format!("worker-{:02}-{}-6f1c2a9e", self.id, self.turn);
        match self
            .conn
            .call(&["LOCK.ACQUIRE", KEY, &self.token, TTL, "WAIT", WAIT])
        {
            Reply::Int(_) => true,
            Reply::Nil => false,
            other => panic!("LOCK.ACQUIRE: {other:?}"),
        }
    }

    fn release(&mut self) {
        let reply = self.conn.call(&["LOCK.RELEASE", KEY, &self.token]);
        assert_eq!(reply, Reply::Int(1), "LOCK.RELEASE");
    }
}

struct PgLocker {
    client: postgres::Client,
    lock: postgres::Statement,
    unlock: postgres::Statement,
}

impl PgLocker {
    fn new(mut client: postgres::Client) -> PgLocker {
        let lock = client
            .prepare(&format!("SELECT pg_advisory_lock({PG_KEY})"))
            .expect("prepare pg_advisory_lock");
        let unlock = client
            .prepare(&format!("SELECT pg_advisory_unlock({PG_KEY})"))
            .expect("prepare pg_advisory_unlock");
        PgLocker {
            client,
            lock,
            unlock,
        }
    }
}

impl Locker for PgLocker {
    fn acquire(&mut self) -> bool {
        self.client
            .execute(&self.lock, &[])
            .expect("pg_advisory_lock");
        true
    }

    fn release(&mut self) {
        let row = self
            .client
            .query_one(&self.unlock, &[])
            .expect("pg_advisory_unlock");
        assert!(row.get::<_, bool>(0), "pg_advisory_unlock: not held");
    }
}

/// What the workers share.
struct Shared {
    base: Instant,
    stop: AtomicBool,
    in_section: AtomicBool,
    /// When the last release was sent, ns since `base`, plus one (0: none yet).
    released_at: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64 + 1
    }
}

/// One worker's figures.
struct Worker {
    grants: u64,
    timeouts: u64,
    handoffs: Vec<Duration>,
    max_wait: Duration,
}

fn worker(mut locker: Box<dyn Locker>, shared: &Shared, ready: &Barrier) -> Worker {
    let mut w = Worker {
        grants: 0,
        timeouts: 0,
        handoffs: Vec::new(),
        max_wait: Duration::ZERO,
    };
    ready.wait();
    while !shared.stop.load(Ordering::SeqCst) {
        let asked = shared.now_ns();
        if !locker.acquire() {
            w.timeouts += 1;
            continue;
        }
        let at = shared.now_ns();
        let counting = !shared.stop.load(Ordering::SeqCst);
        let released = shared.released_at.load(Ordering::SeqCst);
        assert!(
            !shared.in_section.swap(true, Ordering::SeqCst),
            "two holders at once"
        );
        if counting {
            w.grants += 1;
            w.max_wait = w.max_wait.max(Duration::from_nanos(at - asked));
            if released != 0 {
                w.handoffs
                    .push(Duration::from_nanos(at.saturating_sub(released)));
            }
        }
        shared.in_section.store(false, Ordering::SeqCst);
        shared.released_at.store(shared.now_ns(), Ordering::SeqCst);
        locker.release();
    }
    w
}

/// One contention run's figures.
#[derive(Clone, Copy, Debug)]
struct Contended {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    max_wait_ms: f64,
    fewest: u64,
    most: u64,
    timeouts: u64,
}

fn contend(system: System, workers: usize, secs: f64, server: &Server, pg: &Pg) -> Contended {
    let shared = Arc::new(Shared {
        base: Instant::now(),
        stop: AtomicBool::new(false),
        in_section: AtomicBool::new(false),
        released_at: AtomicU64::new(0),
    });
    if system == System::Module {
        let mut conn = server.conn();
        assert_eq!(conn.call(&["FLUSHALL"]), Reply::status("OK"));
    }
    let ready = Arc::new(Barrier::new(workers + 1));
    let handles: Vec<_> = (0..workers)
        .map(|id| {
            let locker: Box<dyn Locker> = match system {
                System::Module => Box::new(ModuleLocker {
                    conn: Conn::connect(server.port, Duration::from_secs(60)).expect("connect"),
                    id,
                    turn: 0,
                    token: String::new(),
                }),
                System::Postgres | System::PostgresLate => Box::new(PgLocker::new(pg.client())),
            };
            let shared = Arc::clone(&shared);
            let ready = Arc::clone(&ready);
            thread::spawn(move || worker(locker, &shared, &ready))
        })
        .collect();
    ready.wait();
    let start = Instant::now();
    thread::sleep(Duration::from_secs_f64(secs));
    shared.stop.store(true, Ordering::SeqCst);
    let elapsed = start.elapsed().as_secs_f64();
    let results: Vec<Worker> = handles
        .into_iter()
        .map(|h| h.join().expect("worker"))
        .collect();
    let mut handoffs: Vec<Duration> = results.iter().flat_map(|w| w.handoffs.clone()).collect();
    handoffs.sort();
    let grants: u64 = results.iter().map(|w| w.grants).sum();
    Contended {
        per_sec: grants as f64 / elapsed,
        p50_us: micros(percentile(&handoffs, 0.50)),
        p99_us: micros(percentile(&handoffs, 0.99)),
        max_wait_ms: results
            .iter()
            .map(|w| w.max_wait)
            .max()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3,
        fewest: results.iter().map(|w| w.grants).min().unwrap_or(0),
        most: results.iter().map(|w| w.grants).max().unwrap_or(0),
        timeouts: results.iter().map(|w| w.timeouts).sum(),
    }
}

// --- Many waiters -------------------------------------------------------------------------------

/// One many-waiters run.
#[derive(Clone, Debug)]
struct Drained {
    waiters: usize,
    /// Memory per waiter (bytes): as an idle connection, and what queueing added.
    connected_per_waiter: f64,
    queued_per_waiter: f64,
    /// The module: client buffers' part of the total (INFO mem_clients_normal delta); NaN for
    /// PostgreSQL.
    client_buffers_per_waiter: f64,
    connect_secs: f64,
    queue_secs: f64,
    drain_ms: f64,
    per_waiter_us: f64,
    p50_us: f64,
    p99_us: f64,
    max_ms: f64,
    /// Consecutive grants (by the order the waiters asked) that came out of order.
    out_of_order: usize,
    /// Waiters whose wait ran out before their turn came.
    timed_out: usize,
    note: String,
}

/// A queued waiter's connection, handed to its thread once its acquire is sent.
enum Waiter {
    Module(Conn),
    /// The client and its backend's pid.
    Postgres(Box<postgres::Client>, i32),
}

struct Grant {
    asked: usize,
    at: u64,
    handoff: Duration,
    /// False: the wait ran out (DRAIN_LIMIT_SECS) first.
    granted: bool,
}

impl Grant {
    fn timed_out(asked: usize, at: u64) -> Grant {
        Grant {
            asked,
            at,
            handoff: Duration::ZERO,
            granted: false,
        }
    }
}

fn wait_until(what: &str, patience: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < patience, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

fn module_memory(conn: &mut Conn) -> (u64, u64) {
    (
        info_u64(conn, "memory", "used_memory"),
        info_u64(conn, "memory", "mem_clients_normal"),
    )
}

fn drain(system: System, waiters: usize, server: &Server, pg: &Pg) -> Drained {
    let shared = Arc::new(Shared {
        base: Instant::now(),
        stop: AtomicBool::new(false),
        in_section: AtomicBool::new(false),
        released_at: AtomicU64::new(0),
    });
    let mut note = String::new();
    // The holder, and a second connection that watches.
    let mut redis = server.conn();
    let mut pg_holder = None;
    let mut pg_watch = None;
    let (before, before_clients) = match system {
        System::Module => {
            assert_eq!(redis.call(&["FLUSHALL"]), Reply::status("OK"));
            let bound = waiters.max(1000).to_string();
            assert_eq!(
                redis.call(&["CONFIG", "SET", "lock.max-waiters", &bound]),
                Reply::status("OK")
            );
            let reply = redis.call(&["LOCK.ACQUIRE", KEY, "holder", "600000"]);
            assert!(reply.is_int(), "holder: {reply:?}");
            module_memory(&mut redis)
        }
        System::Postgres | System::PostgresLate => {
            let mut holder = pg.client();
            holder
                .execute(&format!("SELECT pg_advisory_lock({PG_KEY})"), &[])
                .expect("holder lock");
            pg_holder = Some(holder);
            pg_watch = Some(pg.client());
            (pg.pss_kb() * 1024, 0)
        }
    };

    // Connect every waiter (idle), then measure.
    let started = Instant::now();
    let mut conns = Vec::with_capacity(waiters);
    for i in 0..waiters {
        match system {
            System::Module => {
                let mut conn = Conn::connect(server.port, DRAIN_WAIT).expect("connect");
                assert_eq!(conn.call(&["PING"]), Reply::status("PONG"));
                conns.push(Waiter::Module(conn));
            }
            System::Postgres | System::PostgresLate => match pg.try_client() {
                Ok(mut client) => {
                    client
                        .simple_query(&format!("SET lock_timeout = '{DRAIN_LIMIT_SECS}s'"))
                        .expect("SET lock_timeout");
                    if system == System::PostgresLate {
                        client
                            .simple_query("SET deadlock_timeout = '10min'")
                            .expect("SET deadlock_timeout");
                    }
                    let pid: i32 = client
                        .query_one("SELECT pg_backend_pid()", &[])
                        .expect("pg_backend_pid")
                        .get(0);
                    conns.push(Waiter::Postgres(Box::new(client), pid));
                }
                Err(error) => {
                    let _ = write!(
                        note,
                        "connection {} of {waiters} refused: {error}; measured with {i}. ",
                        i + 1
                    );
                    break;
                }
            },
        }
    }
    let connected = conns.len();
    let connect_secs = started.elapsed().as_secs_f64();
    // Let postmaster and backends settle (a backend's pages are touched during its start).
    thread::sleep(Duration::from_millis(500));
    let (idle, idle_clients) = match system {
        System::Module => module_memory(&mut redis),
        System::Postgres | System::PostgresLate => (pg.pss_kb() * 1024, 0),
    };

    // Queue them, in order, each on a thread of its own that blocks until its grant.
    let started = Instant::now();
    let mut handles = Vec::with_capacity(connected);
    let pids: Vec<i32> = conns
        .iter()
        .map(|w| match w {
            Waiter::Postgres(_, pid) => *pid,
            Waiter::Module(_) => 0,
        })
        .collect();
    for (asked, waiter) in conns.into_iter().enumerate() {
        let shared = Arc::clone(&shared);
        let waiter = match waiter {
            Waiter::Module(mut conn) => {
                // Sent here, so the server sees the acquires in this order.
                conn.send(&[
                    "LOCK.ACQUIRE",
                    KEY,
                    &format!("waiter-{asked:05}-6f1c2a9e"),
                    TTL,
                    "WAIT",
                    &(DRAIN_LIMIT_SECS * 1000).to_string(),
                ]);
                Waiter::Module(conn)
            }
            other => other,
        };
        let handle = thread::Builder::new()
            .stack_size(WAITER_STACK)
            .spawn(move || {
                let token = format!("waiter-{asked:05}-6f1c2a9e");
                match waiter {
                    Waiter::Module(mut conn) => {
                        let reply = conn.read();
                        if reply == Reply::Nil {
                            let at = shared.now_ns();
                            let timed_out = Grant::timed_out(asked, at);
                            return (timed_out, Waiter::Module(conn));
                        }
                        assert!(reply.is_int(), "waiter {asked}: {reply:?}");
                        let at = shared.now_ns();
                        let released = shared.released_at.load(Ordering::SeqCst);
                        shared.released_at.store(shared.now_ns(), Ordering::SeqCst);
                        assert_eq!(conn.call(&["LOCK.RELEASE", KEY, &token]), Reply::Int(1));
                        (
                            Grant {
                                asked,
                                at,
                                handoff: Duration::from_nanos(at.saturating_sub(released)),
                                granted: true,
                            },
                            Waiter::Module(conn),
                        )
                    }
                    Waiter::Postgres(mut client, pid) => {
                        let locked =
                            client.simple_query(&format!("SELECT pg_advisory_lock({PG_KEY})"));
                        if let Err(error) = locked {
                            assert_eq!(
                                error.code(),
                                Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE),
                                "waiter {asked}: {error}"
                            );
                            let at = shared.now_ns();
                            let timed_out = Grant::timed_out(asked, at);
                            return (timed_out, Waiter::Postgres(client, pid));
                        }
                        let at = shared.now_ns();
                        let released = shared.released_at.load(Ordering::SeqCst);
                        shared.released_at.store(shared.now_ns(), Ordering::SeqCst);
                        client
                            .simple_query(&format!("SELECT pg_advisory_unlock({PG_KEY})"))
                            .expect("waiter unlock");
                        (
                            Grant {
                                asked,
                                at,
                                handoff: Duration::from_nanos(at.saturating_sub(released)),
                                granted: true,
                            },
                            Waiter::Postgres(client, pid),
                        )
                    }
                }
            })
            .expect("spawn a waiter thread");
        handles.push(handle);
    }
    // The order the server saw them ask in: the module's, the order sent (one thread sends
    // them all); PostgreSQL's, its backends' query_start (the waiters' threads race to send).
    let mut rank: Vec<usize> = (0..connected).collect();
    if system == System::Module {
        wait_until("module waiters", DRAIN_WAIT, || {
            info_u64(&mut redis, "clients", "blocked_clients") == connected as u64
        });
    } else {
        let watch = pg_watch.as_mut().expect("watch connection");
        wait_until("PostgreSQL waiters", DRAIN_WAIT, || {
            let row = watch
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                    &[],
                )
                .expect("pg_locks");
            row.get::<_, i64>(0) == connected as i64
        });
        let order: Vec<i32> = watch
            .query(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY($1) ORDER BY query_start, pid",
                &[&pids],
            )
            .expect("pg_stat_activity")
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(order.len(), connected, "waiters in pg_stat_activity");
        for (i, pid) in pids.iter().enumerate() {
            rank[i] = order
                .iter()
                .position(|p| p == pid)
                .expect("a waiter's backend");
        }
    }
    let queue_secs = started.elapsed().as_secs_f64();
    let all_queued = Instant::now();
    let (queued, queued_clients) = match system {
        System::Module => module_memory(&mut redis),
        System::Postgres | System::PostgresLate => (pg.pss_kb() * 1024, 0),
    };

    // The queue stands a while before the holder lets go: longer than PostgreSQL's default
    // deadlock_timeout, as a lock held for seconds would.
    thread::sleep(HOLD.saturating_sub(all_queued.elapsed()));
    // The drain: the holder lets go, every waiter is granted once in turn.
    let t0 = shared.now_ns();
    shared.released_at.store(t0, Ordering::SeqCst);
    match system {
        System::Module => assert_eq!(redis.call(&["LOCK.RELEASE", KEY, "holder"]), Reply::Int(1)),
        System::Postgres | System::PostgresLate => {
            let holder = pg_holder.as_mut().expect("holder");
            holder
                .execute(&format!("SELECT pg_advisory_unlock({PG_KEY})"), &[])
                .expect("holder unlock");
        }
    }
    let mut grants = Vec::with_capacity(connected);
    let mut timed_out = 0;
    let mut kept = Vec::with_capacity(connected);
    for handle in handles {
        let (mut grant, conn) = handle.join().expect("waiter thread");
        grant.asked = rank[grant.asked];
        if grant.granted {
            grants.push(grant);
        } else {
            timed_out += 1;
        }
        kept.push(conn);
    }
    let last = grants.iter().map(|g| g.at).max().unwrap_or(t0);
    drop(kept);
    grants.sort_by_key(|g| g.at);
    let out_of_order = grants
        .windows(2)
        .filter(|pair| pair[1].asked < pair[0].asked)
        .count();
    let mut handoffs: Vec<Duration> = grants.iter().map(|g| g.handoff).collect();
    handoffs.sort();
    let drain = Duration::from_nanos(last - t0);
    let n = connected.max(1) as f64;
    Drained {
        waiters: connected,
        connected_per_waiter: (idle as f64 - before as f64) / n,
        queued_per_waiter: (queued as f64 - idle as f64) / n,
        client_buffers_per_waiter: match system {
            System::Module => (queued_clients as f64 - before_clients as f64) / n,
            System::Postgres | System::PostgresLate => {
                let _ = idle_clients;
                f64::NAN
            }
        },
        connect_secs,
        queue_secs,
        drain_ms: drain.as_secs_f64() * 1e3,
        per_waiter_us: micros(drain) / grants.len().max(1) as f64,
        p50_us: micros(percentile(&handoffs, 0.50)),
        p99_us: micros(percentile(&handoffs, 0.99)),
        max_ms: handoffs.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        out_of_order,
        timed_out,
        note,
    }
}

// --- Report -------------------------------------------------------------------------------------

fn redis_version(server: &Server) -> String {
    server
        .info_field("server", "redis_version")
        .unwrap_or_else(|| "?".to_string())
}

/// Replaces the text between `BEGIN` and `END` in `old` (markers included) by `section`, or
/// appends it.
fn replace_section(old: &str, section: &str) -> String {
    match (old.find(BEGIN), old.find(END)) {
        (Some(start), Some(end)) if end > start => {
            format!("{}{section}{}", &old[..start], &old[end + END.len()..])
        }
        _ => {
            let mut new = old.trim_end().to_string();
            if !new.is_empty() {
                new.push_str("\n\n");
            }
            new.push_str(section);
            new.push('\n');
            new
        }
    }
}

fn kb(bytes: f64) -> String {
    if bytes.is_nan() {
        "-".to_string()
    } else {
        format!("{:.1}", bytes / 1024.0)
    }
}

fn main() {
    let started = Instant::now();
    let settings = Settings::from_env();
    let pinning = Pinning::setup();
    // Thousands of connections: raise the soft limit on open files to the hard one.
    // SAFETY: getrlimit/setrlimit with a valid resource and a valid struct.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
    let biggest = settings.waiters.iter().copied().max().unwrap_or(0);
    let max_connections = (biggest + 100).max(200);
    let server = pinning.server(util::bench_config().with("maxclients", "10000"));
    progress(started, "redis-server started");
    let pg = Pg::start(&pinning, max_connections);
    progress(
        started,
        &format!(
            "{} started on port {} (max_connections {max_connections})",
            pg.version, pg.port
        ),
    );

    // Contention: rounds interleave the rows, the order turning around every round.
    let mut rows: Vec<(System, usize, Vec<Contended>)> = Vec::new();
    for &n in &settings.workers {
        for system in [System::Module, System::Postgres] {
            rows.push((system, n, Vec::new()));
        }
    }
    for round in 0..settings.rounds {
        let count = rows.len();
        for i in 0..count {
            let at = if round % 2 == 0 { i } else { count - 1 - i };
            let (system, n, _) = rows[at];
            let run = contend(system, n, settings.secs, &server, &pg);
            progress(
                started,
                &format!(
                    "round {}: {} workers, {}: {:.0}/s, handoff p50 {:.1} µs",
                    round + 1,
                    n,
                    system.label(),
                    run.per_sec,
                    run.p50_us
                ),
            );
            rows[at].2.push(run);
        }
    }

    // Many waiters.
    let mut drains: Vec<(System, Drained)> = Vec::new();
    for &w in &settings.waiters {
        for system in [System::Module, System::Postgres, System::PostgresLate] {
            if system == System::Postgres && w > DEFAULT_DEADLOCK_MAX {
                continue;
            }
            let run = drain(system, w, &server, &pg);
            progress(
                started,
                &format!(
                    "{} waiters, {}: {} queued, drained in {:.1} ms (longest handoff {:.1} ms), {:.1} kB per waiter",
                    w,
                    system.label(),
                    run.waiters,
                    run.drain_ms,
                    run.max_ms,
                    (run.connected_per_waiter + run.queued_per_waiter) / 1024.0
                ),
            );
            drains.push((system, run));
        }
    }
    let pg_processes = pg.processes();

    // The report.
    let mut md = String::new();
    let _ = writeln!(md, "{BEGIN}\n\n## PostgreSQL advisory locks\n");
    let _ = writeln!(
        md,
        "Redis {} with the release module against {} (a private cluster: initdb into a \
         temporary directory, `fsync=off`, `shared_buffers=128MB`, `max_connections={max_connections}`), \
         both on 127.0.0.1, {}; {} cores. Driven by Rust threads, one connection each: the \
         module through the bench's RESP client, PostgreSQL through the `postgres` crate \
         (prepared statements; simple queries in the many-waiters run). {} round(s) of {:.0} s \
         per contention row, interleaved, medians; {:.0} s in all{}.\n",
        redis_version(&server),
        pg.version,
        pinning.describe().replace("redis-server pinned", "servers pinned"),
        pinning.cores,
        settings.rounds,
        settings.secs,
        started.elapsed().as_secs_f64(),
        if settings.quick {
            " (BENCH_QUICK: short runs, not for quoting)"
        } else {
            ""
        },
    );
    let _ = writeln!(md, "### Contention: N workers taking turns on one lock\n");
    let _ = writeln!(
        md,
        "| workers | system | critical sections/s | handoff p50 / p99 (µs) | longest wait (ms) | grants per worker: fewest / most | timed-out waits |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for (system, n, runs) in &rows {
        let m = |f: fn(&Contended) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        let _ = writeln!(
            md,
            "| {n} | {} | {:.0} | {:.1} / {:.1} | {:.1} | {:.0} / {:.0} | {:.0} |",
            system.label(),
            m(|r| r.per_sec),
            m(|r| r.p50_us),
            m(|r| r.p99_us),
            m(|r| r.max_wait_ms),
            m(|r| r.fewest as f64),
            m(|r| r.most as f64),
            m(|r| r.timeouts as f64),
        );
    }
    let _ = writeln!(
        md,
        "\nEach worker loops: acquire (module: `LOCK.ACQUIRE {KEY} <a new token> {TTL} WAIT {WAIT}`; \
         PostgreSQL: `SELECT pg_advisory_lock({PG_KEY})`), an empty critical section (a shared \
         flag proves no one else is inside), note the time, release (`LOCK.RELEASE`; \
         `SELECT pg_advisory_unlock({PG_KEY})`), and asks again at once. Handoff: the next \
         holder's acquire returning, minus the previous holder's release being sent, on one \
         monotonic clock. Longest wait: the longest any acquire took to return. Fewest / most: \
         the grants of the least and the most served worker in a round; a FIFO queue keeps them \
         within one of each other.\n"
    );
    let _ = writeln!(md, "### Many waiters on one held lock\n");
    let wait_ms = DRAIN_LIMIT_SECS * 1000;
    let hold_secs = HOLD.as_secs_f64();
    let _ = writeln!(
        md,
        "| waiters | system | memory per waiter: connection + queued (KiB) | of which queued | connect / queue all (s) | granted | drain (ms) | per grant (µs) | handoff p50 / p99 (µs), longest (ms) | grants out of queue order |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for (system, d) in &drains {
        let buffers = if d.client_buffers_per_waiter.is_nan() {
            String::new()
        } else {
            format!(" (client buffers {})", kb(d.client_buffers_per_waiter))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {}{buffers} | {} | {:.1} / {:.1} | {}{} | {:.1} | {:.1} | {:.1} / {:.1}, {:.1} | {} |",
            d.waiters,
            system.label(),
            kb(d.connected_per_waiter + d.queued_per_waiter),
            kb(d.queued_per_waiter),
            d.connect_secs,
            d.queue_secs,
            d.waiters - d.timed_out,
            if d.timed_out > 0 {
                format!(" ({} timed out after {DRAIN_LIMIT_SECS} s)", d.timed_out)
            } else {
                String::new()
            },
            d.drain_ms,
            d.per_waiter_us,
            d.p50_us,
            d.p99_us,
            d.max_ms,
            d.out_of_order,
        );
    }
    for (system, d) in &drains {
        if !d.note.is_empty() {
            let _ = writeln!(md, "\n{}: {}", system.label(), d.note.trim_end());
        }
    }
    let _ = writeln!(
        md,
        "\nOne client holds the lock; the waiters connect one by one (idle: memory measured), \
         then ask in order, each on a thread of its own (module: `LOCK.ACQUIRE ... WAIT`, \
         `lock.max-waiters` raised to fit; PostgreSQL: `SELECT pg_advisory_lock({PG_KEY})`) \
         and, once all are queued (INFO blocked_clients; pg_locks), memory is measured \
         again; the queue stands for {hold_secs:.1} s from the last waiter queued. Then the holder releases and each waiter, once granted, releases at once: the \
         drain runs from the holder's release to the last grant. Each waiter waits at most \
         {DRAIN_LIMIT_SECS} s (module: `WAIT {wait_ms}`; PostgreSQL: `lock_timeout = '{DRAIN_LIMIT_SECS}s'`); \
         granted: how many got their turn within that. Memory: the module, INFO \
         `used_memory` deltas (the client buffers' part from `mem_clients_normal`; the \
         connection's socket buffers are the kernel's, in neither); PostgreSQL, the PSS \
         (/proc/<pid>/smaps_rollup) summed over the postmaster and every process it forked \
         ({pg_processes} at the end), deltas: each connection is a backend process of its own. \
         Grants out of queue order: consecutive grants whose waiters asked in the other order \
         (the module: the order one thread sent the acquires in; PostgreSQL: the backends' \
         `query_start` in pg_stat_activity, stamped when the statement starts, a moment before \
         the backend joins the lock's queue, while the waiters' threads race to send: adjacent \
         pairs a few µs apart can swap without the queue being unfair).\n"
    );
    let _ = writeln!(
        md,
        "Why two PostgreSQL rows: a backend that has waited `deadlock_timeout` (1 s by default) \
         runs the deadlock check once, holding every partition of the lock table while it walks \
         the wait queue; with a thousand or more waiters queued for longer than that, those \
         checks stall every lock and unlock, and the drain with them (the queue stands longer than \
         `deadlock_timeout` here, so every waiter's check is due before the drain). With \
         4,096 waiters and the default the checks kept the lock table busy for minutes (one \
         run drained in 102 s, its longest handoff 54 s; others did not finish within 5 \
         minutes, the waiters' `lock_timeout` stuck behind the same checks), so that row runs \
         up to {DEFAULT_DEADLOCK_MAX} waiters only. The second row sets \
         `deadlock_timeout = '10min'` in the waiters' sessions (a superuser setting): the lock \
         manager alone. In the module's row, most of what queueing adds is Redis' own, not the \
         module's queue entry: `RM_BlockClient` creates a reply client for every blocked \
         client (a client structure with a 16 KiB reply buffer).\n"
    );
    md.push_str(WHAT_EACH_OFFERS);
    let _ = writeln!(md, "\n{END}");

    print!("{md}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = if settings.quick {
        let dir = root.join("target/bench");
        std::fs::create_dir_all(&dir).expect("create target/bench");
        dir.join("peers-pg.md")
    } else {
        root.join("bench/results.md")
    };
    let old = std::fs::read_to_string(&out).unwrap_or_default();
    std::fs::write(&out, replace_section(&old, md.trim_end())).expect("write results");
    drop(pg);
    drop(server);
    progress(
        started,
        &format!(
            "done; servers stopped; section written to {}",
            out.display()
        ),
    );
}

/// What each offers that the other does not (under the tables).
const WHAT_EACH_OFFERS: &str = "\
What each offers that the other does not:

- **Lease.** A module lock has a TTL: a holder that hangs or loses its network loses the lock
  when the lease ends. A PostgreSQL advisory lock has none: it is held until `pg_advisory_unlock`
  or until the session ends, so a holder stuck with its connection open (a paused process, a
  long GC, a wedged thread) holds it for as long as that lasts.
- **Fencing tokens.** Every module grant carries a fence that only grows (`LOCK.FENCE`), for a
  store to refuse a late write of a former holder. PostgreSQL returns nothing but `void`/`true`;
  a fence would be a sequence or a counter row the application adds and checks itself.
- **FIFO.** Both queue waiters in arrival order and grant in that order (PostgreSQL's lock
  manager grants the first compatible waiter on release): the fewest and most grants per worker
  above stay within one of each other on both, and the many-waiters drain shows the grants'
  order against the order asked.
- **Sessions.** A session-level advisory lock belongs to the server session (the backend), not
  to the client. Behind a transaction-pooling PgBouncer the session is the pooler's: the
  unlock may run on another server connection (it returns false, the lock stays held), and
  the next client handed the same server connection inherits the lock. Only
  `pg_advisory_xact_lock` (released at the transaction's end) works there, and then the lock
  cannot outlive one transaction. The module's lock belongs to a token, which any connection
  can present (and `SESSION` ties a hold to a connection when wanted).
- **Memory per waiter.** A module waiter is a blocked client: the connection's buffers plus a
  queue entry, a few KiB in all. A PostgreSQL waiter is a backend process (`max_connections`
  bounds the waiters; a pooler cannot multiplex a client that is blocked in a lock wait).
";
