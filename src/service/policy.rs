//! Namespaces at run time (see `crate::policy` for the model): the policy `lock.namespaces`
//! puts in force, the admission of clients' requests by it, the counts of what each namespace
//! refused and warned about, and warn's audit lines at a bounded rate.
//!
//! Only clients' commands are held to a policy: effects from the primary and the AOF never
//! are. With no namespace defined, a request pays one look at an empty cell.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis_module::{Context, RedisString, RedisValue};
use sha2::{Digest, Sha256};

use crate::config;
use crate::error::LockError;
use crate::host::audit::{config_caller, describe_client};
use crate::host::command::{reply_nested, CommandResult, Nested};
use crate::host::config::StringConfig;
use crate::host::log_notice;
use crate::host::server::{caller_id, is_replayed, now_ms};
use crate::lock::ages::Space;
use crate::policy::{settings, Asked, Enforcement, Namespace, Policy, Violation};
use crate::service::{holds, waiters};

/// The rules a request can break, in the order of their counters.
pub const RULES: [&str; 12] = [
    "min-ttl",
    "max-ttl",
    "max-wait",
    "label",
    "label-pattern",
    "session",
    "sync",
    "fsync",
    "modes",
    "max-limit",
    "max-waiters",
    "max-reentrancy",
];

/// What one namespace refused (`enforce`) and let through (`warn`), per rule, and what its
/// locks did (by [`Stat`]).
#[derive(Clone, Copy, Default)]
pub struct Counts {
    pub refused: [u64; RULES.len()],
    pub warned: [u64; RULES.len()],
    pub stats: [u64; STATS.len()],
}

/// What a namespace's locks did, counted where the server-wide counters of the same names are
/// (`lock_acquired`, `lock_acquire_contended`, `lock_acquire_timeouts`, `lock_expired`,
/// `lock_forced`), in the namespace the key is in at that moment.
#[derive(Clone, Copy)]
pub enum Stat {
    Acquired,
    Contended,
    Timeouts,
    Expired,
    Forced,
}

/// The names of the [`Stat`]s in INFO, in their order.
pub const STATS: [&str; 5] = ["acquired", "contended", "timeouts", "expired", "forced"];

/// The name metrics give the keys no namespace takes, when the policy has no namespace of that
/// name.
const DEFAULT: &str = "default";

/// How long a client's warnings of one rule in one namespace stay silent after an audit line.
const WARN_LINE_EVERY_MS: u64 = 60_000;
/// The most warn lines a minute, all clients together; beyond, they are counted and one line
/// a minute says how many were left out.
const WARN_LINES_A_MINUTE: u64 = 100;
/// The most (client, namespace, rule) triples remembered for the per-client rate; when full,
/// the ones older than a minute go, and a new one beyond is left out like a line over the
/// minute's budget.
const WARN_LINES_KEPT: usize = 4096;
/// The most namespace names whose counts are kept (those of the policy in force always are).
const COUNTS_KEPT: usize = 1024;
/// The longest audit line the module writes: the server cuts a module's log line at 1024
/// bytes.
const AUDIT_LINE_LEN: usize = 900;

/// True while a policy with at least one namespace is in force: the one thing a request looks
/// at when there is none (a plain load; the thread-local cells below cost a call each in a
/// shared library).
static ANY: AtomicBool = AtomicBool::new(false);

/// The rate of warn lines: the minute's start, lines written in it, lines left out of it.
#[derive(Default)]
struct WarnLines {
    last: HashMap<(u64, String, usize), u64>,
    minute: u64,
    written: u64,
    left_out: u64,
}

