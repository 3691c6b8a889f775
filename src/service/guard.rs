//! `LOCK.GUARD key fence command [arg ...]`: one command run only while `fence` is the current
//! holder's fence of the lock at `key`, atomically (nothing runs between the check and the
//! command). The inner command runs as the calling user, is replicated as itself, and its keys
//! are declared to the server (cluster routing, CROSSSLOT, ACL key patterns) through the
//! `getkeys-api`.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use redis_module::{raw, Context, RedisString};

use crate::error::LockError;
use crate::host::call::{self, call_as_caller, command_flags, reply_with};
use crate::host::command::CommandResult;
use crate::host::server::now_ms;
use crate::lock::locked;
use crate::metrics;
use crate::service::args;
use crate::service::value::in_key;

/// Where the first argument of the guarded command is.
const INNER: usize = 3;

/// `LOCK.GUARD key fence command [arg ...]`
pub fn guard(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, key_name, fence, inner @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    let [name, ..] = inner else {
        return Err(LockError::WrongArity);
    };
    let fence = args::fence(fence)?;
    refuse_unguardable(ctx, name)?;
    let current = {
        let key = ctx.open_key(key_name);
        let stored = in_key(&key)?;
        stored.is_some_and(|s| s.lock().fence_is_current(fence, now_ms()))
    };
    if !current {
        metrics::GUARD_REJECTS.incr();
        return Err(LockError::StaleFence);
    }
    metrics::GUARDED.incr();
    let reply = call_as_caller(ctx, inner)
        .map_err(|_| LockError::internal("the guarded command could not be called"));
    // The guarded command is the one thing a LOCK.* command runs that could change the
    // server's state as the context flags see it (none allowed today can: see
    // tests/review4.rs); whatever asks after it reads them afresh.
    crate::host::server::forget_flags();
    let reply = reply?;
    // The server words an ACL refusal inside RM_Call as a plain ERR; clients look for NOPERM.
    if call::error_text(&reply).is_some_and(|text| contains(&text, b"acl verification failed")) {
        return Err(LockError::GuardNoPerm);
    }
    Ok(reply_with(ctx, &reply))
}

/// A failed call: a fence that is no integer may be a token put there by mistake, and a guarded
/// LOCK.* command (always refused) carries its own token somewhere among its arguments.
pub fn secrets(args: &[RedisString]) -> Vec<usize> {
    let mut secrets = Vec::new();
    if args.get(2).is_some_and(|fence| args::fence(fence).is_err()) {
        secrets.push(2);
    }
    if args
        .get(INNER)
        .is_some_and(|name| is_lock_command(name.as_slice()))
    {
        secrets.extend(INNER + 1..args.len());
    }
    secrets
}

/// The keys of a LOCK.GUARD call: the lock's key (read), then the guarded command's own, as
/// the server finds them for that command.
pub fn keys(ctx: &Context, args: &[RedisString]) -> Vec<(usize, u32)> {
    let mut keys = vec![(
        1,
        raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    )];
    let Some(inner) = args.get(INNER..) else {
        return keys;
    };
    // A guarded LOCK.* is refused when run; asking for its keys could recurse without bound
    // (LOCK.GUARD k 1 LOCK.GUARD k 1 ...).
    if inner
        .first()
        .is_some_and(|name| is_lock_command(name.as_slice()))
    {
        return keys;
    }
    keys.extend(
        call::command_keys(ctx, inner)
            .into_iter()
            .map(|(position, flags)| (position + INNER, flags)),
    );
    keys
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn is_lock_command(name: &[u8]) -> bool {
    name.len() > 5 && name[..5].eq_ignore_ascii_case(b"lock.")
}

/// Why a command may not be guarded, by its lowercase name; commands the server does not know
/// are not remembered (RM_Call answers them with the server's own error).
static VERDICTS: LazyLock<Mutex<HashMap<Vec<u8>, Option<&'static str>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Refuses the commands LOCK.GUARD must not run: its own family, commands that block (they
/// would not wait inside it), and those scripts may not run (MULTI, EXEC, WATCH, EVAL, FCALL,
/// SUBSCRIBE, ...).
fn refuse_unguardable(ctx: &Context, name: &RedisString) -> Result<(), LockError> {
    let lower = name.as_slice().to_ascii_lowercase();
    if is_lock_command(&lower) {
        return Err(LockError::Unguardable("it is a LOCK.* command"));
    }
    if let Some(verdict) = locked(&VERDICTS).get(&lower) {
        return verdict.map_or(Ok(()), |why| Err(LockError::Unguardable(why)));
    }
    let Ok(text) = std::str::from_utf8(&lower) else {
        return Ok(());
    };
    let Some(flags) = command_flags(ctx, text) else {
        return Ok(());
    };
    let verdict = if flags.iter().any(|f| f == "blocking") {
        Some("it may block")
    } else if flags.iter().any(|f| f == "noscript") {
        Some("scripts may not run it (transactions, scripts, subscriptions, ...)")
    } else {
        None
    };
    locked(&VERDICTS).insert(lower, verdict);
    verdict.map_or(Ok(()), |why| Err(LockError::Unguardable(why)))
}
