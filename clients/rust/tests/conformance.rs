//! The shared table of cases (`clients/conformance/cases.json`) run on the Rust helper.
//!
//! Every helper in `clients/` runs the same table; `clients/conformance/README.md` describes the
//! format. One server for all cases, a fresh key per case; every failing case is named. Faults
//! are injected by `support::Faulty` (a connector) and `support::Pause` (the watchdog's
//! `before_renewal` hook). With `CONFORMANCE_RESULTS` set, each case's result is appended to
//! that file.

// The harness carries its own `#![allow(dead_code)]` as well.
#![allow(clippy::duplicated_attributes)]

#[allow(dead_code)]
#[path = "../../../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
mod support;

use std::collections::HashSet;
use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{lock_info, wait_for, Conn, Reply, Server};
use redis_lock_client::{Error, Lock, LockGuard, RetryPolicy};
use serde_json::{Map, Value};
use support::{calls, Fault, FaultKind, Faulty, Nth, Pause};

const HELPER: &str = "rust";
const CASE_FIELDS: &[&str] = &[
    "name",
    "lock",
    "server",
    "namespaces",
    "setup",
    "faults",
    "steps",
    "unrepresentable",
    "expect",
];
const LOCK_FIELDS: &[&str] = &[
    "ttl_ms",
    "wait_ms",
    "shared",
    "limit",
    "watchdog",
    "retry_attempts",
    "sync",
    "fsync_ms",
];
const EXPECT_FIELDS: &[&str] = &[
    "acquire",
    "reason",
    "message",
    "namespace",
    "detail",
    "within_ms",
    "on_lost_calls",
    "sent",
    "one_token",
];
const FAULT_FIELDS: &[&str] = &["at", "nth", "fault", "error"];
/// Each step and the fields it takes besides `do`.
const STEPS: &[(&str, &[&str])] = &[
    ("server", &["command"]),
    ("wait-server-expiry", &[]),
    ("check-lost", &["expect"]),
    ("release", &["expect"]),
    ("check-server", &["expect"]),
    ("wait-sent", &["command", "count"]),
    ("wait-paused", &[]),
    ("resume", &[]),
    ("wait-lost-reported", &[]),
];
/// Steps that use the helper's grant; the others may follow an acquire that granted nothing.
const GRANT_STEPS: &[&str] = &[
    "check-lost",
    "release",
    "wait-sent",
    "wait-paused",
    "resume",
    "wait-lost-reported",
];
/// The commands whose third word is the helper's token.
const TOKEN_COMMANDS: &[&str] = &["LOCK.ACQUIRE", "LOCK.RENEW", "LOCK.RELEASE"];

fn load_cases() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/cases.json");
    let text = std::fs::read_to_string(&path).expect("read cases.json");
    let table: Value = serde_json::from_str(&text).expect("cases.json is JSON");
    assert_eq!(table["format"], 1, "{}: unknown format", path.display());
    table["cases"].as_array().expect("cases").clone()
}

fn object(value: &Value) -> &Map<String, Value> {
    value.as_object().expect("an object")
}

/// The entries of a case's list `field` (none when the case has no such field).
fn list<'a>(case: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    case.get(field)
        .map(|v| v.as_array().expect("a list"))
        .into_iter()
        .flatten()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .expect("a list of strings")
        .iter()
        .map(|word| word.as_str().expect("a string").to_string())
        .collect()
}

