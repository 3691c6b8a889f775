//! State changes as effects. The primary decides; replicas and AOF replay apply.
//!
//! Every change of a lock is sent to replicas and the AOF as `LOCK.APPLY key state [token]`,
//! with state `event:fence:floor[:deadline-ms:holds:flags]`: the whole resulting state
//! with absolute values, so applying it never depends on the replica's clock or configs. The
//! same function announces the change locally: keyspace notification, WATCH invalidation and
//! the expiry index.

use std::ffi::CStr;

use redis_module::{raw, Context, NotifyEvent, RedisString};

use crate::core::{Holder, Lock, MAX_FENCE};
use crate::datatype::{fence_floor, raise_fence_floor, Stored};
use crate::error::LockError;
use crate::expiry;

/// The name of the internal effect command.
pub const APPLY: &CStr = c"LOCK.APPLY";

/// What happened to a lock. Replicas count the same events as their primary, so each kind of
/// change has its own word; `Sync` restates a lock without announcing anything (AOF rewrite).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Acquire,
    Release,
    /// A release that dropped one of several reentrant holds: the lock stays held.
    DropHold,
    /// The connection that owned a session lock closed.
    SessionEnd,
    Renew,
    Expired,
    ForceRelease,
    Sync,
}

impl Event {
    const ALL: [Event; 8] = [
        Event::Acquire,
        Event::Release,
        Event::DropHold,
        Event::SessionEnd,
        Event::Renew,
        Event::Expired,
        Event::ForceRelease,
        Event::Sync,
    ];

    /// True when the change left the lock free.
    pub fn frees(self) -> bool {
        matches!(
            self,
            Event::Release | Event::SessionEnd | Event::Expired | Event::ForceRelease
        )
    }

    /// The event's name in `LOCK.APPLY`.
    pub fn word(self) -> &'static CStr {
        match self {
            Event::Acquire => c"acquire",
            Event::Release => c"release",
            Event::DropHold => c"drophold",
            Event::SessionEnd => c"sessionend",
            Event::Renew => c"renew",
            Event::Expired => c"expired",
            Event::ForceRelease => c"forcerelease",
            Event::Sync => c"sync",
        }
    }

    /// The keyspace notification, published in the module class (`d`).
    pub fn notification(self) -> Option<&'static CStr> {
        match self {
            Event::Acquire => Some(c"lock.acquire"),
            Event::Release | Event::SessionEnd => Some(c"lock.release"),
            Event::Renew => Some(c"lock.renew"),
            Event::Expired => Some(c"lock.expired"),
            Event::ForceRelease => Some(c"lock.forcerelease"),
            Event::DropHold | Event::Sync => None,
        }
    }

    fn parse(word: &[u8]) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.word().to_bytes() == word)
    }
}

const FLAG_SESSION: u64 = 1;

/// The effect's state, formatted without allocating: `event:fence:floor` for a free lock,
/// `event:fence:floor:deadline:holds:flags` for a held one (its token travels as its own
/// argument, binary-safe).
pub struct State {
    buf: [u8; 128],
    len: usize,
}

impl State {
    pub fn of(event: Event, lock: &Lock) -> State {
        let mut state = State {
            buf: [0; 128],
            len: 0,
        };
        // At most 12 + 5 * 21 bytes: always fits.
        state.push(event.word().to_bytes());
        state.number(lock.fence);
        state.number(fence_floor().max(lock.fence));
        if let Some(holder) = &lock.holder {
            state.number(holder.deadline);
            state.number(u64::from(holder.holds));
            state.number(if holder.session { FLAG_SESSION } else { 0 });
        }
        state
    }

    fn push(&mut self, bytes: &[u8]) {
        let end = (self.len + bytes.len()).min(self.buf.len());
        let take = end - self.len;
        self.buf[self.len..end].copy_from_slice(&bytes[..take]);
        self.len = end;
    }

