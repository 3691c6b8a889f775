//! Memory: bytes per held lock and per released lock against `SET key token PX ttl`, by
//! `MEMORY USAGE` of one key and by the `used_memory` delta over many keys (which also counts
//! what MEMORY USAGE cannot see: the main dict's and the expires dict's entries and tables, and
//! the module's lease index).

use std::fmt::Write;
use std::time::{Duration, Instant};

use crate::common::Conn;
use crate::util::{
    self, flushall, info_u64, load_script, lua, median, preload, progress, verdict, Pinning,
    Settings, TOKEN,
};

const TTL: &str = "3600000";

fn used_memory(conn: &mut Conn) -> f64 {
    info_u64(conn, "memory", "used_memory") as f64
}

fn memory_usage(conn: &mut Conn, key: &str) -> f64 {
    conn.call(&["MEMORY", "USAGE", key, "SAMPLES", "0"]).int() as f64
}

pub struct Outcome {
    pub table: String,
    pub goals: Vec<(String, bool)>,
}

pub fn run(settings: &Settings, pinning: &Pinning, started: Instant) -> Outcome {
    let server = pinning.server(util::bench_config());
    let mut conn = server.conn();
    let locks_sha = load_script(&mut conn, lua::PRELOAD_LOCKS);
    let strings_sha = load_script(&mut conn, lua::PRELOAD_STRINGS);
    let release_sha = load_script(&mut conn, lua::RELEASE_LOCKS);
    let n = settings.memory_locks;
    let sample = format!("k:{:012}", n / 2);
    let (mut held, mut released, mut string) = (Vec::new(), Vec::new(), Vec::new());
    let (mut held_mu, mut released_mu, mut string_mu) = (Vec::new(), Vec::new(), Vec::new());
    let rounds = 3;
    for round in 0..rounds {
        progress(started, &format!("memory: round {}/{rounds}", round + 1));
        flushall(&mut conn);
        std::thread::sleep(Duration::from_millis(50));
        let m0 = used_memory(&mut conn);
        preload(&mut conn, &locks_sha, "k:", n, 50_000, || {
            vec![TOKEN.into(), TTL.into()]
        });
        let m1 = used_memory(&mut conn);
        held_mu.push(memory_usage(&mut conn, &sample));
        preload(&mut conn, &release_sha, "k:", n, 50_000, || {
            vec![TOKEN.into()]
        });
        let m2 = used_memory(&mut conn);
        released_mu.push(memory_usage(&mut conn, &sample));
        held.push((m1 - m0) / n as f64);
        released.push((m2 - m0) / n as f64);

        flushall(&mut conn);
        std::thread::sleep(Duration::from_millis(50));
        let m3 = used_memory(&mut conn);
        preload(&mut conn, &strings_sha, "k:", n, 50_000, || {
            vec![TOKEN.into(), TTL.into()]
        });
        let m4 = used_memory(&mut conn);
        string_mu.push(memory_usage(&mut conn, &sample));
        string.push((m4 - m3) / n as f64);
    }
    flushall(&mut conn);
    drop(conn);
    drop(server);

    let (held, released, string) = (median(&held), median(&released), median(&string));
    let (held_mu, released_mu, string_mu) =
        (median(&held_mu), median(&released_mu), median(&string_mu));
    let mut table = String::new();
    let _ = writeln!(
        table,
        "### Memory\n\n{n} keys `k:` + 12 digits, token {} bytes; used_memory before and after, \
         median of {rounds} rounds.\n",
        TOKEN.len()
    );
    let _ = writeln!(
        table,
        "| value | used_memory / key (B) | vs SET PX | MEMORY USAGE (B) | vs SET PX |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|");
    let _ = writeln!(
        table,
        "| SET key token PX ttl (baseline) | {string:.1} | 1.00x | {string_mu:.0} | 1.00x |"
    );
    let _ = writeln!(
        table,
        "| held lock (LOCK.ACQUIRE) | {held:.1} | {:.2}x | {held_mu:.0} | {:.2}x |",
        held / string,
        held_mu / string_mu
    );
    let _ = writeln!(
        table,
        "| released lock (after LOCK.RELEASE) | {released:.1} | {:.2}x | {released_mu:.0} | {:.2}x |",
        released / string,
        released_mu / string_mu
    );
    let met = held / string <= 1.2;
    let _ = writeln!(
        table,
        "\nGoal: a held lock <= 1.2x a SET PX string (used_memory): {:.2}x, {}.",
        held / string,
        verdict(met)
    );
    let released_met = released / string <= 1.0;
    let _ = writeln!(
        table,
        "\nGoal: a released lock (until `lock.tombstone-ttl`) <= 1.0x a SET PX string \
         (used_memory): {:.2}x, {}.",
        released / string,
        verdict(released_met)
    );
    Outcome {
        table,
        goals: vec![
            ("held lock memory <= 1.2x SET PX".to_string(), met),
            (
                "released lock memory <= 1.0x SET PX".to_string(),
                released_met,
            ),
        ],
    }
}