thread_local! {
    /// The policy in force; `None` with no namespace.
    static ACTIVE: RefCell<Option<Policy>> = const { RefCell::new(None) };
    /// The digest of the policy the audit log last named (at load, or at the last change).
    static LOGGED: RefCell<String> = const { RefCell::new(String::new()) };
    /// The counts of the policy in force by row: a namespace's position, then the keys in no
    /// namespace when the policy defines no `default` (see [`row_of`]). Counted here without a
    /// look-up by name.
    static HERE: RefCell<Vec<Counts>> = const { RefCell::new(Vec::new()) };
    /// The space of each row of the policy in force (see [`SPACES`]).
    static ROW_SPACES: RefCell<Vec<Space>> = const { RefCell::new(Vec::new()) };
    /// Every row name a policy has had, by its space: a lock or waiter not moved yet after a
    /// change still names the namespace it was counted in, never one that took its place.
    static SPACES: RefCell<HashMap<String, Space>> = RefCell::new(HashMap::new());
    /// The counts of namespaces no longer in force, by name: a name keeps its counts when the
    /// policy is replaced, or it is removed and comes back.
    static COUNTS: RefCell<HashMap<String, Counts>> = RefCell::new(HashMap::new());
    static WARN_LINES: RefCell<WarnLines> = RefCell::new(WarnLines::default());
    /// What every namespace refused and warned about, in all, since the module loaded.
    static TOTALS: RefCell<(u64, u64)> = const { RefCell::new((0, 0)) };
}

/// Parses a policy's text; the error says what is wrong.
fn parse(text: &[u8]) -> Result<Policy, String> {
    let text = std::str::from_utf8(text).map_err(|_| "not UTF-8 text".to_string())?;
    Policy::parse(text)
}

/// The names of `policy`'s rows of counts: its namespaces in order, then `default` for the keys
/// in no namespace unless a namespace has that name.
fn row_names(policy: Option<&Policy>) -> Vec<&str> {
    let Some(policy) = policy else {
        return Vec::new();
    };
    let mut names: Vec<&str> = policy
        .namespaces()
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    if !names.contains(&DEFAULT) {
        names.push(DEFAULT);
    }
    names
}

/// True when `name` names a row of the policy in force: one of its namespaces, or `default`.
pub fn has_row(name: &str) -> bool {
    with(|policy| policy.is_some() && row_names(policy).contains(&name))
}

/// The name of the row `key` is counted in (its namespace, or `default`); None without a
/// policy.
pub fn row_name_of(key: &[u8]) -> Option<String> {
    if !ANY.load(Ordering::Relaxed) {
        return None;
    }
    with(|policy| {
        let policy = policy?;
        let names = row_names(Some(policy));
        names.get(row_of(policy, key)).map(|name| name.to_string())
    })
}

/// The row of counts of `key` under `policy` (see [`HERE`]).
fn row_of(policy: &Policy, key: &[u8]) -> usize {
    policy
        .position_of(key)
        .map_or(policy.namespaces().len(), |(at, _)| at)
}

/// Puts `policy` in force. The counts of the rows in force go to the archive by name, and the
/// new rows take theirs from it.
fn install(policy: Policy) {
    ANY.store(!policy.is_empty(), Ordering::Relaxed);
    GENERATION.fetch_add(1, Ordering::Relaxed);
    let policy = (!policy.is_empty()).then_some(policy);
    let names = row_names(policy.as_ref());
    COUNTS.with(|archive| {
        let mut archive = archive.borrow_mut();
        HERE.with(|here| {
            let mut here = here.borrow_mut();
            with(|old| {
                for (name, counts) in row_names(old).into_iter().zip(here.iter()) {
                    archive.insert(name.to_string(), *counts);
                }
            });
            if archive.len() > COUNTS_KEPT {
                archive.retain(|name, _| names.contains(&name.as_str()));
            }
            *here = names
                .iter()
                .map(|name| archive.remove(*name).unwrap_or_default())
                .collect();
        });
    });
    let spaces = SPACES.with(|spaces| {
        let mut spaces = spaces.borrow_mut();
        names
            .iter()
            .map(|name| space_for(&mut spaces, name, &names))
            .collect::<Vec<Space>>()
    });
    ROW_SPACES.with(|rows| *rows.borrow_mut() = spaces);
    ACTIVE.with(|cell| *cell.borrow_mut() = policy);
    MOVING.store(true, Ordering::Relaxed);
    // The waiters (at most one per connection) move at once; the held locks by a walk over
    // the keyspace (see `deferred`), or as they change.
    waiters::queues().respace(space_of);
}

/// The most names [`SPACES`] keeps: the held locks' ages and the waiters keep a list per
/// space, so their number stays small whatever the number of policies over the process' life.
const SPACES_KEPT: usize = 1024;

