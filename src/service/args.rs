//! Argument parsing for the LOCK.* commands: every refusal is a [`LockError`] naming the
//! argument, decided before anything changes.

use redis_module::{Context, RedisString};

use crate::config;
use crate::error::LockError;
use crate::host::server::{in_script, is_replayed, parse_integer};
use crate::lock::core::{valid_label, Mode, TokenDigest, MAX_HOLDERS, MAX_LABEL_LEN};
use crate::lock::queues::SyncRequest;
use crate::policy::{Asked, Kind};

/// The longest wait a client may ask for (about 1,100 years): beyond it Redis' deadline
/// arithmetic would overflow. 0 means no limit.
const MAX_TIMEOUT_MS: i64 = 1 << 45;

/// A duration in ms: a positive integer.
pub fn duration(arg: &RedisString, name: &'static str) -> Result<u64, LockError> {
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

/// A token: not empty, within `lock.max-token-len` (a limit for clients only); what the module
/// keeps of it is its digest, taken here.
pub fn token(ctx: &Context, arg: &RedisString) -> Result<TokenDigest, LockError> {
    let token = arg.as_slice();
    if token.is_empty() {
        return Err(LockError::EmptyToken);
    }
    let max = config::MAX_TOKEN_LEN.get();
    if i64::try_from(token.len()).map_or(true, |len| len > max) && !is_replayed(ctx) {
        return Err(LockError::TokenTooLong { max });
    }
    Ok(TokenDigest::of(token))
}

/// A lock-delay in ms: 0 (none) or a positive integer within `lock.max-ttl` (a limit for
/// clients only).
fn lock_delay(arg: &RedisString, replayed: bool) -> Result<u64, LockError> {
    let bad = |detail| LockError::BadInteger {
        name: "lock-delay",
        detail,
    };
    let value = parse_integer(arg).ok_or(bad("not an integer"))?;
    let delay = u64::try_from(value).map_err(|_| bad("must not be negative"))?;
    let max = config::MAX_TTL.get();
    if value > max && !replayed {
        return Err(LockError::TooLarge {
            name: "lock-delay",
            config: "lock.max-ttl",
            max,
        });
    }
    Ok(delay)
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

/// `numreplicas timeout-ms` after the word SYNC.
fn sync_option<'a>(
    rest: &mut impl Iterator<Item = (usize, &'a RedisString)>,
) -> Result<SyncRequest, LockError> {
    let mut next = |name| {
        rest.next()
            .map(|(_, arg)| arg)
            .ok_or(LockError::BadInteger {
                name,
                detail: "missing after SYNC",
            })
    };
    let replicas = next("numreplicas")?;
    let replicas = parse_integer(replicas).ok_or(LockError::BadInteger {
        name: "numreplicas",
        detail: "not an integer",
    })?;
    let replicas = u64::try_from(replicas).map_err(|_| LockError::BadInteger {
        name: "numreplicas",
        detail: "must not be negative",
    })?;
    let timeout_ms = reply_timeout(next("SYNC timeout-ms")?, "SYNC timeout-ms")?;
    Ok(SyncRequest {
        replicas,
        timeout_ms,
        fsync_ms: None,
    })
}

/// `timeout-ms` after the word FSYNC.
fn fsync_option<'a>(
    rest: &mut impl Iterator<Item = (usize, &'a RedisString)>,
) -> Result<u64, LockError> {
    let value = value_after(rest, "FSYNC timeout-ms", "missing after FSYNC")?;
    reply_timeout(value, "FSYNC timeout-ms")
}

/// How long a reply may wait (SYNC, FSYNC): a positive integer up to WAIT's bound.
fn reply_timeout(arg: &RedisString, name: &'static str) -> Result<u64, LockError> {
    let timeout_ms = duration(arg, name)?;
    if timeout_ms > MAX_TIMEOUT_MS as u64 {
        return Err(LockError::BadInteger {
            name,
            detail: "too large",
        });
    }
    Ok(timeout_ms)
}

/// A named option was given twice.
fn once<T>(slot: &Option<T>, name: &'static str) -> Result<(), LockError> {
    match slot {
        Some(_) => Err(LockError::RepeatedOption(name)),
        None => Ok(()),
    }
}

/// Sets a flag option (a word alone), refusing it twice.
fn set_flag(flag: &mut bool, name: &'static str) -> Result<(), LockError> {
    if *flag {
        return Err(LockError::RepeatedOption(name));
    }
    *flag = true;
    Ok(())
}

/// The value following an option's word; `missing` says which word when there is none.
fn value_after<'a>(
    rest: &mut impl Iterator<Item = (usize, &'a RedisString)>,
    name: &'static str,
    missing: &'static str,
) -> Result<&'a RedisString, LockError> {
    rest.next()
        .map(|(_, value)| value)
        .ok_or(LockError::BadInteger {
            name,
            detail: missing,
        })
}

/// An unknown option at `position`: never echoed (it may be a token put in the wrong place; the
/// failed call redacts it, see `Command::secret_on_error`).
fn unknown(position: usize, expected: &'static str) -> LockError {
    LockError::UnknownOption { position, expected }
}

/// `LIMIT n`: a number of permits, 1 to [`MAX_HOLDERS`].
fn limit(arg: &RedisString) -> Result<u32, LockError> {
    let value = parse_integer(arg).ok_or(LockError::BadInteger {
        name: "limit",
        detail: "not an integer",
    })?;
    u32::try_from(value)
        .ok()
        .filter(|n| (1..=MAX_HOLDERS).contains(n))
        .ok_or(LockError::BadInteger {
            name: "limit",
            detail: "must be between 1 and 10000",
        })
}

/// The options of `LOCK.ACQUIRE`, after key, token and ttl-ms.
#[derive(Default)]
pub struct AcquireOptions {
    pub wait: Option<u64>,
    pub reentrant: bool,
    pub session: bool,
    pub sync: Option<SyncRequest>,
    /// `LOCKDELAY ms`; `lock.lock-delay` applies when absent (see [`AcquireOptions::delay`]).
    pub lock_delay: Option<u64>,
    /// `SHARED`: a shared hold.
    pub shared: bool,
    /// `LIMIT n`: a permit of a semaphore of n permits.
    pub limit: Option<u32>,
    /// `LABEL text`: the hold's public label (see [`label`]).
    pub label: Option<Box<[u8]>>,
}

/// The refusal of a LABEL (also one with nothing after it).
const BAD_LABEL: LockError = LockError::BadLabel { max: MAX_LABEL_LEN };

/// `LABEL text`: printable ASCII without spaces, within `MAX_LABEL_LEN` bytes.
fn label(arg: &RedisString) -> Result<Box<[u8]>, LockError> {
    let label = arg.as_slice();
    if label.is_empty() || !valid_label(label) {
        return Err(BAD_LABEL);
    }
    Ok(label.into())
}

impl AcquireOptions {
    /// The lock-delay of a grant: the option, or `namespace`'s default (the key's namespace
    /// gives it: see `service::policy::admit`), or `lock.lock-delay`; none for shared holds
    /// and permits.
    pub fn delay(&self, namespace: Option<u64>) -> u64 {
        if self.mode() != Mode::Exclusive {
            return 0;
        }
        self.lock_delay
            .or(namespace)
            .unwrap_or_else(|| u64::try_from(config::LOCK_DELAY.get()).unwrap_or(0))
    }

    /// What the request asks for a lease of `ttl`, as a namespace's rules read it.
    pub fn asked(&self, ttl: u64) -> Asked<'_> {
        Asked {
            ttl,
            wait: self.wait,
            label: self.label.as_deref(),
            session: self.session,
            sync: self
                .sync
                .filter(|s| s.replicas > 0)
                .map(|s| u32::try_from(s.replicas).unwrap_or(u32::MAX)),
            fsync: self.sync.is_some_and(|s| s.fsync_ms.is_some()),
            kind: Some(match self.mode() {
                Mode::Exclusive => Kind::Exclusive,
                Mode::Shared => Kind::Shared,
                Mode::Permit(_) => Kind::Semaphore,
            }),
            limit: self.limit,
            renewal: false,
        }
    }

    /// The kind of hold asked for: LIMIT makes it a permit (SHARED beside it changes nothing).
    pub fn mode(&self) -> Mode {
        match (self.limit, self.shared) {
            (Some(limit), _) => Mode::Permit(limit),
            (None, true) => Mode::Shared,
            (None, false) => Mode::Exclusive,
        }
    }

    /// Parses the options, the first of them at argument `first` (counted after the command
    /// name from 1); `replayed`: from the primary or the AOF, where no client limit applies.
    pub fn parse(
        args: &[RedisString],
        first: usize,
        replayed: bool,
    ) -> Result<AcquireOptions, LockError> {
        let mut options = AcquireOptions::default();
        let mut fsync = None;
        let mut rest = args.iter().enumerate();
        while let Some((at, arg)) = rest.next() {
            let word = arg.as_slice();
            if word.eq_ignore_ascii_case(b"WAIT") {
                once(&options.wait, "WAIT")?;
                let value = value_after(&mut rest, "timeout-ms", "missing after WAIT")?;
                options.wait = Some(timeout(value)?);
            } else if word.eq_ignore_ascii_case(b"REENTRANT") {
                set_flag(&mut options.reentrant, "REENTRANT")?;
            } else if word.eq_ignore_ascii_case(b"SESSION") {
                set_flag(&mut options.session, "SESSION")?;
            } else if word.eq_ignore_ascii_case(b"SYNC") {
                once(&options.sync, "SYNC")?;
                options.sync = Some(sync_option(&mut rest)?);
            } else if word.eq_ignore_ascii_case(b"FSYNC") {
                once(&fsync, "FSYNC")?;
                fsync = Some(fsync_option(&mut rest)?);
            } else if word.eq_ignore_ascii_case(b"LOCKDELAY") {
                once(&options.lock_delay, "LOCKDELAY")?;
                let value = value_after(&mut rest, "lock-delay", "missing after LOCKDELAY")?;
                options.lock_delay = Some(lock_delay(value, replayed)?);
            } else if word.eq_ignore_ascii_case(b"SHARED") {
                set_flag(&mut options.shared, "SHARED")?;
            } else if word.eq_ignore_ascii_case(b"LIMIT") {
                once(&options.limit, "LIMIT")?;
                options.limit = Some(limit(value_after(
                    &mut rest,
                    "limit",
                    "missing after LIMIT",
                )?)?);
            } else if word.eq_ignore_ascii_case(b"LABEL") {
                once(&options.label, "LABEL")?;
                let value = rest.next().map(|(_, value)| value);
                options.label = Some(label(value.ok_or(BAD_LABEL)?)?);
            } else {
                return Err(unknown(
                    first + at,
                    "WAIT, REENTRANT, SESSION, SYNC, FSYNC, LOCKDELAY, SHARED, LIMIT or LABEL",
                ));
            }
        }
        options.sync = SyncRequest::with_fsync(options.sync, fsync);
        if options.lock_delay.is_some() && options.mode() != Mode::Exclusive {
            return Err(LockError::ExclusiveOnly("LOCKDELAY"));
        }
        Ok(options)
    }
}

