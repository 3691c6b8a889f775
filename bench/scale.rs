//! Scale: acquire throughput with many existing locks against few, and many leases that run
//! out at the same moment (how long until all are freed and announced, and how long the event
//! loop stalls meanwhile).

use std::fmt::Write;
use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{Conn, Reply, PATIENCE};
use crate::util::{
    self, info_u64, load_script, lua, median, pair, preload, progress, redis_benchmark, verdict,
    Pinning, Settings, TOKEN,
};

const CLIENTS: usize = 50;
const PIPELINE: usize = 16;
const FRESH_RANGE: usize = 1_000_000_000;

pub struct Outcome {
    pub table: String,
    pub goals: Vec<(String, bool)>,
}

fn count_label(n: usize) -> String {
    if n >= 1_000_000 && n % 1_000_000 == 0 {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n % 1_000 == 0 {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

pub fn run(settings: &Settings, pinning: &Pinning, started: Instant) -> Outcome {
    let mut table = String::new();
    let mut goals = Vec::new();
    acquire_at_scale(settings, pinning, started, &mut table, &mut goals);
    mass_expiry(settings, pinning, started, &mut table, &mut goals);
    Outcome { table, goals }
}

/// Fresh-key ACQUIRE (and, for reference, SET NX PX) throughput on a server holding
/// `scale_locks` locks against one holding `scale_small`, both started here, measured in
/// alternating order; after each run the fresh keys are released and unlinked so both servers
/// go back to their sizes.
fn acquire_at_scale(
    settings: &Settings,
    pinning: &Pinning,
    started: Instant,
    table: &mut String,
    goals: &mut Vec<(String, bool)>,
) {
    let (big_n, small_n) = (settings.scale_locks, settings.scale_small);
    progress(
        started,
        &format!(
            "scale: preloading {} and {} locks",
            count_label(big_n),
            count_label(small_n)
        ),
    );
    let small = pinning.server(util::bench_config());
    let big = pinning.server(util::bench_config());
    let mut conns = Vec::new();
    for (server, n) in [(&small, small_n), (&big, big_n)] {
        let mut conn = server.conn();
        let sha = load_script(&mut conn, lua::PRELOAD_LOCKS);
        preload(&mut conn, &sha, "held:", n, 50_000, || {
            vec![TOKEN.into(), "3600000".into()]
        });
        let drop_locks = load_script(&mut conn, lua::DROP_LOCKS);
        let drop_keys = load_script(&mut conn, lua::DROP_KEYS);
        conns.push((conn, server, drop_locks, drop_keys));
    }
    let n = settings.scale_requests;
    let (mut acquire, mut set) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    let (mut acquire_cpu, mut set_cpu) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    let mut run_on = |which: usize, module: bool| -> (f64, f64) {
        let (conn, server, drop_locks, drop_keys) = &mut conns[which];
        let command: &[&str] = if module {
            &["LOCK.ACQUIRE", "fresh:__rand_int__", TOKEN, "60000"]
        } else {
            &["SET", "fresh:__rand_int__", TOKEN, "NX", "PX", "60000"]
        };
        let run = redis_benchmark(server, CLIENTS, n, PIPELINE, FRESH_RANGE, command);
        let (sha, extra) = if module {
            (drop_locks.as_str(), vec![TOKEN])
        } else {
            (drop_keys.as_str(), vec![])
        };
        let mut args = vec!["EVALSHA", sha, "0", "fresh:*"];
        args.extend(extra);
        assert!(matches!(conn.call(&args), Reply::Int(_)));
        (run.rps, run.server_cpu_us)
    };
    for round in 0..settings.scale_rounds {
        progress(
            started,
            &format!(
                "scale: acquire round {}/{}",
                round + 1,
                settings.scale_rounds
            ),
        );
        let big_first = round % 2 == 1;
        let (s, b) = pair(big_first, |big| run_on(usize::from(big), true));
        acquire.0.push(s.0);
        acquire.1.push(b.0);
        acquire_cpu.0.push(s.1);
        acquire_cpu.1.push(b.1);
        let (s, b) = pair(big_first, |big| run_on(usize::from(big), false));
        set.0.push(s.0);
        set.1.push(b.0);
        set_cpu.0.push(s.1);
        set_cpu.1.push(b.1);
    }
    let lock_held = |conn: &mut Conn| info_u64(conn, "lock", "lock_held");
    let held_now = (lock_held(&mut conns[0].0), lock_held(&mut conns[1].0));
    drop(conns);
    drop(small);
    drop(big);

    let ratio = |(s, b): &(Vec<f64>, Vec<f64>)| -> f64 {
        let r: Vec<f64> = b.iter().zip(s).map(|(b, s)| b / s).collect();
        median(&r)
    };
    let acquire_ratio = ratio(&acquire);
    let met = acquire_ratio >= 0.9;
    goals.push((
        format!(
            "acquire with {} locks >= 0.9x with {}",
            count_label(big_n),
            count_label(small_n)
        ),
        met,
    ));
    let _ = writeln!(
        table,
        "### Scale: acquire with {} existing locks\n\nTwo servers, one holding {} locks and one \
         {}; redis-benchmark {CLIENTS} clients, pipeline {PIPELINE}, {n} fresh-key requests per \
         run, servers in alternating order, median of {} rounds; the fresh keys are released and \
         unlinked after each run. SET NX PX on the same two servers shows what Redis' own \
         keyspace costs at that size.\n",
        count_label(big_n),
        count_label(big_n),
        count_label(small_n),
        settings.scale_rounds
    );
    let _ = writeln!(
        table,
        "| command | rps with {} | rps with {} | ratio | goal | server CPU µs/req with {} / {} | CPU ratio |",
        count_label(big_n),
        count_label(small_n),
        count_label(big_n),
        count_label(small_n)
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|");
    // CPU ratio: small's CPU per request over big's (above 1: cheaper with many locks).
    let cpu_ratio = |(s, b): &(Vec<f64>, Vec<f64>)| -> f64 {
        let r: Vec<f64> = s.iter().zip(b).map(|(s, b)| s / b).collect();
        median(&r)
    };
    let _ = writeln!(
        table,
        "| LOCK.ACQUIRE (fresh keys) | {:.0} | {:.0} | {:.2}x | >= 0.90x: {} | {:.2} / {:.2} | {:.2}x |",
        median(&acquire.1),
        median(&acquire.0),
        acquire_ratio,
        verdict(met),
        median(&acquire_cpu.1),
        median(&acquire_cpu.0),
        cpu_ratio(&acquire_cpu)
    );
    let _ = writeln!(
        table,
        "| SET NX PX (reference) | {:.0} | {:.0} | {:.2}x | - | {:.2} / {:.2} | {:.2}x |",
        median(&set.1),
        median(&set.0),
        ratio(&set),
        median(&set_cpu.1),
        median(&set_cpu.0),
        cpu_ratio(&set_cpu)
    );
    let _ = writeln!(
        table,
        "\n(locks held at the end: {} and {})\n",
        held_now.1, held_now.0
    );
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Counts keyevent messages of `channel` as fast as they come: scans the raw stream for the
/// `message` element of each pub/sub message (the key names here never contain it).
fn count_events(
    port: u16,
    channel: &'static str,
    target: u64,
    until: Instant,
    count: Arc<AtomicU64>,
    subscribed: Arc<AtomicBool>,
) -> Option<Instant> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let subscribe = format!(
        "*2\r\n$9\r\nSUBSCRIBE\r\n${}\r\n{channel}\r\n",
        channel.len()
    );
    std::io::Write::write_all(&mut stream, subscribe.as_bytes()).expect("subscribe");
    let needle: &[u8] = b"\r\nmessage\r\n";
    let mut buf = vec![0u8; 1 << 16];
    let mut carry: Vec<u8> = Vec::new();
    let mut seen = 0u64;
    let mut confirmed = false;
    while Instant::now() < until {
        let read = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(read) => read,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => panic!("subscriber: {e}"),
        };
        carry.extend_from_slice(&buf[..read]);
        if !confirmed && carry.windows(9).any(|w| w == b"subscribe") {
            confirmed = true;
            subscribed.store(true, Ordering::SeqCst);
        }
        seen += carry.windows(needle.len()).filter(|w| *w == needle).count() as u64;
        let keep = carry.len().min(needle.len() - 1);
        carry.drain(..carry.len() - keep);
        count.store(seen, Ordering::SeqCst);
        if seen >= target {
            return Some(Instant::now());
        }
    }
    None
}

/// What one mass expiry showed.
struct Expiry {
    /// After the deadline: nothing held (locks) / no key left (strings).
    freed: Option<Duration>,
    /// After the deadline: the subscriber had every expiry event.
    announced: Option<Duration>,
    events: u64,
    /// PING round trips from 100 ms before the deadline to the end.
    busy: Probes,
    /// PING round trips in the idle 1.2 s before that.
    idle: Probes,
    preload_left: Duration,
    /// The server main thread's CPU time from the deadline until all were freed (schedstat).
    busy_cpu: Option<Duration>,
    expired_counter: u64,
    latency_events: Vec<String>,
}

struct Probes {
    max: Duration,
    p99: Duration,
    over_10ms: usize,
    count: usize,
}

impl Probes {
    fn of(mut w: Vec<Duration>) -> Probes {
        w.sort();
        Probes {
            max: w.last().copied().unwrap_or_default(),
            p99: util::percentile(&w, 0.99),
            over_10ms: w.iter().filter(|d| **d > Duration::from_millis(10)).count(),
            count: w.len(),
        }
    }

    fn show(&self) -> String {
        format!(
            "{:.2} ms (p99 {:.2} ms, {} of {} over 10 ms)",
            self.max.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.over_10ms,
            self.count
        )
    }
}

/// `n` leases (module locks, or PX strings for Redis' own expiry) with one absolute deadline.
fn expire_together(n: usize, locks: bool, pinning: &Pinning, started: Instant) -> Expiry {
    let server = pinning.server(
        util::bench_config()
            .with("notify-keyspace-events", "Edx")
            .with("client-output-buffer-limit", "pubsub 0 0 0")
            .with("latency-monitor-threshold", "1"),
    );
    let port = server.port;
    let mut conn = server.conn();
    let sha = load_script(
        &mut conn,
        if locks {
            lua::PRELOAD_LOCKS
        } else {
            lua::PRELOAD_STRINGS
        },
    );
    let channel = if locks {
        "__keyevent@0__:lock.expired"
    } else {
        "__keyevent@0__:expired"
    };

    let count = Arc::new(AtomicU64::new(0));
    let subscribed = Arc::new(AtomicBool::new(false));
    // Preloading runs at a few µs a key; leave room for it and for an idle second.
    let preload_budget = Duration::from_micros(12 * n as u64) + Duration::from_secs(2);
    let deadline_ms = now_ms() + preload_budget.as_millis() as u64 + 1_500;
    let deadline = Instant::now() + Duration::from_millis(deadline_ms - now_ms());
    let until = deadline + Duration::from_secs(15);
    let subscriber = {
        let (count, subscribed) = (count.clone(), subscribed.clone());
        thread::spawn(move || count_events(port, channel, n as u64, until, count, subscribed))
    };
    let wait = Instant::now() + PATIENCE;
    while !subscribed.load(Ordering::SeqCst) {
        assert!(Instant::now() < wait, "subscriber never subscribed");
        thread::sleep(Duration::from_millis(5));
    }
    progress(
        started,
        &format!(
            "scale: {} {} ending at one deadline, {:.1} s from now",
            count_label(n),
            if locks { "leases" } else { "PX strings" },
            (deadline - Instant::now()).as_secs_f64()
        ),
    );
    // Batches of 1,000 with the ttl computed per batch: every lease ends within a few ms
    // after the deadline.
    let mut from = 0;
    while from < n {
        let to = (from + 1_000).min(n);
        let ttl = deadline_ms.saturating_sub(now_ms()).max(1);
        let args = [
            "EVALSHA".to_string(),
            sha.clone(),
            "0".into(),
            from.to_string(),
            to.to_string(),
            "exp:".into(),
            TOKEN.into(),
            ttl.to_string(),
        ];
        assert_eq!(conn.call(&args), Reply::Int(1));
        from = to;
    }
    let preload_left = deadline.saturating_duration_since(Instant::now());
    assert!(matches!(conn.call(&["LATENCY", "RESET"]), Reply::Int(_)));

    // The probe: PING round trips from 1.5 s before the deadline; every 5 ms after the
    // deadline, INFO lock (or DBSIZE) to see when nothing is held any more.
    let probe_start = deadline
        .checked_sub(Duration::from_millis(1_500))
        .unwrap_or(deadline);
    while Instant::now() < probe_start {
        thread::sleep(Duration::from_millis(1));
    }
    let mut rtts: Vec<(Instant, Duration)> = Vec::new();
    let mut freed_at = None;
    let mut last_check = Instant::now();
    let pid = server.pid();
    let (mut cpu_at_deadline, mut cpu_at_freed) = (None, None);
    loop {
        let now = Instant::now();
        assert_eq!(conn.call(&["PING"]), Reply::status("PONG"));
        rtts.push((now, now.elapsed()));
        if now > deadline && cpu_at_deadline.is_none() {
            cpu_at_deadline = util::cpu_ns(pid);
        }
        if now > deadline && freed_at.is_none() && last_check.elapsed() >= Duration::from_millis(5)
        {
            last_check = Instant::now();
            let left = if locks {
                info_u64(&mut conn, "lock", "lock_held")
            } else {
                conn.call(&["DBSIZE"]).int() as u64
            };
            if left == 0 {
                freed_at = Some(Instant::now());
                cpu_at_freed = util::cpu_ns(pid);
            }
        }
        let announced = count.load(Ordering::SeqCst) >= n as u64;
        if (freed_at.is_some() && announced) || now > until {
            // A little more probing after the end.
            let tail = Instant::now() + Duration::from_millis(100);
            while Instant::now() < tail {
                let now = Instant::now();
                assert_eq!(conn.call(&["PING"]), Reply::status("PONG"));
                rtts.push((now, now.elapsed()));
            }
            break;
        }
    }
    let announced_at = subscriber.join().expect("subscriber");
    let expired_counter = if locks {
        info_u64(&mut conn, "lock", "lock_expired")
    } else {
        info_u64(&mut conn, "stats", "expired_keys")
    };
    let latency = conn.call(&["LATENCY", "LATEST"]);
    let mut latency_events = Vec::new();
    for event in latency.items() {
        let items = event.items();
        if let (Some(name), Some(max)) = (items.first(), items.get(3)) {
            latency_events.push(format!("{} {} ms", name.text(), max.int()));
        }
    }
    drop(conn);
    drop(server);

    let idle_end = deadline
        .checked_sub(Duration::from_millis(300))
        .unwrap_or(deadline);
    let busy_start = deadline
        .checked_sub(Duration::from_millis(100))
        .unwrap_or(deadline);
    let window = |from: Instant, to: Instant| -> Probes {
        Probes::of(
            rtts.iter()
                .filter(|(at, _)| *at >= from && *at < to)
                .map(|(_, d)| *d)
                .collect(),
        )
    };
    let after = |at: Option<Instant>| at.map(|t| t.saturating_duration_since(deadline));
    Expiry {
        freed: after(freed_at),
        announced: after(announced_at),
        events: count.load(Ordering::SeqCst),
        busy: window(busy_start, Instant::now()),
        idle: window(probe_start, idle_end),
        preload_left,
        busy_cpu: cpu_at_deadline
            .zip(cpu_at_freed)
            .map(|(from, to)| Duration::from_nanos(to.saturating_sub(from))),
        expired_counter,
        latency_events,
    }
}

/// `scale_locks` leases with one deadline, and as many PX strings (Redis' own expiry) as the
/// baseline: time until all are freed and announced, and the longest PING round trip meanwhile
/// against the longest in an idle second just before.
fn mass_expiry(
    settings: &Settings,
    pinning: &Pinning,
    started: Instant,
    table: &mut String,
    goals: &mut Vec<(String, bool)>,
) {
    let n = settings.scale_locks;
    let locks = expire_together(n, true, pinning, started);
    let strings = expire_together(n, false, pinning, started);

    let fmt = |d: Option<Duration>| {
        d.map_or("never (gave up after 15 s)".to_string(), |d| {
            format!("{:.0} ms", d.as_secs_f64() * 1e3)
        })
    };
    let in_time = |d: Option<Duration>| d.is_some_and(|d| d <= Duration::from_secs(2));
    let all_met = in_time(locks.freed) && in_time(locks.announced);
    let stall_met = locks.busy.max <= Duration::from_millis(10);
    // First goal: no slower than Redis' own expiry of as many strings, in the same run.
    let no_later = |lease: Option<Duration>, string: Option<Duration>| match (lease, string) {
        (Some(lease), Some(string)) => lease <= string,
        (Some(_), None) => true,
        (None, _) => false,
    };
    goals.push((
        format!(
            "{} leases freed and announced no later than Redis' own expiry of as many strings",
            count_label(n)
        ),
        no_later(locks.freed, strings.freed) && no_later(locks.announced, strings.announced),
    ));
    goals.push((
        format!("{} leases freed and announced within 2 s", count_label(n)),
        all_met,
    ));
    goals.push((
        "no event-loop stall over 10 ms during mass expiry".to_string(),
        stall_met,
    ));
    let _ = writeln!(
        table,
        "### Scale: {} leases that end together\n\n{} locks taken with one absolute deadline \
         (ttl computed per batch of 1,000), against {} `SET key token PX ttl` strings that \
         Redis itself expires, each on a fresh server with `notify-keyspace-events Edx`: a \
         subscriber counts the `lock.expired` / `expired` keyevents, and a PING probe runs \
         (with INFO lock / DBSIZE every 5 ms after the deadline) from 1.5 s before the \
         deadline. The idle row is the probe's noise floor on this machine.\n",
        count_label(n),
        count_label(n),
        count_label(n),
    );
    let _ = writeln!(
        table,
        "| measure | LOCK leases | Redis PX strings (baseline) | goal (leases) |"
    );
    let _ = writeln!(table, "|---|---|---|---|");
    let _ = writeln!(
        table,
        "| all freed, after the deadline | {} | {} | <= Redis' own: {}; <= 2000 ms: {} |",
        fmt(locks.freed),
        fmt(strings.freed),
        verdict(no_later(locks.freed, strings.freed)),
        verdict(in_time(locks.freed))
    );
    let _ = writeln!(
        table,
        "| all announced, after the deadline ({} / {} events) | {} | {} | <= Redis' own: {}; \
         <= 2000 ms: {} |",
        locks.events,
        strings.events,
        fmt(locks.announced),
        fmt(strings.announced),
        verdict(no_later(locks.announced, strings.announced)),
        verdict(in_time(locks.announced))
    );
    // How much of the time until all were freed the server spent working: the rest it waited
    // (for its next timer, or Redis' next expire cycle).
    let busy = |e: &Expiry| match (e.busy_cpu, e.freed) {
        (Some(cpu), Some(wall)) if !wall.is_zero() => format!(
            "{:.0} ms, {:.0}% of the time, {:.2} µs per lease",
            cpu.as_secs_f64() * 1e3,
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / n as f64
        ),
        _ => "-".to_string(),
    };
    let _ = writeln!(
        table,
        "| server main thread CPU until all freed | {} | {} | - |",
        busy(&locks),
        busy(&strings)
    );
    let _ = writeln!(
        table,
        "| longest PING round trip while expiring | {} | {} | <= 10 ms: {} |",
        locks.busy.show(),
        strings.busy.show(),
        verdict(stall_met)
    );
    let _ = writeln!(
        table,
        "| longest PING round trip, idle 1.2 s before | {} | {} | - |",
        locks.idle.show(),
        strings.idle.show()
    );
    let _ = writeln!(
        table,
        "\nExpired counters at the end: INFO lock_expired {}, expired_keys {}. Time to spare after \
         loading: {:.1} s / {:.1} s. LATENCY LATEST (threshold 1 ms): {} / {}.",
        locks.expired_counter,
        strings.expired_counter,
        locks.preload_left.as_secs_f64(),
        strings.preload_left.as_secs_f64(),
        show_events(&locks.latency_events),
        show_events(&strings.latency_events)
    );
}

fn show_events(events: &[String]) -> String {
    if events.is_empty() {
        "no event".to_string()
    } else {
        events.join(", ")
    }
}