/// The space of the row named `name` of a policy whose rows are `names`: the one it had, else
/// a new one while fewer than [`SPACES_KEPT`] are kept, else one no row of this policy names
/// and no held lock or waiter is in (so nothing not moved yet can count in the new row). Space
/// 0 (every lock's while no policy is in force) when none is free, which takes more than a
/// thousand namespaces' worth of locks left unmoved.
fn space_for(spaces: &mut HashMap<String, Space>, name: &str, names: &[&str]) -> Space {
    if let Some(space) = spaces.get(name) {
        return *space;
    }
    if spaces.len() < SPACES_KEPT {
        let space = Space::try_from(spaces.len() + 1).unwrap_or(0);
        spaces.insert(name.to_string(), space);
        return space;
    }
    let free = spaces
        .iter()
        .filter(|(kept, _)| !names.contains(&kept.as_str()))
        .find(|(_, space)| holds::in_space(**space).0 == 0 && waiters::in_space(**space).0 == 0)
        .map(|(kept, space)| (kept.clone(), *space));
    let Some((kept, space)) = free else {
        return 0;
    };
    spaces.remove(&kept);
    spaces.insert(name.to_string(), space);
    space
}

/// The space of row `row` of the policy in force.
fn space_at(row: usize) -> Space {
    ROW_SPACES.with(|rows| rows.borrow().get(row).copied().unwrap_or(0))
}

/// True from a policy change until the walk has put every held lock in its new space: a lock
/// that changes meanwhile is moved at once (see `effects::announce`).
static MOVING: AtomicBool = AtomicBool::new(false);

/// See [`MOVING`].
pub fn spaces_moving() -> bool {
    MOVING.load(Ordering::Relaxed)
}

/// The walk after the change at `generation` is done (unless another change came since).
pub fn spaces_moved(generation: u64) {
    if GENERATION.load(Ordering::Relaxed) == generation {
        MOVING.store(false, Ordering::Relaxed);
    }
}

/// The number of policy changes so far.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// `lock.namespaces` as a config: a value is put in force when the server sets it (so the
/// policy in force is always the one CONFIG GET shows, also when the server undoes a CONFIG SET
/// of several parameters by setting the old values again), and logged with who changed it when
/// the server applies the CONFIG SET (which it does only when every parameter was set: a
/// CONFIG SET undone before is never logged).
pub static CONFIG: StringConfig = StringConfig {
    name: config::NAMESPACES,
    set: |text| {
        install(parse(text)?);
        Ok(())
    },
    apply: || {
        let now = digest();
        let before =
            LOGGED.with(|logged| std::mem::replace(&mut *logged.borrow_mut(), now.clone()));
        if before != now {
            let by = config_caller(config::NAMESPACES)
                .unwrap_or_else(|| "a client this server does not name to modules".to_string());
            log_policy(&format!(
                "CONFIG SET lock.namespaces from digest '{before}' to digest '{now}' by {by}"
            ));
        }
        Ok(())
    },
    text,
};

/// After the load: the policy in force is the one the audit log names from now on (and is
/// logged, when there is one).
pub fn loaded() {
    let now = digest();
    if !now.is_empty() {
        log_policy(&format!("loaded with lock.namespaces of digest '{now}'"));
    }
    LOGGED.with(|logged| *logged.borrow_mut() = now);
}

/// Logs `what` happened to the policy, then the policy in force, a namespace a line (each cut
/// to fit a log line), so that a long one is kept whole as far as it can be.
pub fn log_policy(what: &str) {
    let namespaces = with(|policy| {
        policy.map_or_else(Vec::new, |policy| {
            policy.canonical().split("; ").map(str::to_string).collect()
        })
    });
    log_notice(&format!(
        "lock audit: {what}: {} namespaces",
        namespaces.len()
    ));
    let count = namespaces.len();
    for (at, namespace) in namespaces.into_iter().enumerate() {
        let mut line = format!(
            "lock audit: lock.namespaces {}/{count}: {namespace}",
            at + 1
        );
        if line.len() > AUDIT_LINE_LEN {
            let cut = (0..=AUDIT_LINE_LEN)
                .rev()
                .find(|&i| line.is_char_boundary(i))
                .unwrap_or(0);
            let more = line.len() - cut;
            line.truncate(cut);
            line.push_str(&format!("... ({more} more bytes)"));
        }
        log_notice(&line);
    }
}

