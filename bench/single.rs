//! Single commands under redis-benchmark (50 clients, pipelines 1 and 16) against what a client
//! sends without the module: ACQUIRE vs `SET NX PX`, RELEASE vs the compare-and-delete script
//! and RENEW vs the compare-and-PEXPIRE script through EVALSHA, FENCE vs GET. Where the server
//! has them (Valkey 9), RELEASE is also measured against `DELIFEQ` and RENEW against
//! `SET ... IFEQ ... PX`, the server's own compare-and-delete and compare-and-set. Each round runs
//! every pair back to back, baseline and module in alternating order; the ratio is the median
//! of the per-round ratios. Two more rows run ACQUIRE and RELEASE with 1000 clients over 10k
//! locks (`-c 1000 -r 10000`, pipeline 1), against the same baselines, on the plain server only.

use std::fmt::Write;
use std::time::Instant;

use crate::common::{Conn, Reply};
use crate::util::{
    self, flushdb, info_u64, load_script, lua, median, pair, preload, progress, redis_benchmark,
    redis_benchmark_db, select, verdict, Pinning, Settings, TOKEN,
};

const CLIENTS: usize = 50;
/// redis-benchmark's `-r` for fresh keys: collisions are rare at this range.
const FRESH_RANGE: usize = 1_000_000_000;
const TTL: &str = "60000";
/// The database of the held keys that RENEW and FENCE use.
const HELD_DB: usize = 1;
/// The crowd rows: this many redis-benchmark clients over this many locks (and strings).
const CROWD_CLIENTS: usize = 1_000;
const CROWD_KEYS: usize = 10_000;
const CROWD_ACQUIRE: &str = "LOCK.ACQUIRE (10k locks, 1000 clients)";
const CROWD_RELEASE: &str = "LOCK.RELEASE (10k locks, 1000 clients)";
/// The holder of the crowd ACQUIRE's preloaded locks: another client (same length as TOKEN).
const OTHER_TOKEN: &str = "0b7e5d1c-2f4a-4c9e-8d31-7a6f9e2c4b10";

/// One row: a module command against its baseline at one pipeline depth.
struct Row {
    name: &'static str,
    baseline: &'static str,
    pipeline: usize,
    /// redis-benchmark clients (CLIENTS, or CROWD_CLIENTS for the crowd rows).
    clients: usize,
    goal: Option<f64>,
    module: Vec<f64>,
    base: Vec<f64>,
    module_cpu: Vec<f64>,
    base_cpu: Vec<f64>,
}

impl Row {
    fn new(name: &'static str, baseline: &'static str, pipeline: usize, goal: Option<f64>) -> Row {
        Row {
            name,
            baseline,
            pipeline,
            clients: CLIENTS,
            goal,
            module: Vec::new(),
            base: Vec::new(),
            module_cpu: Vec::new(),
            base_cpu: Vec::new(),
        }
    }

    /// A crowd row: CROWD_CLIENTS clients, pipeline 1, no goal.
    fn crowd(name: &'static str, baseline: &'static str) -> Row {
        Row {
            clients: CROWD_CLIENTS,
            ..Row::new(name, baseline, 1, None)
        }
    }

    fn record(&mut self, base: util::LoadRun, module: util::LoadRun) {
        self.base.push(base.rps);
        self.module.push(module.rps);
        self.base_cpu.push(base.server_cpu_us);
        self.module_cpu.push(module.server_cpu_us);
    }

    /// Baseline CPU per request over the module's: above 1, the module costs the server less.
    fn cpu_ratio(&self) -> f64 {
        let ratios: Vec<f64> = self
            .base_cpu
            .iter()
            .zip(&self.module_cpu)
            .map(|(b, m)| b / m)
            .collect();
        median(&ratios)
    }

    fn ratio(&self) -> f64 {
        let ratios: Vec<f64> = self
            .module
            .iter()
            .zip(&self.base)
            .map(|(m, b)| m / b)
            .collect();
        median(&ratios)
    }
}

pub struct Outcome {
    pub table: String,
    pub goals: Vec<(String, bool)>,
}

/// The server's own conditional commands, probed (never assumed from a version).
struct Conditional {
    /// `DELIFEQ key value` (Valkey 9.0+).
    delifeq: bool,
    /// `SET key value IFEQ value` (Valkey 8.1+).
    set_ifeq: bool,
}