/// The case's faults: those on commands, for `Faulty`, and the watchdog's pause, if any.
fn faults(case: &Value) -> Result<(Vec<Fault>, Option<Pause>), String> {
    let mut on_commands = Vec::new();
    let mut pause = None;
    for fault in list(case, "faults") {
        let at = fault["at"].as_str().expect("at").to_string();
        let nth = match &fault["nth"] {
            Value::String(every) if every == "every" => Nth::Every,
            Value::Number(n) => Nth::These(vec![n.as_u64().expect("nth") as usize]),
            Value::Array(ns) => Nth::These(
                ns.iter()
                    .map(|n| n.as_u64().expect("nth") as usize)
                    .collect(),
            ),
            other => return Err(format!("nth {other}")),
        };
        let kind = match (fault["fault"].as_str(), fault["error"].as_str()) {
            (Some("pause"), None) if at == "watchdog" => {
                let Nth::These(ns) = &nth else {
                    return Err("a pause takes one nth".to_string());
                };
                // The watchdog's rounds count from 0.
                pause = Some(Pause::at_round(ns[0] as u32 - 1));
                continue;
            }
            (Some("drop-reply"), None) => FaultKind::DropReply,
            (Some("reply-error"), Some(text)) => FaultKind::ReplyError(text.to_string()),
            _ => return Err(format!("unknown fault {fault}")),
        };
        on_commands.push(Fault { at, nth, kind });
    }
    Ok((on_commands, pause))
}

/// Lets a paused watchdog go when a case ends, passed or not.
struct GoOnDrop(Option<Pause>);

impl Drop for GoOnDrop {
    fn drop(&mut self) {
        if let Some(pause) = &self.0 {
            pause.go();
        }
    }
}

/// What acquiring came to, in the table's words: (outcome, detail).
fn outcome(result: &Result<LockGuard, Error>) -> (&'static str, String) {
    match result {
        Ok(guard) => ("granted", guard.fence().to_string()),
        Err(Error::Invalid(why)) => ("refused", why.reason().to_string()),
        Err(Error::NotAcquired) => ("not-acquired", String::new()),
        Err(Error::Connection(e)) => ("connection-error", e.to_string()),
        Err(Error::Unknown(e)) => ("unknown", e.to_string()),
        // The redis crate words a known error code its own way ("Moved: ..."): add the code.
        Err(Error::Redis(e)) => ("server-error", format!("{} {e}", e.code().unwrap_or(""))),
        // The namespace, a tab, the rule.
        Err(Error::Policy { namespace, detail }) => ("policy", format!("{namespace}\t{detail}")),
        Err(other) => ("other", other.to_string()),
    }
}

struct Runner {
    server: Server,
    admin: Conn,
}

impl Runner {
    fn held(&mut self, key: &str) -> bool {
        lock_info(&mut self.admin, key).is_some_and(|fields| {
            fields
                .iter()
                .any(|(name, value)| name == "state" && value.text() == "held")
        })
    }

    /// Runs one case, with its `namespaces` policy in force if it has one; Err says what
    /// differs from the table.
    fn run(&mut self, case: &Value, serial: usize) -> Result<(), String> {
        let Some(policy) = case.get("namespaces") else {
            return self.run_case(case, serial);
        };
        let name = case["name"].as_str().expect("name");
        let policy = policy
            .as_str()
            .expect("namespaces")
            .replace("$KEY", &format!("conformance:{name}:{serial}"));
        let set = |runner: &mut Runner, text: &str| {
            let words = ["CONFIG", "SET", "lock.namespaces", text].map(String::from);
            match runner.admin.call(&words) {
                Reply::Error(e) => Err(format!("CONFIG SET lock.namespaces {text:?}: {e}")),
                _ => Ok(()),
            }
        };
        set(self, &policy)?;
        let outcome = self.run_case(case, serial);
        // The server is shared by every case: its policy is cleared whatever the case did.
        let cleared = set(self, "");
        outcome.and(cleared)
    }