/// The policy in force in its canonical form (CONFIG GET).
pub fn text() -> String {
    with(|policy| {
        policy
            .map(|p| p.canonical().to_string())
            .unwrap_or_default()
    })
}

/// The first 16 hex digits of the SHA-256 of the canonical text ("" without a policy): equal
/// on every node given the same namespaces, however they were written.
pub fn digest() -> String {
    let text = text();
    if text.is_empty() {
        return String::new();
    }
    Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The number of namespaces, and what they refused and warned about in all.
pub fn totals() -> (usize, u64, u64) {
    let namespaces = with(|policy| policy.map_or(0, |p| p.namespaces().len()));
    let (refused, warned) = TOTALS.with(|totals| *totals.borrow());
    (namespaces, refused, warned)
}

/// True while some namespace is defined (a request with none is never looked at further).
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed)
}

/// Counts `n` of `stat` for the namespace of `key`. Nothing without namespaces.
pub fn tally(key: &[u8], stat: Stat, n: u64) {
    if !ANY.load(Ordering::Relaxed) || n == 0 {
        return;
    }
    with(|policy| {
        let Some(policy) = policy else {
            return;
        };
        let row = row_of(policy, key);
        HERE.with(|here| {
            if let Some(counts) = here.borrow_mut().get_mut(row) {
                counts.stats[stat as usize] += n;
            }
        });
    });
}

/// The long-hold threshold of the holds of `key`: its namespace's `long-hold`, when the
/// namespace sets one and is not `off`, else `lock.long-hold`.
pub fn long_hold_of(key: &[u8]) -> u64 {
    if !ANY.load(Ordering::Relaxed) {
        return config::long_hold();
    }
    with(|policy| {
        long_hold_in(
            policy
                .and_then(|policy| policy.namespace_of(key))
                .map(|(ns, _)| ns),
        )
    })
}

/// The long-hold threshold of the holds in `namespace` (`None`: in none): its `long-hold`
/// when it sets one and is not `off`, else `lock.long-hold`.
fn own_long_hold(namespace: Option<&Namespace>) -> Option<u64> {
    namespace
        .filter(|namespace| namespace.mode != Enforcement::Off)
        .and_then(|namespace| namespace.rules.long_hold)
}

/// [`own_long_hold`], or `lock.long-hold` without one.
fn long_hold_in(namespace: Option<&Namespace>) -> u64 {
    own_long_hold(namespace).unwrap_or_else(config::long_hold)
}

/// The space of `key` among the held locks' ages and the waiters (see `lock::ages::Space`):
/// the one of its row's name (see [`SPACES`]); 0 without a policy.
pub fn space_of(key: &[u8]) -> Space {
    if !ANY.load(Ordering::Relaxed) {
        return 0;
    }
    with(|policy| policy.map_or(0, |policy| space_at(row_of(policy, key))))
}

/// Bumped whenever a policy is put in force: the held locks' spaces must then be found again.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The generation the held locks' spaces were last found for.
static PARTITIONED: AtomicU64 = AtomicU64::new(0);

/// True (once per change) when the policy changed since the held locks were last put in their
/// namespaces' spaces: the walk over the keyspace starts again (see `deferred`).
pub fn spaces_changed() -> bool {
    let now = GENERATION.load(Ordering::Relaxed);
    PARTITIONED.swap(now, Ordering::Relaxed) != now
}

/// One namespace's INFO line: its name, and its fields in order.
pub type NamespaceFields = (String, Vec<(String, i64)>);