    /// Appends `:` and the decimal digits of `value` (the formatter machinery is slow here),
    /// two digits per step.
    fn number(&mut self, mut value: u64) {
        const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
            2021222324252627282930313233343536373839\
            4041424344454647484950515253545556575859\
            6061626364656667686970717273747576777879\
            8081828384858687888990919293949596979899";
        let mut digits = [0u8; 21];
        let mut at = digits.len();
        while value >= 100 {
            let pair = (value % 100) as usize * 2;
            value /= 100;
            at -= 2;
            digits[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        }
        if value >= 10 {
            let pair = value as usize * 2;
            at -= 2;
            digits[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        } else {
            at -= 1;
            digits[at] = b'0' + value as u8;
        }
        at -= 1;
        digits[at] = b':';
        self.push(&digits[at..]);
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The arguments of `LOCK.APPLY` after the key: the state, and the token when held.
pub fn effect_args(event: Event, lock: &Lock) -> Vec<Vec<u8>> {
    let mut args = vec![State::of(event, lock).as_bytes().to_vec()];
    if let Some(holder) = &lock.holder {
        args.push(holder.token.to_vec());
    }
    args
}

/// A decoded `LOCK.APPLY`.
#[derive(Debug, PartialEq, Eq)]
pub struct Effect {
    pub event: Event,
    pub lock: Lock,
    pub floor: u64,
}

fn number(field: Option<&[u8]>, what: &'static str) -> Result<u64, LockError> {
    field
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or(LockError::BadEffect(what))
}

/// Parses the arguments after the key.
pub fn parse_effect(args: &[&[u8]]) -> Result<Effect, LockError> {
    let (state, token) = match args {
        [state] => (state, None),
        [state, token] => (state, Some(token)),
        _ => return Err(LockError::WrongArity),
    };
    let mut fields = state.split(|b| *b == b':');
    let event = fields
        .next()
        .and_then(Event::parse)
        .ok_or(LockError::BadEffect("unknown event"))?;
    let fence = number(fields.next(), "fence")?;
    let floor = number(fields.next(), "floor")?;
    if fence > MAX_FENCE || floor > MAX_FENCE {
        return Err(LockError::BadEffect("fence out of range"));
    }
    let holder = match token {
        None => None,
        Some(token) => {
            if token.is_empty() {
                return Err(LockError::BadEffect("empty token"));
            }
            let deadline = number(fields.next(), "deadline")?;
            let holds = u32::try_from(number(fields.next(), "holds")?)
                .ok()
                .filter(|h| *h > 0)
                .ok_or(LockError::BadEffect("holds"))?;
            let flags = number(fields.next(), "flags")?;
            Some(Holder {
                token: token.to_vec().into_boxed_slice(),
                deadline,
                holds,
                session: flags & FLAG_SESSION != 0,
            })
        }
    };
    if fields.next().is_some() {
        return Err(LockError::BadEffect("extra fields"));
    }
    Ok(Effect {
        event,
        lock: Lock { fence, holder },
        floor,
    })
}

/// The database the context works on.
pub fn selected_db(ctx: &Context) -> i32 {
    // SAFETY: a valid context; the call only reads the client's db id.
    unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx.ctx)) }
}

/// A key name as a Redis string, binary-safe (`Context::create_string` refuses NUL bytes).
pub fn key_string(ctx: &Context, key: &[u8]) -> RedisString {
    RedisString::create_from_slice(ctx.ctx, key)
}

/// Selects database `db` on the context; false when it does not exist.
pub fn select_db(ctx: &Context, db: i32) -> bool {
    // SAFETY: valid context; Redis refuses ids out of range.
    unsafe {
        raw::RedisModule_SelectDb.is_some_and(|f| f(ctx.ctx, db) == raw::REDISMODULE_OK as i32)
    }
}

/// Tells the rest of the server about a change that already happened to `lock` under `key`:
/// WATCH invalidation, the keyspace notification and the expiry index. `old_deadline` is the
/// lease deadline before the change, if there was one.
pub fn announce(
    ctx: &Context,
    key: &RedisString,
    event: Event,
    stored: &Stored,
    old_deadline: Option<u64>,
) {
    let lock = stored.lock();
    // SAFETY: valid context and key string for the duration of the call.
    unsafe {
        if let Some(signal) = raw::RedisModule_SignalModifiedKey {
            signal(ctx.ctx, key.inner);
        }
    }
    if let Some(name) = event.notification() {
        // SAFETY: valid context, static NUL-terminated event name, live key string.
        unsafe {
            if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
                notify(
                    ctx.ctx,
                    NotifyEvent::MODULE.bits(),
                    name.as_ptr(),
                    key.inner,
                );
            }
        }
    }
    let db = selected_db(ctx);
    let new_deadline = lock.holder.as_ref().map(|h| h.deadline);
    if old_deadline != new_deadline {
        expiry::reindex(
            ctx,
            stored.id(),
            db,
            key.as_slice(),
            old_deadline,
            new_deadline,
        );
    }
}