    fn run_case(&mut self, case: &Value, serial: usize) -> Result<(), String> {
        let name = case["name"].as_str().expect("name");
        let settings = object(&case["lock"]);
        let int = |field: &str| settings.get(field).map(|v| v.as_i64().expect("an integer"));
        let flag = |field: &str| settings.get(field).is_some_and(|v| v == true);
        let ttl_ms = int("ttl_ms").expect("ttl_ms");
        let wait_ms = int("wait_ms");
        // SYNC's (numreplicas, timeout-ms).
        let sync = settings.get("sync").map(|v| {
            let pair = v.as_array().expect("sync: [numreplicas, timeout_ms]");
            let at = |i: usize| pair[i].as_i64().expect("an integer");
            (at(0), at(1))
        });
        let fsync_ms = int("fsync_ms");
        let unrepresentable = case.get("unrepresentable").map(strings).unwrap_or_default();
        let negative = ttl_ms < 0
            || wait_ms.is_some_and(|w| w < 0)
            || sync.is_some_and(|(replicas, ms)| replicas < 0 || ms < 0)
            || fsync_ms.is_some_and(|ms| ms < 0);
        if unrepresentable.iter().any(|h| h == HELPER) {
            // A Duration (and SYNC's u32 replicas) is never negative: the input cannot reach
            // the helper at all.
            return if negative {
                Ok(())
            } else {
                Err("marked unrepresentable, but every input fits a Duration".to_string())
            };
        }
        if negative {
            return Err("a negative duration, not marked unrepresentable for rust".to_string());
        }
        let key = format!("conformance:{name}:{serial}");
        let with_key = |words: Vec<String>| -> Vec<String> {
            words.into_iter().map(|w| w.replace("$KEY", &key)).collect()
        };
        for command in list(case, "setup") {
            let reply = self.admin.call(&with_key(strings(command)));
            if let Reply::Error(e) = reply {
                return Err(format!("setup {command}: {e}"));
            }
        }
        let url = match case
            .get("server")
            .and_then(Value::as_str)
            .unwrap_or("running")
        {
            "running" => format!("redis://127.0.0.1:{}/", self.server.port),
            "closed-port" => {
                let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
                let port = listener.local_addr().expect("addr").port();
                drop(listener); // nothing listens on it now
                format!("redis://127.0.0.1:{port}/")
            }
            other => return Err(format!("unknown server {other:?}")),
        };
        let (command_faults, pause) = faults(case)?;
        let connector = Faulty::new(redis::Client::open(url).expect("client"), command_faults);
        let lost_calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&lost_calls);
        let mut lock = Lock::new(
            connector.clone(),
            key.clone(),
            Duration::from_millis(ttl_ms.unsigned_abs()),
        )
        .on_lost(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        if let Some(pause) = &pause {
            lock = lock.before_renewal(pause.hook());
        }
        if let Some(ms) = wait_ms {
            // As the server's WAIT: 0 waits without limit.
            lock = if ms == 0 {
                lock.wait_forever()
            } else {
                lock.wait(Duration::from_millis(ms.unsigned_abs()))
            };
        }
        if flag("shared") {
            lock = lock.shared();
        }
        if let Some(permits) = int("limit") {
            lock = lock.limit(u32::try_from(permits).map_err(|e| e.to_string())?);
        }
        if flag("watchdog") {
            lock = lock.watchdog(true);
        }
        if let Some((replicas, ms)) = sync {
            let replicas = u32::try_from(replicas).map_err(|e| e.to_string())?;
            lock = lock.sync(replicas, Duration::from_millis(ms.unsigned_abs()));
        }
        if let Some(ms) = fsync_ms {
            lock = lock.fsync(Duration::from_millis(ms.unsigned_abs()));
        }
        if let Some(attempts) = int("retry_attempts") {
            lock = lock.retry(RetryPolicy {
                attempts: u32::try_from(attempts).map_err(|e| e.to_string())?,
                ..RetryPolicy::default()
            });
        }

        let expect = object(&case["expect"]);
        let acquires_before = calls(&self.server, "lock.acquire");
        let start = Instant::now();
        let result = lock.acquire();
        let elapsed = start.elapsed();
        let (got, detail) = outcome(&result);
        let mut guard = result.ok();
        // Declared after the guard, so dropped first: a paused watchdog goes on before the
        // guard's drop waits for it.
        let _go = GoOnDrop(pause.clone());
        let wanted = expect["acquire"].as_str().expect("acquire");
        if got != wanted {
            return Err(format!("acquire: {got} ({detail}), table says {wanted}"));
        }
        if got == "refused" {
            if detail != expect["reason"] {
                return Err(format!(
                    "reason {detail:?}, table says {}",
                    expect["reason"]
                ));
            }
            if calls(&self.server, "lock.acquire") != acquires_before {
                return Err("refused, but a LOCK.ACQUIRE reached the server".to_string());
            }
        }
        if got == "server-error" {
            let message = expect["message"].as_str().expect("message");
            if !detail.contains(message) {
                return Err(format!("server error {detail:?} lacks {message:?}"));
            }
        }
        if got == "policy" {
            let (namespace, rule) = detail.split_once('\t').expect("namespace and rule");
            if expect["namespace"] != namespace {
                return Err(format!(
                    "policy of namespace {namespace:?}, table says {}",
                    expect["namespace"]
                ));
            }
            let wanted = expect.get("detail").and_then(Value::as_str).unwrap_or("");
            if !rule.contains(wanted) {
                return Err(format!("policy rule {rule:?} lacks {wanted:?}"));
            }
        }
        if let Some(bound) = expect.get("within_ms").and_then(Value::as_u64) {
            if elapsed >= Duration::from_millis(bound) {
                return Err(format!("took {elapsed:?}, table says under {bound} ms"));
            }
        }
        let fence = guard.as_ref().map(LockGuard::fence);
        for step in list(case, "steps") {
            let action = step["do"].as_str().expect("do");
            if guard.is_none() && fence.is_none() && GRANT_STEPS.contains(&action) {
                return Err(format!("step {step} needs a grant"));
            }
            match action {
                "server" => {
                    if let Reply::Error(e) = self.admin.call(&with_key(strings(&step["command"]))) {
                        return Err(format!("step {step}: {e}"));
                    }
                }
                "wait-server-expiry" => {
                    wait_for("the lease to end on the server", || {
                        (!self.held(&key)).then_some(())
                    });
                }
                "check-server" => {
                    let info = lock_info(&mut self.admin, &key);
                    for (field, wanted) in object(&step["expect"]) {
                        let wanted = match wanted {
                            Value::String(f) if f == "$FENCE" => Value::from(fence.expect("fence")),
                            other => other.clone(),
                        };
                        let got = match (&info, field.as_str()) {
                            (None, "state") => Value::from("none"),
                            (None, _) => Value::Null,
                            (Some(fields), _) => fields
                                .iter()
                                .find(|(name, _)| name == field)
                                .map_or(Value::Null, |(_, reply)| match reply {
                                    Reply::Int(n) => Value::from(*n),
                                    other => Value::from(other.text()),
                                }),
                        };
                        if got != wanted {
                            return Err(format!("LOCK.INFO {field} is {got}, step {step}"));
                        }
                    }
                }
                "check-lost" => {
                    let Some(held) = guard.as_ref() else {
                        return Err(format!("step {step} after the release"));
                    };
                    if held.is_lost() != step["expect"] {
                        return Err(format!("is_lost() {}, step {step}", held.is_lost()));
                    }
                }
                "release" => {
                    let Some(held) = guard.take() else {
                        return Err(format!("step {step} after the release"));
                    };
                    match held.release() {
                        Ok(r) if r == step["expect"] => {}
                        other => return Err(format!("release {other:?}, step {step}")),
                    }
                }
                "wait-sent" => {
                    let command = step["command"].as_str().expect("command");
                    let count = step["count"].as_u64().expect("count") as usize;
                    wait_for(&format!("{count} {command} sent"), || {
                        (connector.count(command) >= count).then_some(())
                    });
                }
                "wait-paused" => match &pause {
                    Some(pause) => pause.wait_reached(),
                    None => return Err("wait-paused without a pause fault".to_string()),
                },
                "resume" => {
                    if let Some(pause) = &pause {
                        pause.go();
                    }
                }
                "wait-lost-reported" => {
                    wait_for("on_lost to be called", || {
                        (lost_calls.load(Ordering::SeqCst) > 0).then_some(())
                    });
                }
                other => return Err(format!("unknown step {other:?}")),
            }
        }
        drop(_go);
        drop(guard);
        let wanted_calls = expect
            .get("on_lost_calls")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let got_calls = lost_calls.load(Ordering::SeqCst) as u64;
        if got_calls != wanted_calls {
            return Err(format!(
                "on_lost called {got_calls} times, table says {wanted_calls}"
            ));
        }
        for (command, count) in expect.get("sent").map(object).into_iter().flatten() {
            let sent = connector.count(command) as u64;
            if Some(sent) != count.as_u64() {
                return Err(format!("{sent} {command} sent, table says {count}"));
            }
        }
        if expect.get("one_token").is_some_and(|v| v == true) {
            let tokens: HashSet<String> = connector
                .commands()
                .into_iter()
                .filter(|words| TOKEN_COMMANDS.contains(&words[0].to_uppercase().as_str()))
                .map(|words| words[2].clone())
                .collect();
            if tokens.len() != 1 {
                return Err(format!("{} tokens, table says one", tokens.len()));
            }
        }
        Ok(())
    }
}