/// INFO: a line per namespace of the policy in force (and `default` when the policy does not
/// name it), none without a policy. `held(space)` and `waiting(space)` answer what a space
/// holds and queues now: how many, and the age in ms of the oldest (0: none).
pub fn namespace_fields(
    held: impl Fn(Space) -> (usize, u64),
    waiting: impl Fn(Space) -> (usize, u64),
) -> Vec<NamespaceFields> {
    if !ANY.load(Ordering::Relaxed) {
        return Vec::new();
    }
    with(|policy| {
        let Some(policy) = policy else {
            return Vec::new();
        };
        let names = row_names(Some(policy));
        names
            .iter()
            .enumerate()
            .map(|(row, name)| {
                let (held_now, oldest_hold) = held(space_at(row));
                let (waiters, oldest_wait) = waiting(space_at(row));
                let counts = counts_at(row);
                let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                let mut fields = vec![
                    ("held".to_string(), n(held_now as u64)),
                    ("waiters".to_string(), n(waiters as u64)),
                ];
                fields.extend(
                    STATS
                        .iter()
                        .zip(counts.stats)
                        .map(|(stat, v)| (stat.to_string(), n(v))),
                );
                fields.push(("refused".into(), n(counts.refused.iter().sum())));
                fields.push(("warned".into(), n(counts.warned.iter().sum())));
                fields.push(("oldest_hold_ms".into(), n(oldest_hold)));
                let long_hold = long_hold_in(policy.namespaces().get(row));
                fields.push(("long_hold_ms".into(), n(long_hold)));
                fields.push(("oldest_wait_ms".into(), n(oldest_wait)));
                for (what, by_rule) in [("refused", &counts.refused), ("warned", &counts.warned)] {
                    for (rule, v) in RULES.iter().zip(by_rule) {
                        if *v > 0 {
                            fields.push((format!("{what}_{}", rule.replace('-', "_")), n(*v)));
                        }
                    }
                }
                (name.to_string(), fields)
            })
            .collect()
    })
}

/// Which namespaces a call judges: a multi-lock call first asks every key's `enforce`
/// namespace, then, when none refused, the `warn` ones (so a refused call counts no warning).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Judging {
    All,
    EnforceOnly,
    WarnOnly,
}

/// Holds a client's request on `key` to the key's namespace: `Err(POLICY ...)` when a
/// namespace in `enforce` mode refuses it; counted, and an audit line now and then, when one
/// in `warn` mode would have. Answers the lock-delay default a namespace in `enforce` mode
/// gives the grant (`warn` changes nothing a client sees).
pub fn admit<'a>(
    ctx: &Context,
    key: &RedisString,
    judging: Judging,
    asked: impl FnOnce() -> Asked<'a>,
) -> Result<Option<u64>, LockError> {
    if !ANY.load(Ordering::Relaxed) {
        return Ok(None);
    }
    judged(ctx, key.as_slice(), judging, |namespace| {
        namespace.check(&asked())
    })
}

/// [`admit`] for a request about to queue on `key` behind `queued` others (`max-waiters`).
pub fn admit_queued(
    ctx: &Context,
    key: &RedisString,
    judging: Judging,
    queued: usize,
) -> Result<(), LockError> {
    if !ANY.load(Ordering::Relaxed) {
        return Ok(());
    }
    judged(ctx, key.as_slice(), judging, |namespace| {
        namespace.check_queue(u64::try_from(queued).unwrap_or(u64::MAX))
    })
    .map(|_| ())
}

/// [`admit`] for a REENTRANT acquire by a token that holds the lock `holds` times already
/// (`max-reentrancy`).
pub fn admit_reentrant(
    ctx: &Context,
    key: &RedisString,
    judging: Judging,
    holds: u32,
) -> Result<(), LockError> {
    if !ANY.load(Ordering::Relaxed) {
        return Ok(());
    }
    judged(ctx, key.as_slice(), judging, |namespace| {
        namespace.check_reentrancy(holds)
    })
    .map(|_| ())
}