/// On the primary: announce a change and send it to replicas and the AOF.
pub fn propagate(
    ctx: &Context,
    key: &RedisString,
    event: Event,
    stored: &Stored,
    old_deadline: Option<u64>,
) {
    announce(ctx, key, event, stored, old_deadline);
    let lock = stored.lock();
    // SAFETY: reading the API table Redis filled in at load.
    let Some(replicate) = (unsafe { raw::RedisModule_Replicate }) else {
        return;
    };
    let state = State::of(event, lock);
    let state = state.as_bytes();
    // s = the key, b = a buffer: Redis builds the few argument strings itself.
    // SAFETY: valid context; every pointer outlives the call; the format matches the arguments.
    unsafe {
        match &lock.holder {
            None => replicate(
                ctx.ctx,
                APPLY.as_ptr(),
                c"sb".as_ptr(),
                key.inner,
                state.as_ptr(),
                state.len(),
            ),
            Some(holder) => replicate(
                ctx.ctx,
                APPLY.as_ptr(),
                c"sbb".as_ptr(),
                key.inner,
                state.as_ptr(),
                state.len(),
                holder.token.as_ptr(),
                holder.token.len(),
            ),
        };
    }
}

/// The name of the internal floor command.
pub const FLOOR: &str = "LOCK.FLOOR";

/// Writes the fence floor to the AOF (and replicas) as `LOCK.FLOOR n`, on a primary that has
/// issued fences.
pub fn record_floor(ctx: &Context) {
    let floor = fence_floor();
    if floor > 0 && ctx.get_flags().contains(redis_module::ContextFlags::MASTER) {
        ctx.replicate(FLOOR, &[floor.to_string().as_bytes()]);
    }
}

/// Raises the fence floor for an applied effect.
pub fn note_floor(effect: &Effect) {
    raise_fence_floor(effect.floor.max(effect.lock.fence));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(event: Event, lock: Lock) {
        let args = effect_args(event, &lock);
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let effect = parse_effect(&refs).unwrap();
        assert_eq!(effect.event, event);
        assert_eq!(effect.lock, lock);
        assert!(effect.floor >= lock.fence);
    }

    #[test]
    fn state_formats_every_field() {
        let held = Lock {
            fence: 12,
            holder: Some(Holder {
                token: b"t".to_vec().into_boxed_slice(),
                deadline: 18_446_744_073_709_551_615,
                holds: 3,
                session: true,
            }),
        };
        let state = State::of(Event::Acquire, &held);
        let text = std::str::from_utf8(state.as_bytes()).unwrap();
        let floor = fence_floor().max(12);
        assert_eq!(text, format!("acquire:12:{floor}:18446744073709551615:3:1"));
        let free = State::of(
            Event::Release,
            &Lock {
                fence: 0,
                holder: None,
            },
        );
        assert_eq!(
            free.as_bytes(),
            format!("release:0:{}", fence_floor()).as_bytes()
        );
    }

    #[test]
    fn effects_round_trip() {
        round_trip(
            Event::Release,
            Lock {
                fence: 9,
                holder: None,
            },
        );
        round_trip(
            Event::Acquire,
            Lock {
                fence: 10,
                holder: Some(Holder {
                    token: b"\x00\xffbinary".to_vec().into_boxed_slice(),
                    deadline: 1_764_000_000_000,
                    holds: 3,
                    session: true,
                }),
            },
        );
    }

    #[test]
    fn malformed_effects_are_refused() {
        let bad: [&[&[u8]]; 10] = [
            &[b"acquire:1"],
            &[b"bogus:1:1"],
            &[b"acquire:-1:1"],
            &[b"acquire:1:1", b"tok"],
            &[b"acquire:1:1:5:1:0", b""],
            &[b"acquire:1:1:5:0:0", b"tok"],
            &[b"acquire:99999999999999999999:1"],
            &[b"acquire:1:1:7"],
            &[b"acquire:1:1:5:1:0:9", b"tok"],
            &[b"acquire:1:1", b"tok", b"extra"],
        ];
        for args in bad {
            assert!(parse_effect(args).is_err(), "{args:?}");
        }
    }
}
