//! The audit log: what an operator changed, or the module undid for a client, written to the
//! server log at notice level with who did it and the key, never a token. Lines start with
//! `lock audit:` so they can be found and shipped.

use redis_module::Context;

use crate::config::NumericConfig;
use crate::host::audit::{config_caller, describe_client};
use crate::host::log_notice;
use crate::host::server::caller_id;
use crate::lock::core::Grant;

/// Bytes for a log line: printable ASCII as is, anything else (and `\`) as `\xNN`, quoted.
fn quoted(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() + 2);
    text.push('\'');
    for byte in bytes {
        if byte.is_ascii_graphic() && *byte != b'\\' && *byte != b'\'' || *byte == b' ' {
            text.push(char::from(*byte));
        } else {
            text.push_str(&format!("\\x{byte:02x}"));
        }
    }
    text.push('\'');
    text
}

/// Who a hold was granted to, as recorded with it.
fn holder(fence: u64, grant: &Grant, now: u64) -> String {
    let held = if grant.since == 0 {
        "unknown".to_string()
    } else {
        format!("{} ms", now.saturating_sub(grant.since))
    };
    format!(
        "fence {fence} (granted to id={} name={} addr={} label={}, held {held})",
        grant.client,
        quoted(grant.name()),
        quoted(grant.addr()),
        quoted(grant.label()),
    )
}

/// The client running the current command (a script's is not named: see `caller_id`).
fn caller(ctx: &Context) -> String {
    match caller_id(ctx) {
        0 => "a script".to_string(),
        client => describe_client(ctx, client),
    }
}

/// A `lock.*` config was set (after load).
pub fn config_changed(config: &'static NumericConfig, old: i64, new: i64) {
    let by = config_caller(config.name)
        .unwrap_or_else(|| "a client this server does not name to modules".to_string());
    log_notice(&format!(
        "lock audit: CONFIG SET lock.{} from {old} to {new} by {by}",
        config.name
    ));
}

/// LOCK.FORCERELEASE of `key`: the holds it ended (fence and grant), whether it ended a
/// lock-delay.
pub fn force_released(
    ctx: &Context,
    key: &[u8],
    ended: &[(u64, Grant)],
    delay_ended: bool,
    now: u64,
) {
    let what = if ended.is_empty() {
        "found no holder".to_string()
    } else {
        let holds: Vec<String> = ended.iter().map(|(f, g)| holder(*f, g, now)).collect();
        format!("ended {}", holds.join(", "))
    };
    let delay = if delay_ended { " and a lock-delay" } else { "" };
    log_notice(&format!(
        "lock audit: LOCK.FORCERELEASE {} {what}{delay} by {}",
        quoted(key),
        caller(ctx)
    ));
}

/// Why a SYNC or FSYNC grant was taken back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakenBack {
    /// Too few replicas acknowledged it in time.
    Replicas,
    /// It was not fsynced to the AOF in time.
    NotFsynced,
    /// Its client left (or its wait was cut short) before it was confirmed.
    ClientGone,
}

/// A SYNC or FSYNC grant of `key` was taken back, and why: the operator is sent to the replicas
/// only when they are the reason, to the disk when the fsync is.
pub fn taken_back(key: &[u8], fence: u64, grant: &Grant, now: u64, why: TakenBack) {
    let reason = match why {
        TakenBack::Replicas => {
            "SYNC grant of {key} taken back, its replicas did not acknowledge it in time"
        }
        TakenBack::NotFsynced => {
            "FSYNC grant of {key} taken back, it was not fsynced to this server's AOF in time \
             (see lock_fsync_errors and the lock FSYNC lines of this log)"
        }
        TakenBack::ClientGone => {
            "SYNC/FSYNC grant of {key} taken back, its client left before it was confirmed"
        }
    };
    log_notice(&format!(
        "lock audit: {}: {}",
        reason.replace("{key}", &quoted(key)),
        holder(fence, grant, now)
    ));
}
