//! Namespaces at run time (see `crate::policy` for the model): the policy `lock.namespaces`
//! puts in force, the admission of clients' requests by it, the counts of what each namespace
//! refused and warned about, and warn's audit lines at a bounded rate.
//!
//! Only clients' commands are held to a policy: effects from the primary and the AOF never
//! are. With no namespace defined, a request pays one look at an empty cell.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{Context, RedisString, RedisValue};
use sha2::{Digest, Sha256};

use crate::config;
use crate::error::LockError;
use crate::host::audit::{config_caller, describe_client};
use crate::host::command::{reply_nested, CommandResult, Nested};
use crate::host::config::{self as host_config, StringConfig};
use crate::host::log_notice;
use crate::host::server::{caller_id, is_replayed, now_ms};
use crate::policy::{settings, Asked, Enforcement, Namespace, Policy, Violation};

/// The rules a request can break, in the order of their counters.
pub const RULES: [&str; 10] = [
    "min-ttl",
    "max-ttl",
    "max-wait",
    "label",
    "session",
    "sync",
    "fsync",
    "modes",
    "max-limit",
    "max-waiters",
];

/// What one namespace refused (`enforce`) and let through (`warn`), per rule.
#[derive(Clone, Copy, Default)]
pub struct Counts {
    pub refused: [u64; RULES.len()],
    pub warned: [u64; RULES.len()],
}

struct Active {
    policy: Policy,
    /// Per namespace, in the policy's order.
    counts: Vec<Counts>,
}

/// How long a client's warnings of one rule in one namespace stay silent after an audit line.
const WARN_LINE_EVERY_MS: u64 = 60_000;
/// The most (client, namespace, rule) triples remembered for that; beyond, the memory is reset.
const WARN_LINES_KEPT: usize = 4096;

/// True while a policy with at least one namespace is in force: the one thing a request looks
/// at when there is none (a plain load; the thread-local cells below cost a call each in a
/// shared library).
static ANY: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The policy in force; `None` with no namespace.
    static ACTIVE: RefCell<Option<Active>> = const { RefCell::new(None) };
    /// When each (client, namespace, rule) last had its audit line.
    static WARN_LINES: RefCell<HashMap<(u64, usize, usize), u64>> = RefCell::new(HashMap::new());
    /// What every namespace ever defined since load refused and warned about, in all: the
    /// INFO totals keep counting when a policy is replaced.
    static TOTALS: RefCell<(u64, u64)> = const { RefCell::new((0, 0)) };
}

/// Puts the policy `text` in force (CONFIG SET, or the value given at load), keeping each namespace's counts
/// by name. The error says what is wrong; nothing changes then.
pub fn apply(text: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(text).map_err(|_| "not UTF-8 text".to_string())?;
    let policy = Policy::parse(text)?;
    ACTIVE.with(|cell| {
        let mut active = cell.borrow_mut();
        let old = active.take();
        ANY.store(!policy.is_empty(), Ordering::Relaxed);
        if policy.is_empty() {
            return;
        }
        let counts = policy
            .namespaces()
            .iter()
            .map(|namespace| {
                old.as_ref()
                    .and_then(|old| {
                        let at = old
                            .policy
                            .namespaces()
                            .iter()
                            .position(|n| n.name == namespace.name)?;
                        old.counts.get(at).copied()
                    })
                    .unwrap_or_default()
            })
            .collect();
        *active = Some(Active { policy, counts });
    });
    WARN_LINES.with(|lines| lines.borrow_mut().clear());
    Ok(())
}

/// `lock.namespaces` as a config: applies the text, and after the load logs the change with
/// who made it.
pub static CONFIG: StringConfig = StringConfig {
    name: config::NAMESPACES,
    apply: |text| {
        let before = digest();
        apply(text)?;
        if host_config::loaded() {
            let by = config_caller(config::NAMESPACES)
                .unwrap_or_else(|| "a client this server does not name to modules".to_string());
            let (namespaces, _, _) = totals();
            log_notice(&format!(
                "lock audit: CONFIG SET lock.namespaces from digest '{before}' to digest '{}' \
                 ({namespaces} namespaces: '{}') by {by}",
                digest(),
                text_of_policy()
            ));
        }
        Ok(())
    },
    text: text_of_policy,
};

fn text_of_policy() -> String {
    text()
}