/// The options of `LOCK.RENEW`, after key, token and ttl-ms: `[SYNC numreplicas timeout-ms]
/// [FSYNC timeout-ms]`.
pub fn renew_options(args: &[RedisString], first: usize) -> Result<Option<SyncRequest>, LockError> {
    let (mut sync, mut fsync) = (None, None);
    let mut rest = args.iter().enumerate();
    while let Some((at, arg)) = rest.next() {
        let word = arg.as_slice();
        if word.eq_ignore_ascii_case(b"SYNC") {
            once(&sync, "SYNC")?;
            sync = Some(sync_option(&mut rest)?);
        } else if word.eq_ignore_ascii_case(b"FSYNC") {
            once(&fsync, "FSYNC")?;
            fsync = Some(fsync_option(&mut rest)?);
        } else {
            return Err(unknown(first + at, "SYNC or FSYNC"));
        }
    }
    Ok(SyncRequest::with_fsync(sync, fsync))
}

/// SESSION needs a connection to close: a script's client never does.
pub fn check_session(ctx: &Context, session: bool) -> Result<(), LockError> {
    if session && in_script(ctx) {
        return Err(LockError::SessionInScript);
    }
    Ok(())
}

/// True when `args` (a whole `LOCK.ACQUIRE` or `LOCK.RENEW key token ttl-ms [options]` call,
/// the command name first) has its shape: an integer ttl-ms where it belongs. A call that forgot
/// its key, or swapped arguments, has its token elsewhere, perhaps first.
pub fn has_ttl_in_place(args: &[RedisString]) -> bool {
    args.get(3)
        .is_some_and(|ttl| duration(ttl, "ttl-ms").is_ok())
}

