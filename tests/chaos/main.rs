//! Safety under faults: many clients take locks, write to a fenced store with their fences, and
//! the server is killed, restarted, paused, reloaded, rewritten and failed over under them.
//!
//! The **oracle** is a fenced store: it accepts a write to a resource only with a fence at least
//! as large as the largest it accepted for that resource, and logs every accept and reject. It
//! runs in the test process and also listens on a loopback port for the client processes that a
//! scenario stops with SIGSTOP. After each scenario these invariants are checked:
//!
//! - I1: no accepted write has a fence lower than an earlier accepted write (the store's log);
//!   the same for the Redis lists holders append their fences to through LOCK.GUARD, as the
//!   server keeps them at the end (a stale holder's guarded write never lands after a newer
//!   holder's), and a guarded write by a holder whose lease is certainly over counts for I5;
//! - I2: every grant of a key has its own fence, and a grant that ended before another started
//!   has the smaller fence (client-side timestamps of request and reply);
//! - I3: the server never has two live holders of one key: no grant was made while another
//!   grant's lease was certainly running (granted before, not released, deadline ahead);
//! - I4: a key's fence never goes back across restart, reload, AOF rewrite or failover (the
//!   fence the server shows afterwards against the largest fence granted before);
//! - I5: release or renew with a wrong or stale token never succeeds.
//!
//! Scenarios that the README says can lose grants (kill -9 with `appendfsync everysec`, failover
//! without `WAIT 1`) report their violations instead of failing on them; the others must have
//! none. `CHAOS_SCALE` picks the size: unset (a quick pass for `cargo test`), `ci`, or `full`
//! (`make chaos`); `CHAOS_REPORT=path` appends one line per scenario to a file.
//!
//! The parts: `oracle` (the fenced store), `clients` (the client load), `history` (what the
//! clients saw, and the invariant checks), `report` (the per-scenario report, which fails on
//! violations); the scenarios in `faults` (kill -9, server pauses, DEBUG RELOAD and
//! BGREWRITEAOF, failover) and `paused_holder` (a client process stopped past its lease); the
//! command and RESTORE fuzzer in `fuzz`, with its inputs in `fuzz_input`; and `regressions`,
//! tests for module bugs this suite found.

#[path = "../common/mod.rs"]
mod common;

mod clients;
mod cluster;
mod faults;
mod fuzz;
mod fuzz_input;
mod history;
mod oracle;
mod paused_holder;
mod regressions;
mod report;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Scale

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scale {
    Quick,
    Ci,
    Full,
}

fn scale() -> Scale {
    match std::env::var("CHAOS_SCALE").as_deref() {
        Ok("full") => Scale::Full,
        Ok("ci") => Scale::Ci,
        _ => Scale::Quick,
    }
}

#[derive(Clone, Copy, Debug)]
struct Params {
    /// Load between two faults.
    phase: Duration,
    /// Faults per scenario.
    faults: usize,
    clients: usize,
    keys: usize,
    /// Rounds of the SIGSTOPped holder.
    holder_rounds: usize,
    fuzz_commands: u64,
    fuzz_restores: u64,
}

fn params() -> Params {
    match scale() {
        Scale::Quick => Params {
            phase: Duration::from_millis(400),
            faults: 2,
            clients: 6,
            keys: 4,
            holder_rounds: 3,
            fuzz_commands: 20_000,
            fuzz_restores: 500,
        },
        Scale::Ci => Params {
            phase: Duration::from_millis(2000),
            faults: 5,
            clients: 10,
            keys: 8,
            holder_rounds: 15,
            fuzz_commands: 200_000,
            fuzz_restores: 3_000,
        },
        Scale::Full => Params {
            phase: Duration::from_secs(5),
            faults: 8,
            clients: 16,
            keys: 12,
            holder_rounds: 120,
            fuzz_commands: 1_200_000,
            fuzz_restores: 20_000,
        },
    }
}

/// Slack for comparing client-side instants with the server's millisecond wall clock.
const SLACK: Duration = Duration::from_millis(3);
/// Longest any client read waits (server pauses in these scenarios last at most ~1.5 s).
const CLIENT_READ: Duration = Duration::from_secs(8);

// ---------------------------------------------------------------------------------------------
// A small deterministic random source

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------------------------
// Threads

/// Sets the stop flag when dropped, so clients end even when the controller panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}
