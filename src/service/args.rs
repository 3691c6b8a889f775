//! Argument parsing for the LOCK.* commands: every refusal is a [`LockError`] naming the
//! argument, decided before anything changes.

use redis_module::{Context, RedisString};

use crate::config;
use crate::error::LockError;
use crate::host::keys::redact;
use crate::host::server::{is_replayed, parse_integer};

/// The longest wait a client may ask for (about 1,100 years): beyond it Redis' deadline
/// arithmetic would overflow. 0 means no limit.
const MAX_TIMEOUT_MS: i64 = 1 << 45;

/// A duration in ms: a positive integer.
fn duration(arg: &RedisString, name: &'static str) -> Result<u64, LockError> {
    let value = parse_integer(arg).ok_or(LockError::BadInteger {
        name,
        detail: "not an integer",
    })?;
    u64::try_from(value)
        .ok()
        .filter(|v| *v > 0)
        .ok_or(LockError::BadInteger {
            name,
            detail: "must be positive",
        })
}

/// A wait timeout in ms: 0 (no limit) or a positive integer.
pub fn timeout(arg: &RedisString) -> Result<u64, LockError> {
    let bad = |detail| LockError::BadInteger {
        name: "timeout-ms",
        detail,
    };
    let value = parse_integer(arg).ok_or(bad("not an integer"))?;
    if value > MAX_TIMEOUT_MS {
        return Err(bad("too large"));
    }
    u64::try_from(value).map_err(|_| bad("must not be negative"))
}

/// A lease length: a positive integer within `lock.max-ttl` (a limit for clients only).
pub fn ttl(ctx: &Context, arg: &RedisString) -> Result<u64, LockError> {
    let ttl = duration(arg, "ttl-ms")?;
    let max = config::MAX_TTL.get();
    if i64::try_from(ttl).map_or(true, |t| t > max) && !is_replayed(ctx) {
        return Err(LockError::TooLarge {
            name: "ttl-ms",
            config: "lock.max-ttl",
            max,
        });
    }
    Ok(ttl)
}

/// A token: not empty, within `lock.max-token-len` (a limit for clients only).
pub fn token<'a>(ctx: &Context, arg: &'a RedisString) -> Result<&'a [u8], LockError> {
    let token = arg.as_slice();
    if token.is_empty() {
        return Err(LockError::EmptyToken);
    }
    let max = config::MAX_TOKEN_LEN.get();
    if i64::try_from(token.len()).map_or(true, |len| len > max) && !is_replayed(ctx) {
        return Err(LockError::TokenTooLong { max });
    }
    Ok(token)
}

/// A fence: a positive integer.
pub fn fence(arg: &RedisString) -> Result<u64, LockError> {
    parse_integer(arg)
        .and_then(|f| u64::try_from(f).ok())
        .filter(|f| *f > 0)
        .ok_or(LockError::BadInteger {
            name: "fence",
            detail: "must be a positive integer",
        })
}

/// The options of `LOCK.ACQUIRE`, after key, token and ttl-ms.
#[derive(Default)]
pub struct AcquireOptions {
    pub wait: Option<u64>,
    pub reentrant: bool,
    pub session: bool,
}

impl AcquireOptions {
    /// Parses the options, the first of them at argument `first` (counted after the command
    /// name from 1). An unknown option is redacted from SLOWLOG and MONITOR, like the token: it
    /// may be one, put in the wrong place.
    pub fn parse(
        ctx: &Context,
        args: &[RedisString],
        first: usize,
    ) -> Result<AcquireOptions, LockError> {
        let mut options = AcquireOptions::default();
        let mut rest = args.iter().enumerate();
        while let Some((at, arg)) = rest.next() {
            let word = arg.as_slice();
            if word.eq_ignore_ascii_case(b"WAIT") {
                if options.wait.is_some() {
                    return Err(LockError::RepeatedOption("WAIT"));
                }
                let (_, value) = rest.next().ok_or(LockError::BadInteger {
                    name: "timeout-ms",
                    detail: "missing after WAIT",
                })?;
                options.wait = Some(timeout(value)?);
            } else if word.eq_ignore_ascii_case(b"REENTRANT") {
                if options.reentrant {
                    return Err(LockError::RepeatedOption("REENTRANT"));
                }
                options.reentrant = true;
            } else if word.eq_ignore_ascii_case(b"SESSION") {
                if options.session {
                    return Err(LockError::RepeatedOption("SESSION"));
                }
                options.session = true;
            } else {
                let position = first + at;
                redact(ctx, i32::try_from(position).unwrap_or(i32::MAX));
                return Err(LockError::UnknownOption { position });
            }
        }
        Ok(options)
    }
}
