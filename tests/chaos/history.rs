//! What the clients saw: their grants and probes, and the invariant checks over them.

use crate::oracle::WriteRecord;
use crate::SLACK;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Add;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A moment as the client's monotonic clock and as the wall clock read it. Order and real-time
/// order go by the monotonic clock; leases go by the wall clock, as the server times them (a
/// deadline is wall-clock ms), so a machine whose wall clock runs at another rate than its
/// monotonic one (a VM whose clock is stepped to the host's) does not read as early expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    pub at: Instant,
    pub wall: Duration,
}

impl Stamp {
    pub fn now() -> Stamp {
        Stamp {
            at: Instant::now(),
            wall: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock after 1970"),
        }
    }
}

impl Add<Duration> for Stamp {
    type Output = Stamp;
    fn add(self, d: Duration) -> Stamp {
        Stamp {
            at: self.at + d,
            wall: self.wall + d,
        }
    }
}

/// The kind of hold a grant was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Shared,
    /// A permit of a semaphore of that many permits.
    Permit(usize),
}

#[derive(Clone, Debug)]
pub struct Grant {
    pub key: String,
    pub fence: u64,
    pub mode: Mode,
    /// When the ACQUIRE was sent and when its reply arrived.
    pub start: Stamp,
    pub end: Stamp,
    /// Until when the lease was certainly running on the server: request time + ttl, moved by
    /// successful renewals, cut to the moment a release was sent.
    pub live_until: Stamp,
}

#[derive(Default)]
pub struct History {
    pub grants: Mutex<Vec<Grant>>,
    /// Grants a `WAIT 1` did not confirm: the client did not act on them.
    pub unconfirmed: AtomicU64,
    pub contended: AtomicU64,
    /// Release/renew with a wrong or certainly stale token.
    pub i5_attempts: AtomicU64,
    pub i5_violations: AtomicU64,
    pub i4_checks: AtomicU64,
    pub i4_violations: AtomicU64,
    pub faults: AtomicU64,
    /// LOCK.GUARD writes to the key's guarded log: run (the fence was current), and refused.
    pub guarded_landed: AtomicU64,
    pub guarded_refused: AtomicU64,
    pub errors: Mutex<BTreeMap<String, u64>>,
    pub notes: Mutex<Vec<String>>,
}

impl History {
    pub fn add_grant(&self, grant: Grant) -> usize {
        let mut grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        grants.push(grant);
        grants.len() - 1
    }

    pub fn update(&self, idx: usize, f: impl FnOnce(&mut Grant)) {
        let mut grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut grants[idx]);
    }

    pub fn error(&self, text: &str) {
        let kind: String = text
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_default() += 1;
    }

    pub fn note(&self, text: String) {
        self.notes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(text);
    }

    pub fn i5(&self, succeeded: bool) {
        self.i5_attempts.fetch_add(1, Relaxed);
        if succeeded {
            self.i5_violations.fetch_add(1, Relaxed);
        }
    }

    /// The largest fence granted so far, per key.
    pub fn max_fences(&self) -> HashMap<String, u64> {
        let grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        let mut max: HashMap<String, u64> = HashMap::new();
        for g in grants.iter() {
            let m = max.entry(g.key.clone()).or_default();
            *m = (*m).max(g.fence);
        }
        max
    }

    /// I4: the fences a server shows after a fault against the largest granted before it.
    pub fn check_i4(
        &self,
        before: &HashMap<String, u64>,
        after: &HashMap<String, u64>,
        what: &str,
    ) {
        for (key, &was) in before {
            self.i4_checks.fetch_add(1, Relaxed);
            let now = after.get(key).copied().unwrap_or(0);
            if now < was {
                self.i4_violations.fetch_add(1, Relaxed);
                self.note(format!(
                    "I4 after {what}: {key} shows fence {now}, below the granted {was} (-{})",
                    was - now
                ));
            }
        }
    }
}