impl Conditional {
    fn probe(conn: &mut Conn) -> Conditional {
        let delifeq = conn.call(&["COMMAND", "INFO", "DELIFEQ"]).items()[0] != Reply::Nil;
        // On a missing key IFEQ sets nothing and replies nil; a server without it refuses.
        let set_ifeq = conn.call(&["SET", "bench:probe", "x", "IFEQ", "y"]) == Reply::Nil;
        Conditional { delifeq, set_ifeq }
    }
}

const DELIFEQ: &str = "DELIFEQ key token";
const SET_IFEQ: &str = "SET key token IFEQ token PX ttl";

/// What runs beside the measured server: nothing, one replica, or the AOF (appendonly yes,
/// fsync every second): what production runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Plain,
    Replica,
    Aof,
}

impl Setup {
    fn label(self) -> &'static str {
        match self {
            Setup::Plain => "no replica, no AOF",
            Setup::Replica => "1 replica",
            Setup::Aof => "appendonly yes",
        }
    }
}

/// The rows of one setup, and how many releases found their key held.
struct Measured {
    rows: Vec<Row>,
    release_hits: (u64, u64),
    baseline_hits: (u64, u64),
    /// The crowd rows' outcomes (plain setup only; Err: why they did not run).
    crowd: Option<Result<CrowdCounts, String>>,
    /// AOF bytes per request (the AOF setup only).
    aof_bytes: Option<AofBytes>,
}

/// What the crowd runs did, summed over the rounds: (requests with that outcome, requests).
#[derive(Default)]
struct CrowdCounts {
    /// LOCK.ACQUIREs that granted a free lock; that found it held by TOKEN and refreshed it;
    /// that were refused (held by OTHER_TOKEN).
    granted: (u64, u64),
    refreshed: (u64, u64),
    refused: (u64, u64),
    /// SET NX that set their key.
    set: (u64, u64),
    /// LOCK.RELEASEs that found their lock held; scripts that found their string.
    released: (u64, u64),
    deleted: (u64, u64),
}

/// Whether 1000 clients fit: the open-files limit redis-benchmark inherits, and the server's
/// maxclients (which redis-server lowers at start when its own open-files limit is short).
fn crowd_headroom(conn: &mut Conn) -> Result<(), String> {
    let files = CROWD_CLIENTS + 32;
    if let Some(limit) = util::open_files_limit().filter(|&l| l < files as u64) {
        return Err(format!(
            "the bench's open-files limit (ulimit -n) is {limit}, under the {files} that \
             redis-benchmark needs for {CROWD_CLIENTS} clients"
        ));
    }
    let reply = conn.call(&["CONFIG", "GET", "maxclients"]);
    let maxclients: usize = reply
        .items()
        .get(1)
        .and_then(|v| v.text().parse().ok())
        .unwrap_or_else(|| panic!("CONFIG GET maxclients: {reply:?}"));
    if maxclients < CROWD_CLIENTS + 8 {
        return Err(format!(
            "the server's maxclients is {maxclients} (lowered to its open-files limit), under \
             {CROWD_CLIENTS} clients and the bench's own"
        ));
    }
    Ok(())
}

pub fn run(settings: &Settings, pinning: &Pinning, started: Instant) -> Outcome {
    let plain = measure(settings, pinning, started, Setup::Plain);
    let others = [Setup::Replica, Setup::Aof]
        .map(|setup| (setup, measure(settings, pinning, started, setup)));
    let mut outcome = table(settings, &plain);
    let (table, goals) = setups_table(&plain, &others);
    outcome.table.push_str(&table);
    outcome.goals.extend(goals);
    outcome
}