fn judged(
    ctx: &Context,
    key: &[u8],
    judging: Judging,
    check: impl FnOnce(&Namespace) -> Option<Violation>,
) -> Result<Option<u64>, LockError> {
    if is_replayed(ctx) {
        return Ok(None);
    }
    // The verdict, taken with the policy borrowed; counted and logged after.
    let verdict = with(|policy| {
        let (at, _) = policy?.position_of(key)?;
        let namespace = policy?.namespaces().get(at)?;
        let wanted = match (namespace.mode, judging) {
            (Enforcement::Off, _) => false,
            (_, Judging::All) => true,
            (Enforcement::Enforce, Judging::EnforceOnly) => true,
            (Enforcement::Warn, Judging::WarnOnly) => true,
            _ => false,
        };
        if !wanted {
            return None;
        }
        let lock_delay = (namespace.mode == Enforcement::Enforce)
            .then_some(namespace.rules.lock_delay)
            .flatten();
        // The name is copied only for a request that broke a rule.
        let broken = check(namespace).map(|violation| (namespace.name.clone(), violation));
        Some((at, namespace.mode, lock_delay, broken))
    });
    let Some((at, mode, lock_delay, broken)) = verdict else {
        return Ok(None);
    };
    let Some((name, violation)) = broken else {
        return Ok(lock_delay);
    };
    let rule = RULES.iter().position(|r| *r == violation.rule).unwrap_or(0);
    let refused = mode == Enforcement::Enforce;
    HERE.with(|here| {
        if let Some(counts) = here.borrow_mut().get_mut(at) {
            if refused {
                counts.refused[rule] += 1;
            } else {
                counts.warned[rule] += 1;
            }
        }
    });
    TOTALS.with(|totals| {
        let mut totals = totals.borrow_mut();
        if refused {
            totals.0 += 1;
        } else {
            totals.1 += 1;
        }
    });
    if refused {
        return Err(LockError::Policy {
            namespace: name,
            detail: violation.detail,
        });
    }
    warn_line(ctx, &name, rule, &violation.detail);
    Ok(lock_delay)
}

/// The audit line of a request a namespace in `warn` mode let through: one per client,
/// namespace and rule per [`WARN_LINE_EVERY_MS`], at most [`WARN_LINES_A_MINUTE`] a minute in
/// all (then one line a minute says how many were left out).
fn warn_line(ctx: &Context, namespace: &str, rule: usize, detail: &str) {
    let client = caller_id(ctx);
    let now = now_ms();
    let (due, left_out) = WARN_LINES.with(|lines| {
        let mut lines = lines.borrow_mut();
        let mut left_out = 0;
        if now.saturating_sub(lines.minute) >= WARN_LINE_EVERY_MS {
            left_out = std::mem::take(&mut lines.left_out);
            lines.minute = now;
            lines.written = 0;
        }
        let key = (client, namespace.to_string(), rule);
        let seen = lines
            .last
            .get(&key)
            .is_some_and(|last| now.saturating_sub(*last) < WARN_LINE_EVERY_MS);
        if seen {
            return (false, left_out);
        }
        if lines.last.len() >= WARN_LINES_KEPT {
            lines
                .last
                .retain(|_, last| now.saturating_sub(*last) < WARN_LINE_EVERY_MS);
        }
        if lines.written >= WARN_LINES_A_MINUTE || lines.last.len() >= WARN_LINES_KEPT {
            lines.left_out += 1;
            return (false, left_out);
        }
        lines.last.insert(key, now);
        lines.written += 1;
        (true, left_out)
    });
    if left_out > 0 {
        log_notice(&format!(
            "lock audit: {left_out} more warn lines were left out in the last minute (at most \
             {WARN_LINES_A_MINUTE} a minute)"
        ));
    }
    if due {
        let by = if client == 0 {
            "a script".to_string()
        } else {
            describe_client(ctx, client)
        };
        log_notice(&format!(
            "lock audit: namespace {namespace} (warn) would refuse a request by {by}: {detail} \
             (one line per client and rule a minute)"
        ));
    }
}

/// Runs `f` with the policy in force (`None` without one).
pub fn with<R>(f: impl FnOnce(Option<&Policy>) -> R) -> R {
    ACTIVE.with(|cell| f(cell.borrow().as_ref()))
}

/// The counts of row `row` of the policy in force (see [`HERE`]).
fn counts_at(row: usize) -> Counts {
    HERE.with(|here| here.borrow().get(row).copied().unwrap_or_default())
}