/// I2: distinct fences per key, and grants ordered in real time have ordered fences.
pub fn check_i2(grants: &[Grant]) -> (u64, Vec<String>) {
    let mut violations = 0;
    let mut examples = Vec::new();
    for (key, list) in by_key(grants) {
        let mut seen = HashSet::new();
        for g in &list {
            if !seen.insert(g.fence) {
                violations += 1;
                examples.push(format!("I2: {key} fence {} granted twice", g.fence));
            }
        }
        let mut by_end = list.clone();
        by_end.sort_by_key(|g| g.end);
        let mut by_start = list;
        by_start.sort_by_key(|g| g.start);
        let mut i = 0;
        let mut max_before = 0u64;
        for b in &by_start {
            while i < by_end.len() && by_end[i].end < b.start {
                max_before = max_before.max(by_end[i].fence);
                i += 1;
            }
            if max_before >= b.fence {
                violations += 1;
                if examples.len() < 5 {
                    examples.push(format!(
                        "I2: {key} granted fence {} after an earlier grant of fence {max_before}",
                        b.fence
                    ));
                }
            }
        }
    }
    (violations, examples)
}

/// I3: no grant while other grants' leases were certainly running that it may not run beside:
/// an exclusive grant beside any other, a shared one beside an exclusive one, a permit beside as
/// many permits as the semaphore has.
pub fn check_i3(grants: &[Grant]) -> (u64, Vec<String>) {
    let mut violations = 0;
    let mut examples = Vec::new();
    for (key, list) in by_key(grants) {
        let mut by_end = list.clone();
        by_end.sort_by_key(|g| g.end);
        let mut by_start = list;
        by_start.sort_by_key(|g| g.start);
        let mut i = 0;
        // Grants answered before the current one was asked, whose lease may still run.
        let mut earlier: Vec<Grant> = Vec::new();
        for b in &by_start {
            while i < by_end.len() && by_end[i].end <= b.start {
                earlier.push(by_end[i].clone());
                i += 1;
            }
            // A lease over by the time b was asked is over for every later grant too.
            // Leases on the server's clock (see `Stamp`).
            earlier.retain(|a| a.live_until.wall > b.start.wall + SLACK);
            let running: Vec<&Grant> = earlier
                .iter()
                .filter(|a| a.live_until.wall > b.end.wall + SLACK)
                .collect();
            let conflict = match b.mode {
                Mode::Exclusive => running.first().copied(),
                Mode::Shared => running.iter().copied().find(|a| a.mode == Mode::Exclusive),
                Mode::Permit(limit) => running
                    .iter()
                    .copied()
                    .find(|a| a.mode == Mode::Exclusive)
                    .or_else(|| (running.len() >= limit).then(|| running[0])),
            };
            if let Some(a) = conflict {
                violations += 1;
                if examples.len() < 5 {
                    examples.push(format!(
                        "I3: {key} granted fence {} ({:?}) while fence {} ({:?}, {} running) had \
                         {} ms of lease left",
                        b.fence,
                        b.mode,
                        a.fence,
                        a.mode,
                        running.len(),
                        (a.live_until.wall - b.end.wall).as_millis()
                    ));
                }
            }
        }
    }
    (violations, examples)
}

fn by_key(grants: &[Grant]) -> BTreeMap<String, Vec<Grant>> {
    let mut map: BTreeMap<String, Vec<Grant>> = BTreeMap::new();
    for g in grants {
        map.entry(g.key.clone()).or_default().push(g.clone());
    }
    map
}

/// I1: the store's accepted fences never go down, per resource.
pub fn check_i1(log: &[WriteRecord]) -> u64 {
    let mut max: HashMap<&str, u64> = HashMap::new();
    let mut violations = 0;
    for w in log.iter().filter(|w| w.accepted) {
        let m = max.entry(&w.resource).or_default();
        if w.fence < *m {
            violations += 1;
        }
        *m = (*m).max(w.fence);
    }
    violations
}