fn measure(settings: &Settings, pinning: &Pinning, started: Instant, setup: Setup) -> Measured {
    let config = match setup {
        // Rewrites are kept out of the runs: off by themselves, started in `settle` instead.
        Setup::Aof => util::bench_config()
            .with("appendonly", "yes")
            .with("appendfsync", "everysec")
            .with("auto-aof-rewrite-percentage", "0"),
        Setup::Plain | Setup::Replica => util::bench_config(),
    };
    let server = pinning.server(config);
    // The replica runs beside the load generators (the measured server keeps its core).
    let replica = (setup == Setup::Replica).then(|| {
        let replica = crate::common::Server::start_with(util::bench_config());
        replica.replicate_from(&server);
        if pinning.enabled {
            util::pin(replica.pid(), pinning.client_cpu);
        }
        replica
    });
    let mut conn = server.conn();
    // The server's own conditional commands are compared once, without replica or AOF.
    let conditional = if setup == Setup::Plain {
        Conditional::probe(&mut conn)
    } else {
        Conditional {
            delifeq: false,
            set_ifeq: false,
        }
    };
    // Before each measured run: the replica has caught up with everything before it, and the
    // AOF has everything before it fsynced (under `always` a write makes Redis fsync at once, the
    // whole file), so a run never pays for the fsync of a preload or of the run before.
    let settle = |conn: &mut Conn| {
        if replica.is_some() {
            assert_eq!(conn.call(&["WAIT", "1", "60000"]), Reply::Int(1));
        }
        if setup == Setup::Aof {
            rewrite_when_large(conn);
            for command in [
                &["CONFIG", "SET", "appendfsync", "always"][..],
                &["SET", "bench:settle", "1"],
                &["CONFIG", "SET", "appendfsync", "everysec"],
            ] {
                assert!(!conn.call(command).is_error(), "{command:?}");
            }
        }
    };
    let release_sha = load_script(&mut conn, lua::RELEASE);
    let renew_sha = load_script(&mut conn, lua::RENEW);
    let locks_sha = load_script(&mut conn, lua::PRELOAD_LOCKS);
    let strings_sha = load_script(&mut conn, lua::PRELOAD_STRINGS);
    let shas = Shas {
        release: &release_sha,
        renew: &renew_sha,
        locks: &locks_sha,
        strings: &strings_sha,
    };
    // The crowd rows run on the plain server only (like the server's own conditionals).
    let mut crowd =
        (setup == Setup::Plain).then(|| crowd_headroom(&mut conn).map(|()| CrowdCounts::default()));
    if let Some(Err(why)) = &crowd {
        eprintln!("bench: the {CROWD_CLIENTS}-client rows are left out: {why}");
    }

    let mut rows: Vec<Row> = Vec::new();
    for pipeline in [1, 16] {
        rows.push(Row::new(
            "LOCK.ACQUIRE (fresh keys)",
            "SET key token NX PX ttl",
            pipeline,
            Some(0.95),
        ));
        rows.push(Row::new(
            "LOCK.RELEASE",
            "EVALSHA compare-and-delete",
            pipeline,
            Some(2.0),
        ));
        rows.push(Row::new(
            "LOCK.RENEW",
            "EVALSHA compare-and-PEXPIRE",
            pipeline,
            Some(2.0),
        ));
        rows.push(Row::new("LOCK.FENCE", "GET", pipeline, None));
        if conditional.delifeq {
            rows.push(Row::new("LOCK.RELEASE", DELIFEQ, pipeline, None));
        }
        if conditional.set_ifeq {
            rows.push(Row::new("LOCK.RENEW", SET_IFEQ, pipeline, None));
        }
    }
    if matches!(crowd, Some(Ok(_))) {
        rows.push(Row::crowd(CROWD_ACQUIRE, "SET key token NX PX ttl"));
        rows.push(Row::crowd(CROWD_RELEASE, "EVALSHA compare-and-delete"));
    }
    let requests = |pipeline: usize| {
        if pipeline == 1 {
            settings.requests_p1
        } else {
            settings.requests_p16
        }
    };
    let held = settings.held_keys;
    let mut release_hits = (0u64, 0u64);
    let mut baseline_hits = (0u64, 0u64);

    // RENEW and FENCE run on `held` locks (and as many strings), all held by TOKEN, in database
    // 1, loaded once: the other rows flush database 0 before each run.
    select(&mut conn, HELD_DB);
    preload(&mut conn, &locks_sha, "l:", held, 50_000, || {
        vec![TOKEN.into(), "3600000".into()]
    });
    preload(&mut conn, &strings_sha, "s:", held, 50_000, || {
        vec![TOKEN.into(), "3600000".into()]
    });
    settle(&mut conn);
    select(&mut conn, 0);
    for round in 0..settings.rounds {
        let module_first = round % 2 == 1;
        progress(
            started,
            &format!(
                "single commands ({}): round {}/{}",
                setup.label(),
                round + 1,
                settings.rounds
            ),
        );
        // ACQUIRE vs SET NX PX on fresh keys: an empty database before each run.
        for pipeline in [1, 16] {
            let n = requests(pipeline);
            let (b, m) = pair(module_first, |module| {
                flushdb(&mut conn);
                settle(&mut conn);
                if !module {
                    redis_benchmark(
                        &server,
                        CLIENTS,
                        n,
                        pipeline,
                        FRESH_RANGE,
                        &["SET", "s:__rand_int__", TOKEN, "NX", "PX", TTL],
                    )
                } else {
                    redis_benchmark(
                        &server,
                        CLIENTS,
                        n,
                        pipeline,
                        FRESH_RANGE,
                        &["LOCK.ACQUIRE", "l:__rand_int__", TOKEN, TTL],
                    )
                }
            });
            row(&mut rows, "SET key token NX PX ttl", pipeline).record(b, m);
        }

        // RENEW and FENCE on the held locks and strings in database 1.
        for pipeline in [1, 16] {
            let n = requests(pipeline);
            let (b, m) = pair(module_first, |module| {
                settle(&mut conn);
                if !module {
                    redis_benchmark_db(
                        &server,
                        HELD_DB,
                        CLIENTS,
                        n,
                        pipeline,
                        held,
                        &["EVALSHA", &renew_sha, "1", "s:__rand_int__", TOKEN, TTL],
                    )
                } else {
                    redis_benchmark_db(
                        &server,
                        HELD_DB,
                        CLIENTS,
                        n,
                        pipeline,
                        held,
                        &["LOCK.RENEW", "l:__rand_int__", TOKEN, TTL],
                    )
                }
            });
            row(&mut rows, "EVALSHA compare-and-PEXPIRE", pipeline).record(b, m);
            if conditional.set_ifeq {
                let (b, m) = pair(module_first, |module| {
                    settle(&mut conn);
                    let command: &[&str] = if module {
                        &["LOCK.RENEW", "l:__rand_int__", TOKEN, TTL]
                    } else {
                        &["SET", "s:__rand_int__", TOKEN, "IFEQ", TOKEN, "PX", TTL]
                    };
                    redis_benchmark_db(&server, HELD_DB, CLIENTS, n, pipeline, held, command)
                });
                row(&mut rows, SET_IFEQ, pipeline).record(b, m);
            }
            // The fence 1 is never current: every FENCE looks the lock up and replies 0.
            let (b, m) = pair(module_first, |module| {
                settle(&mut conn);
                if !module {
                    redis_benchmark_db(
                        &server,
                        HELD_DB,
                        CLIENTS,
                        n,
                        pipeline,
                        held,
                        &["GET", "s:__rand_int__"],
                    )
                } else {
                    redis_benchmark_db(
                        &server,
                        HELD_DB,
                        CLIENTS,
                        n,
                        pipeline,
                        held,
                        &["LOCK.FENCE", "l:__rand_int__", "1"],
                    )
                }
            });
            row(&mut rows, "GET", pipeline).record(b, m);
        }

        // RELEASE vs compare-and-delete (and DELIFEQ): 2n keys held by TOKEN, n releases of
        // random ones, so most requests find their key held (about 79%) and the rest find it
        // released.
        let baselines: &[&str] = if conditional.delifeq {
            &["EVALSHA compare-and-delete", DELIFEQ]
        } else {
            &["EVALSHA compare-and-delete"]
        };
        for pipeline in [1, 16] {
            let n = requests(pipeline);
            let keys = 2 * n;
            for &baseline in baselines {
                let (b, m) = pair(module_first, |module| {
                    flushdb(&mut conn);
                    if !module {
                        preload(&mut conn, &strings_sha, "s:", keys, 50_000, || {
                            vec![TOKEN.into(), "600000".into()]
                        });
                        settle(&mut conn);
                        let command: &[&str] = if baseline == DELIFEQ {
                            &["DELIFEQ", "s:__rand_int__", TOKEN]
                        } else {
                            &["EVALSHA", &release_sha, "1", "s:__rand_int__", TOKEN]
                        };
                        let result = redis_benchmark(&server, CLIENTS, n, pipeline, keys, command);
                        let left = conn.call(&["DBSIZE"]).int() as u64;
                        baseline_hits.0 += keys as u64 - left;
                        baseline_hits.1 += n as u64;
                        result
                    } else {
                        preload(&mut conn, &locks_sha, "l:", keys, 50_000, || {
                            vec![TOKEN.into(), "600000".into()]
                        });
                        settle(&mut conn);
                        let before = info_u64(&mut conn, "lock", "lock_released");
                        let result = redis_benchmark(
                            &server,
                            CLIENTS,
                            n,
                            pipeline,
                            keys,
                            &["LOCK.RELEASE", "l:__rand_int__", TOKEN],
                        );
                        release_hits.0 += info_u64(&mut conn, "lock", "lock_released") - before;
                        release_hits.1 += n as u64;
                        result
                    }
                });
                row(&mut rows, baseline, pipeline).record(b, m);
            }
        }

        // The crowd: 1000 clients, each request on one of 10k keys at random, pipeline 1.
        if let Some(Ok(counts)) = crowd.as_mut() {
            crowd_round(
                &server,
                &mut conn,
                counts,
                &mut rows,
                settings,
                module_first,
                &shas,
            );
        }
    }
    let aof_bytes = (setup == Setup::Aof).then(|| aof_bytes(&mut conn, &shas));
    drop(conn);
    drop(replica);
    drop(server);
    Measured {
        rows,
        release_hits,
        baseline_hits,
        crowd,
        aof_bytes,
    }
}