/// The options of `LOCK.LIST`, after the cursor.
pub struct ListOptions {
    /// SCAN's COUNT.
    pub count: usize,
    pub namespace: Option<String>,
    pub older_ms: Option<u64>,
    pub waiting: bool,
}

/// COUNT without the option: SCAN's own default.
const LIST_DEFAULT_COUNT: usize = 10;
/// The largest COUNT: the work of one call stays bounded whatever the caller asks.
const LIST_MAX_COUNT: usize = 10_000;

/// Parses `[NAMESPACE name] [OLDER ms] [WAITING] [COUNT count]`, the first at argument `first`.
pub fn list_options(args: &[RedisString], first: usize) -> Result<ListOptions, LockError> {
    let (mut count, mut namespace, mut older_ms) = (None, None, None);
    let mut waiting = false;
    let mut rest = args.iter().enumerate();
    while let Some((at, arg)) = rest.next() {
        let word = arg.as_slice();
        if word.eq_ignore_ascii_case(b"COUNT") {
            once(&count, "COUNT")?;
            let value = value_after(&mut rest, "count", "missing")?;
            count = Some(
                parse_integer(value)
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| (1..=LIST_MAX_COUNT).contains(n))
                    .ok_or(LockError::BadInteger {
                        name: "count",
                        detail: "must be between 1 and 10000",
                    })?,
            );
        } else if word.eq_ignore_ascii_case(b"NAMESPACE") {
            once(&namespace, "NAMESPACE")?;
            let value = value_after(&mut rest, "namespace", "missing")?;
            namespace = Some(
                std::str::from_utf8(value.as_slice())
                    .map_err(|_| LockError::UnknownNamespace)?
                    .to_string(),
            );
        } else if word.eq_ignore_ascii_case(b"OLDER") {
            once(&older_ms, "OLDER")?;
            let value = value_after(&mut rest, "older-ms", "missing")?;
            older_ms = Some(
                parse_integer(value)
                    .and_then(|n| u64::try_from(n).ok())
                    .ok_or(LockError::BadInteger {
                        name: "older-ms",
                        detail: "must not be negative",
                    })?,
            );
        } else if word.eq_ignore_ascii_case(b"WAITING") {
            set_flag(&mut waiting, "WAITING")?;
        } else {
            return Err(unknown(first + at, "NAMESPACE, OLDER, WAITING or COUNT"));
        }
    }
    Ok(ListOptions {
        count: count.unwrap_or(LIST_DEFAULT_COUNT),
        namespace,
        older_ms,
        waiting,
    })
}