#[test]
fn the_table_is_well_formed() {
    let cases = load_cases();
    let mut names: Vec<&str> = cases
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), count, "case names are unique");
    for case in &cases {
        let name = &case["name"];
        for (value, allowed) in [
            (case, CASE_FIELDS),
            (&case["lock"], LOCK_FIELDS),
            (&case["expect"], EXPECT_FIELDS),
        ] {
            for field in object(value).keys() {
                assert!(
                    allowed.contains(&field.as_str()),
                    "{name}: unknown field {field}"
                );
            }
        }
        for fault in list(case, "faults") {
            for field in object(fault).keys() {
                assert!(
                    FAULT_FIELDS.contains(&field.as_str()),
                    "{name}: unknown fault field {field}"
                );
            }
        }
        assert!(faults(case).is_ok(), "{name}: {:?}", faults(case).err());
        for step in list(case, "steps") {
            let action = step["do"].as_str().expect("do");
            let (_, fields) = STEPS
                .iter()
                .find(|(known, _)| *known == action)
                .unwrap_or_else(|| panic!("{name}: unknown step {action}"));
            let mut got: Vec<&str> = object(step)
                .keys()
                .map(String::as_str)
                .filter(|f| *f != "do")
                .collect();
            got.sort_unstable();
            let mut wanted = fields.to_vec();
            wanted.sort_unstable();
            assert_eq!(got, wanted, "{name}: the fields of step {action}");
        }
    }
}

#[test]
fn every_case_of_the_shared_table() {
    let cases = load_cases();
    assert!(!cases.is_empty());
    let server = Server::start();
    let admin = server.conn();
    let mut runner = Runner { server, admin };
    let mut results = std::env::var_os("CONFORMANCE_RESULTS").map(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("CONFORMANCE_RESULTS")
    });
    let failures: Vec<String> = cases
        .iter()
        .enumerate()
        .filter_map(|(serial, case)| {
            let name = case["name"].as_str().expect("name");
            let outcome = runner.run(case, serial);
            if let Some(out) = results.as_mut() {
                let skipped = case
                    .get("unrepresentable")
                    .map(strings)
                    .unwrap_or_default()
                    .iter()
                    .any(|h| h == HELPER);
                let result = match (&outcome, skipped) {
                    (Err(_), _) => "fail",
                    (Ok(()), true) => "skip",
                    (Ok(()), false) => "pass",
                };
                writeln!(out, "{HELPER}\t{name}\t{result}").expect("CONFORMANCE_RESULTS");
            }
            outcome.err().map(|why| format!("{name}: {why}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "failing cases:\n{}",
        failures.join("\n")
    );
}