/// The AOF size past which `settle` rewrites it (Redis' own `auto-aof-rewrite-min-size`).
const REWRITE_ABOVE: u64 = 64 << 20;

/// Rewrites the AOF when it has grown past REWRITE_ABOVE, and waits for the rewrite to end: the
/// runs never share the server's core with a rewrite's child that a preload caused. (What a
/// command costs in rewrites follows from its AOF bytes, measured by `aof_bytes`.)
fn rewrite_when_large(conn: &mut Conn) {
    if info_u64(conn, "persistence", "aof_current_size") > REWRITE_ABOVE {
        assert!(!conn.call(&["BGREWRITEAOF"]).is_error(), "BGREWRITEAOF");
    }
    let deadline = Instant::now() + std::time::Duration::from_secs(120);
    while info_u64(conn, "persistence", "aof_rewrite_in_progress") != 0
        || info_u64(conn, "persistence", "aof_rewrite_scheduled") != 0
    {
        assert!(Instant::now() < deadline, "an AOF rewrite ran over 120 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// How many AOF bytes one request adds, module command and baseline, each on the key state its
/// run has: ACQUIRE / SET NX PX on a fresh key, RENEW / the PEXPIRE script on a held one,
/// RELEASE / the delete script on a held one. The same token, key length and ttl as the runs.
struct AofBytes {
    /// (module command, baseline) per command, in ACQUIRE, RENEW, RELEASE order.
    pairs: [(&'static str, f64, f64); 3],
}

fn aof_bytes(conn: &mut Conn, shas: &Shas<'_>) -> AofBytes {
    const N: usize = 1000;
    rewrite_when_large(conn);
    flushdb(conn);
    let mut measure = |command: &dyn Fn(usize) -> Vec<String>| {
        let before = info_u64(conn, "persistence", "aof_current_size");
        for i in 0..N {
            let args = command(i);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            assert!(!conn.call(&args).is_error(), "{args:?}");
        }
        (info_u64(conn, "persistence", "aof_current_size") - before) as f64 / N as f64
    };
    let lock = |i: usize| format!("l:{i:012}");
    let string = |i: usize| format!("s:{i:012}");
    let acquire = measure(&|i| vec!["LOCK.ACQUIRE".into(), lock(i), TOKEN.into(), TTL.into()]);
    let set = measure(&|i| {
        let [nx, px] = ["NX", "PX"].map(String::from);
        vec!["SET".into(), string(i), TOKEN.into(), nx, px, TTL.into()]
    });
    let renew = measure(&|i| vec!["LOCK.RENEW".into(), lock(i), TOKEN.into(), TTL.into()]);
    let renew_script = measure(&|i| {
        let sha = shas.renew.to_string();
        vec![
            "EVALSHA".into(),
            sha,
            "1".into(),
            string(i),
            TOKEN.into(),
            TTL.into(),
        ]
    });
    let release = measure(&|i| vec!["LOCK.RELEASE".into(), lock(i), TOKEN.into()]);
    let release_script = measure(&|i| {
        let sha = shas.release.to_string();
        vec!["EVALSHA".into(), sha, "1".into(), string(i), TOKEN.into()]
    });
    AofBytes {
        pairs: [
            ("LOCK.ACQUIRE vs SET key token NX PX ttl", acquire, set),
            (
                "LOCK.RENEW vs EVALSHA compare-and-PEXPIRE",
                renew,
                renew_script,
            ),
            (
                "LOCK.RELEASE vs EVALSHA compare-and-delete",
                release,
                release_script,
            ),
        ],
    }
}

/// The scripts the crowd runs use, loaded on the server.
struct Shas<'a> {
    release: &'a str,
    renew: &'a str,
    locks: &'a str,
    strings: &'a str,
}

/// One round of the crowd rows on database 0 (flushed before each run).
///
/// ACQUIRE (fixed token and ttl, as every redis-benchmark client sends the same command) starts
/// with the first half of the keys held by OTHER_TOKEN and the rest free: requests on the held
/// half are refused by both, the first on a free key is granted by both, and a repeat on a key
/// the run took is a refresh by the holder for LOCK.ACQUIRE (the lease restarts) and a refusal
/// for SET NX. RELEASE starts with every key held by TOKEN: the first request on a key releases
/// it, repeats find it released.
fn crowd_round(
    server: &crate::common::Server,
    conn: &mut Conn,
    counts: &mut CrowdCounts,
    rows: &mut [Row],
    settings: &Settings,
    module_first: bool,
    shas: &Shas<'_>,
) {
    let n = settings.crowd_requests;
    let run = |command: &[&str]| redis_benchmark(server, CROWD_CLIENTS, n, 1, CROWD_KEYS, command);
    let lease = || vec![OTHER_TOKEN.to_string(), "600000".to_string()];
    let (b, m) = pair(module_first, |module| {
        flushdb(conn);
        if !module {
            preload(conn, shas.strings, "s:", CROWD_KEYS / 2, 50_000, lease);
            let before = conn.call(&["DBSIZE"]).int() as u64;
            let result = run(&["SET", "s:__rand_int__", TOKEN, "NX", "PX", TTL]);
            counts.set.0 += conn.call(&["DBSIZE"]).int() as u64 - before;
            counts.set.1 += n as u64;
            result
        } else {
            preload(conn, shas.locks, "l:", CROWD_KEYS / 2, 50_000, lease);
            let held = info_u64(conn, "lock", "lock_held");
            let acquired = info_u64(conn, "lock", "lock_acquired");
            let contended = info_u64(conn, "lock", "lock_acquire_contended");
            let result = run(&["LOCK.ACQUIRE", "l:__rand_int__", TOKEN, TTL]);
            // New holds raise lock_held; refreshes by the holder count in lock_acquired only.
            let granted = info_u64(conn, "lock", "lock_held") - held;
            let grants = info_u64(conn, "lock", "lock_acquired") - acquired;
            counts.granted.0 += granted;
            counts.refreshed.0 += grants - granted;
            counts.refused.0 += info_u64(conn, "lock", "lock_acquire_contended") - contended;
            for outcome in [
                &mut counts.granted,
                &mut counts.refreshed,
                &mut counts.refused,
            ] {
                outcome.1 += n as u64;
            }
            result
        }
    });
    row_of(rows, "SET key token NX PX ttl", 1, CROWD_CLIENTS).record(b, m);

    let mine = || vec![TOKEN.to_string(), "600000".to_string()];
    let (b, m) = pair(module_first, |module| {
        flushdb(conn);
        if !module {
            preload(conn, shas.strings, "s:", CROWD_KEYS, 50_000, mine);
            let result = run(&["EVALSHA", shas.release, "1", "s:__rand_int__", TOKEN]);
            counts.deleted.0 += CROWD_KEYS as u64 - conn.call(&["DBSIZE"]).int() as u64;
            counts.deleted.1 += n as u64;
            result
        } else {
            preload(conn, shas.locks, "l:", CROWD_KEYS, 50_000, mine);
            let before = info_u64(conn, "lock", "lock_released");
            let result = run(&["LOCK.RELEASE", "l:__rand_int__", TOKEN]);
            counts.released.0 += info_u64(conn, "lock", "lock_released") - before;
            counts.released.1 += n as u64;
            result
        }
    });
    row_of(rows, "EVALSHA compare-and-delete", 1, CROWD_CLIENTS).record(b, m);
}

/// The full table of the plain setup, with the goals.
fn table(settings: &Settings, measured: &Measured) -> Outcome {
    let Measured {
        rows,
        release_hits,
        baseline_hits,
        crowd,
        aof_bytes: _,
    } = measured;
    let held = settings.held_keys;
    let mut table = String::new();
    let mut goals = Vec::new();
    let _ = writeln!(
        table,
        "### Single commands\n\nredis-benchmark, {CLIENTS} clients, requests per run: {} (pipeline 1) / \
         {} (pipeline 16); median of {} interleaved rounds (rps: median run; ratio: median of the \
         per-round ratios).\n",
        settings.requests_p1, settings.requests_p16, settings.rounds
    );
    let _ = writeln!(
        table,
        "| command | baseline | pipeline | module rps | baseline rps | ratio | goal | server CPU µs/req module / baseline | CPU ratio (goal at pipeline 16: >= 1.00x) |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let ratio = row.ratio();
        let goal = match row.goal {
            Some(goal) => {
                let met = ratio >= goal;
                goals.push((
                    format!(
                        "{} vs {} (pipeline {})",
                        row.name, row.baseline, row.pipeline
                    ),
                    met,
                ));
                format!(">= {goal:.2}x: {}", verdict(met))
            }
            None => "-".to_string(),
        };
        // Each command's server CPU per request against its baseline's, where the socket work
        // of one request per round trip does not hide it.
        let cpu_ratio = row.cpu_ratio();
        let cpu = if row.pipeline == 16
            && row.clients == CLIENTS
            && ![DELIFEQ, SET_IFEQ].contains(&row.baseline)
        {
            let met = cpu_ratio >= 1.0;
            goals.push((
                format!(
                    "{} server CPU per request <= {}'s (pipeline 16)",
                    row.name, row.baseline
                ),
                met,
            ));
            format!("{cpu_ratio:.2}x: {}", verdict(met))
        } else {
            format!("{cpu_ratio:.2}x")
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {:.0} | {:.0} | {:.2}x | {} | {:.2} / {:.2} | {} |",
            row.name,
            row.baseline,
            row.pipeline,
            median(&row.module),
            median(&row.base),
            ratio,
            goal,
            median(&row.module_cpu),
            median(&row.base_cpu),
            cpu
        );
    }
    let _ = writeln!(
        table,
        "\nKeys are `l:`/`s:` + 12 digits; token {} bytes, ttl {TTL} ms. RENEW and FENCE run on {} \
         held locks (and as many strings); FENCE asks about fence 1, never current, so it replies \
         0 after the lookup, as GET does its lookup. RELEASE runs on twice as many held keys as \
         requests: {:.0}% of LOCK.RELEASEs found their lock held ({:.0}% of the scripts found their \
         string), the rest hit an already released one. Server CPU: the redis-server main thread's \
         CPU time (schedstat) per request during the run; CPU ratio = baseline / module, so above \
         1 the module costs the server less. At pipeline 1 the round trip and the socket calls \
         dominate both sides.",
        TOKEN.len(),
        held,
        100.0 * release_hits.0 as f64 / release_hits.1.max(1) as f64,
        100.0 * baseline_hits.0 as f64 / baseline_hits.1.max(1) as f64,
    );
    let percent = |(hits, of): (u64, u64)| 100.0 * hits as f64 / of.max(1) as f64;
    match crowd {
        Some(Ok(counts)) => {
            let _ = writeln!(
                table,
                "\nThe rows with {CROWD_CLIENTS} clients (on this server only, not in the replica \
                 and AOF table): redis-benchmark `-c {CROWD_CLIENTS} -r {CROWD_KEYS}`, pipeline 1, \
                 {} requests per run, so {CROWD_CLIENTS} connections are open and each request \
                 names one of {CROWD_KEYS} keys at random; each run's database holds only its \
                 preload. ACQUIRE (one token and ttl for all, as redis-benchmark sends one \
                 command) starts with {} of the {CROWD_KEYS} keys (50%) held by another token and \
                 the rest free: {:.0}% of the LOCK.ACQUIREs granted a free lock, {:.0}% found it \
                 already held by their own token and refreshed its lease (what a retry gets; SET \
                 NX refuses these), {:.0}% were refused; {:.0}% of the SET NX set their key. \
                 RELEASE starts with all {CROWD_KEYS} keys (100%) held by the token: {:.0}% of the \
                 LOCK.RELEASEs found their lock held ({:.0}% of the scripts found their string), \
                 the rest one that the run had released. Their server CPU per request also \
                 counts accepting and closing the run's {CROWD_CLIENTS} connections.",
                settings.crowd_requests,
                CROWD_KEYS / 2,
                percent(counts.granted),
                percent(counts.refreshed),
                percent(counts.refused),
                percent(counts.set),
                percent(counts.released),
                percent(counts.deleted),
            );
        }
        Some(Err(why)) => {
            let _ = writeln!(
                table,
                "\nThe rows with {CROWD_CLIENTS} clients over {CROWD_KEYS} locks did not run: {why}."
            );
        }
        None => {}
    }
    Outcome { table, goals }
}

/// The four ratios (and their CPU ratios) with a replica attached and with the AOF on, beside
/// the plain ones: each setup has its own baselines, measured on the same server.
fn setups_table(
    plain: &Measured,
    others: &[(Setup, Measured); 2],
) -> (String, Vec<(String, bool)>) {
    let mut table = String::new();
    // Per setup: the rows at or above SETUP_GOAL, and all rows.
    let mut tally = [(0, 0); 2];
    let _ = writeln!(
        table,
        "\n#### With a replica, with the AOF\n\nThe same runs on a server with one replica \
         attached (the replica on the load generators' core; before each run, WAIT for it), and \
         on a server with `appendonly yes` (`appendfsync everysec`; before each run, everything \
         written so far is fsynced, by one write under `appendfsync always`, so that a run never \
         pays for the fsync of its preload or of the run before; automatic AOF rewrites are off \
         and the AOF is rewritten before a run when it has grown past 64 MB, the default \
         `auto-aof-rewrite-min-size`, so that no run shares the server's core with a rewrite \
         its preload caused: what a command costs in rewrites follows from its AOF bytes, in \
         the table after this one). Ratio = module / baseline on that server; CPU ratio as \
         above.\n"
    );
    let _ = writeln!(
        table,
        "| command | baseline | pipeline | {} | {} | {} |",
        Setup::Plain.label(),
        others[0].0.label(),
        others[1].0.label()
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|");
    for row in &plain.rows {
        let mut cell = |i: usize| {
            let r = others[i].1.rows.iter().find(|r| {
                r.baseline == row.baseline && r.pipeline == row.pipeline && r.clients == row.clients
            })?;
            let met = r.ratio() >= SETUP_GOAL;
            tally[i].0 += usize::from(met);
            tally[i].1 += 1;
            Some(format!(
                "{:.2}x (CPU {:.2}x){}",
                r.ratio(),
                r.cpu_ratio(),
                if met { "" } else { ": MISSED" }
            ))
        };
        let (Some(replica), Some(aof)) = (cell(0), cell(1)) else {
            continue;
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {:.2}x (CPU {:.2}x) | {replica} | {aof} |",
            row.name,
            row.baseline,
            row.pipeline,
            row.ratio(),
            row.cpu_ratio()
        );
    }
    if let Some(bytes) = others.iter().find_map(|(_, m)| m.aof_bytes.as_ref()) {
        let _ = writeln!(
            table,
            "\nAOF bytes per request, measured on the AOF server after the rounds (1000 \
             requests each, the growth of `aof_current_size`; keys, token and ttl as in the \
             runs): the module writes each change as its effect (`LOCK.APPLY`, the whole \
             resulting state), a script its own effects (`PEXPIREAT`, `DEL`).\n\n\
             | commands | module B | baseline B | ratio |\n|---|---|---|---|"
        );
        for (name, module, baseline) in bytes.pairs {
            let _ = writeln!(
                table,
                "| {name} | {module:.1} | {baseline:.1} | {:.2}x |",
                module / baseline
            );
        }
    }
    let goals = others
        .iter()
        .zip(tally)
        .map(|((setup, _), (met, all))| {
            (
                format!(
                    "every single-command row with {} >= {SETUP_GOAL:.2}x the baseline \
                     ({met} of {all})",
                    setup.label()
                ),
                met == all,
            )
        })
        .collect();
    (table, goals)
}

/// The goal of every single-command row with a replica and with the AOF: module / baseline.
const SETUP_GOAL: f64 = 1.0;

/// The row of `baseline` (each baseline names one row per pipeline).
fn row<'a>(rows: &'a mut [Row], baseline: &str, pipeline: usize) -> &'a mut Row {
    row_of(rows, baseline, pipeline, CLIENTS)
}

/// The row of `baseline` at `pipeline` with `clients` clients.
fn row_of<'a>(rows: &'a mut [Row], baseline: &str, pipeline: usize, clients: usize) -> &'a mut Row {
    rows.iter_mut()
        .find(|r| r.baseline == baseline && r.pipeline == pipeline && r.clients == clients)
        .expect("row")
}