/// The policy in force in its canonical form (CONFIG GET).
pub fn text() -> String {
    ACTIVE.with(|cell| {
        cell.borrow()
            .as_ref()
            .map(|active| active.policy.canonical().to_string())
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
    let namespaces = ACTIVE.with(|cell| {
        cell.borrow()
            .as_ref()
            .map_or(0, |active| active.policy.namespaces().len())
    });
    let (refused, warned) = TOTALS.with(|totals| *totals.borrow());
    (namespaces, refused, warned)
}

/// Holds a client's request on `key` to the key's namespace: `Err(POLICY ...)` when a
/// namespace in `enforce` mode refuses it; counted, and an audit line now and then, when one
/// in `warn` mode would have. Answers the namespace's lock-delay default for the grant (in a
/// namespace not `off`).
pub fn admit(
    ctx: &Context,
    key: &RedisString,
    asked: impl FnOnce() -> Asked,
) -> Result<Option<u64>, LockError> {
    if !ANY.load(Ordering::Relaxed) {
        return Ok(None);
    }
    judged(ctx, key.as_slice(), |namespace| namespace.check(&asked()))
}

/// True while some namespace is defined (a request with none is never looked at further).
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed)
}

/// [`admit`] for a request about to queue on `key` behind `queued` others (`max-waiters`).
pub fn admit_queued(ctx: &Context, key: &RedisString, queued: usize) -> Result<(), LockError> {
    if !ANY.load(Ordering::Relaxed) {
        return Ok(());
    }
    judged(ctx, key.as_slice(), |namespace| {
        namespace.check_queue(u64::try_from(queued).unwrap_or(u64::MAX))
    })
    .map(|_| ())
}

fn judged(
    ctx: &Context,
    key: &[u8],
    check: impl FnOnce(&Namespace) -> Option<Violation>,
) -> Result<Option<u64>, LockError> {
    if is_replayed(ctx) {
        return Ok(None);
    }
    ACTIVE.with(|cell| {
        let mut active = cell.borrow_mut();
        let Some(active) = active.as_mut() else {
            return Ok(None);
        };
        let Some((at, _)) = active.policy.position_of(key) else {
            return Ok(None);
        };
        let Some(namespace) = active.policy.namespaces().get(at) else {
            return Ok(None);
        };
        if namespace.mode == Enforcement::Off {
            return Ok(None);
        }
        let lock_delay = namespace.rules.lock_delay;
        let Some(violation) = check(namespace) else {
            return Ok(lock_delay);
        };
        let rule = RULES.iter().position(|r| *r == violation.rule).unwrap_or(0);
        let counts = active.counts.get_mut(at);
        match namespace.mode {
            Enforcement::Enforce => {
                if let Some(counts) = counts {
                    counts.refused[rule] += 1;
                }
                TOTALS.with(|totals| totals.borrow_mut().0 += 1);
                Err(LockError::Policy {
                    namespace: namespace.name.clone(),
                    detail: violation.detail,
                })
            }
            Enforcement::Warn | Enforcement::Off => {
                if let Some(counts) = counts {
                    counts.warned[rule] += 1;
                }
                TOTALS.with(|totals| totals.borrow_mut().1 += 1);
                warn_line(ctx, at, namespace, rule, &violation.detail);
                Ok(lock_delay)
            }
        }
    })
}

/// The audit line of a request a namespace in `warn` mode let through: one per client,
/// namespace and rule per [`WARN_LINE_EVERY_MS`].
fn warn_line(ctx: &Context, at: usize, namespace: &Namespace, rule: usize, detail: &str) {
    let client = caller_id(ctx);
    let now = now_ms();
    let due = WARN_LINES.with(|lines| {
        let mut lines = lines.borrow_mut();
        if lines.len() >= WARN_LINES_KEPT {
            lines.clear();
        }
        let last = lines.entry((client, at, rule)).or_insert(0);
        let due = *last == 0 || now.saturating_sub(*last) >= WARN_LINE_EVERY_MS;
        if due {
            *last = now.max(1);
        }
        due
    });
    if due {
        let by = if client == 0 {
            "a script".to_string()
        } else {
            describe_client(ctx, client)
        };
        log_notice(&format!(
            "lock audit: namespace {} (warn) would refuse a request by {by}: {detail} (one line \
             per client and rule a minute)",
            namespace.name
        ));
    }
}

/// Runs `f` with the policy in force and the counts of its namespaces (`None` without one).
pub fn with<R>(f: impl FnOnce(Option<(&Policy, &[Counts])>) -> R) -> R {
    ACTIVE.with(|cell| {
        let active = cell.borrow();
        f(active.as_ref().map(|a| (&a.policy, a.counts.as_slice())))
    })
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

fn list(active: Option<(&Policy, &[Counts])>) -> Vec<Nested> {
    let Some((policy, counts)) = active else {
        return Vec::new();
    };
    policy
        .namespaces()
        .iter()
        .zip(counts)
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

fn explain(active: Option<(&Policy, &[Counts])>, key: &[u8]) -> Nested {
    let found = active.and_then(|(policy, _)| policy.namespace_of(key));
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
    Nested::Map(vec![
        ("namespace", name),
        ("prefix", prefix),
        ("mode", mode),
        ("rules", Nested::List(rules)),
    ])
}