/// `LOCK.POLICY LIST`: every namespace, in the policy's order, with its settings and what it
/// refused and warned about by rule. `LOCK.POLICY EXPLAIN key`: the key's namespace, the prefix
/// that put it there, and every rule that applies to a request on it, with where it comes from
/// (the namespace, or the server's own config). EXPLAIN reads no key.
pub fn command(ctx: &Context, args: &[RedisString]) -> CommandResult {
    match args {
        [_, word] if word.as_slice().eq_ignore_ascii_case(b"LIST") => {
            reply_nested(ctx, Nested::List(with(list)))
        }
        [_, word, key] if word.as_slice().eq_ignore_ascii_case(b"EXPLAIN") => {
            reply_nested(ctx, with(|active| explain(active, key.as_slice())))
        }
        _ => Err(LockError::UnknownSubcommand {
            command: "LOCK.POLICY",
            expected: "LIST or EXPLAIN key",
        }),
    }
}

fn list(policy: Option<&Policy>) -> Vec<Nested> {
    let Some(policy) = policy else {
        return Vec::new();
    };
    policy
        .namespaces()
        .iter()
        .enumerate()
        .map(|(row, namespace)| (namespace, counts_at(row)))
        .map(|(namespace, counts)| {
            let by_rule = |of: &[u64; RULES.len()]| {
                Nested::Map(
                    RULES
                        .iter()
                        .zip(of)
                        .filter(|(_, n)| **n > 0)
                        .map(|(rule, n)| (*rule, Nested::int(*n)))
                        .collect(),
                )
            };
            Nested::Map(vec![
                ("name", Nested::bulk(namespace.name.as_bytes())),
                (
                    "prefixes",
                    Nested::List(namespace.prefixes.iter().map(|p| Nested::bulk(p)).collect()),
                ),
                ("mode", Nested::word(namespace.mode.word())),
                (
                    "settings",
                    Nested::Map(
                        settings(&namespace.rules)
                            .into_iter()
                            .map(|(setting, value)| (setting, Nested::bulk(value.as_bytes())))
                            .collect(),
                    ),
                ),
                ("refused", by_rule(&counts.refused)),
                ("warned", by_rule(&counts.warned)),
            ])
        })
        .collect()
}

fn explain(policy: Option<&Policy>, key: &[u8]) -> Nested {
    let found = policy.and_then(|policy| policy.namespace_of(key));
    let nil = || Nested::Value(RedisValue::Null);
    let (name, prefix, mode) = match found {
        Some((namespace, prefix)) => (
            Nested::bulk(namespace.name.as_bytes()),
            prefix.map_or_else(nil, Nested::bulk),
            Nested::word(namespace.mode.word()),
        ),
        None => (nil(), nil(), Nested::word(Enforcement::Off.word())),
    };
    let rule = |setting: &'static str, value: String, from: String| {
        Nested::Map(vec![
            ("setting", Nested::word(setting)),
            ("value", Nested::bulk(value.as_bytes())),
            ("from", Nested::bulk(from.as_bytes())),
        ])
    };
    let mut rules = Vec::new();
    let namespaced = found.filter(|(namespace, _)| namespace.mode != Enforcement::Off);
    if let Some((namespace, _)) = namespaced {
        for (setting, value) in settings(&namespace.rules) {
            rules.push(rule(
                setting,
                value,
                format!("namespace {}", namespace.name),
            ));
        }
    }
    // The server's own limits, which hold whatever the namespace says.
    for numeric in [
        &config::MAX_TTL,
        &config::MAX_WAITERS,
        &config::MAX_TOKEN_LEN,
    ] {
        rules.push(rule(
            numeric.name,
            numeric.get().to_string(),
            format!("config lock.{}", numeric.name),
        ));
    }
    if namespaced.is_none_or(|(namespace, _)| namespace.rules.lock_delay.is_none()) {
        rules.push(rule(
            config::LOCK_DELAY.name,
            config::LOCK_DELAY.get().to_string(),
            format!("config lock.{}", config::LOCK_DELAY.name),
        ));
    }
    if own_long_hold(namespaced.map(|(namespace, _)| namespace)).is_none() {
        rules.push(rule(
            config::LONG_HOLD.name,
            config::LONG_HOLD.get().to_string(),
            format!("config lock.{}", config::LONG_HOLD.name),
        ));
    }
    Nested::Map(vec![
        ("namespace", name),
        ("prefix", prefix),
        ("mode", mode),
        ("rules", Nested::List(rules)),
    ])
}