/// The options of `LOCK.WHO`, after the key.
pub struct WhoOptions {
    /// At most this many holders and this many waiters are listed.
    pub count: usize,
    /// Only this client's holds and waits.
    pub client: Option<u64>,
}

/// How many holders and waiters `LOCK.WHO` lists without COUNT.
pub const WHO_DEFAULT_COUNT: usize = 10;

/// Parses `[COUNT count] [CLIENT client-id]`, the first at argument `first`.
pub fn who_options(args: &[RedisString], first: usize) -> Result<WhoOptions, LockError> {
    let mut count = None;
    let mut client = None;
    let mut rest = args.iter().enumerate();
    while let Some((at, arg)) = rest.next() {
        let word = arg.as_slice();
        if word.eq_ignore_ascii_case(b"COUNT") {
            once(&count, "COUNT")?;
            let value = value_after(&mut rest, "count", "missing after COUNT")?;
            let bad = LockError::BadInteger {
                name: "count",
                detail: "must be between 1 and 10000",
            };
            count = Some(
                parse_integer(value)
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| (1..=MAX_HOLDERS as usize).contains(n))
                    .ok_or(bad)?,
            );
        } else if word.eq_ignore_ascii_case(b"CLIENT") {
            once(&client, "CLIENT")?;
            let value = value_after(&mut rest, "client-id", "missing after CLIENT")?;
            client = Some(
                parse_integer(value)
                    .and_then(|n| u64::try_from(n).ok())
                    .filter(|n| *n > 0)
                    .ok_or(LockError::BadInteger {
                        name: "client-id",
                        detail: "must be a positive integer",
                    })?,
            );
        } else {
            return Err(unknown(first + at, "COUNT or CLIENT"));
        }
    }
    Ok(WhoOptions {
        count: count.unwrap_or(WHO_DEFAULT_COUNT),
        client,
    })
}
