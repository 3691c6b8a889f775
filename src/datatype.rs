//! The `lockstate` data type: the value stored under a lock key, its RDB encoding, AOF rewrite,
//! digest, copy and memory usage, and the server-wide fence floor that travels as RDB aux data.
//!
//! The raw callbacks live in `ffi`; everything here is safe code on decoded values.

use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::core::{Holder, Lock};
use crate::metrics;

/// RDB encoding version of a lock value. Version 1: fence, holder flag, then (when held) token,
/// deadline, holds and a flags word (bit 0: session).
pub const ENCODING_VERSION: i32 = 1;
/// Encoding version of the aux field (the fence floor).
pub const AUX_VERSION: i32 = 1;

const FLAG_SESSION: u64 = 1;

/// The largest fence this server has issued or seen, for any key. It only grows: on grants, on
/// loading values (RDB, RESTORE, full sync), on replicated effects, and from the RDB aux field.
static FENCE_FLOOR: AtomicU64 = AtomicU64::new(0);

/// The next lock id.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub fn fence_floor() -> u64 {
    FENCE_FLOOR.load(Ordering::Relaxed)
}

pub fn raise_fence_floor(fence: u64) {
    FENCE_FLOOR.fetch_max(fence, Ordering::Relaxed);
}

/// The value behind a lock key.
#[derive(Debug)]
pub struct Stored {
    lock: Lock,
    /// Unique per value in this process: the lease index's handle on it (never persisted).
    id: u64,
    /// When the current holder got the lock (monotonic µs), for the hold-time histogram;
    /// unknown for a holder that arrived by loading, RESTORE or COPY.
    held_since: Option<u64>,
}

impl Stored {
    pub fn new(lock: Lock) -> Self {
        raise_fence_floor(lock.fence);
        metrics::KEYS.add(1);
        if lock.holder.is_some() {
            metrics::HELD.add(1);
        }
        Stored {
            lock,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            held_since: None,
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// A value created by a grant, whose hold starts now.
    pub fn granted(lock: Lock) -> Self {
        let mut stored = Stored::new(lock);
        if stored.lock.holder.is_some() {
            stored.held_since = Some(metrics::monotonic_us());
        }
        stored
    }

    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// Runs `change` on the lock and keeps the held gauge and the fence floor in step.
    pub fn update<R>(&mut self, change: impl FnOnce(&mut Lock) -> R) -> R {
        let was_held = self.lock.holder.is_some();
        let result = change(&mut self.lock);
        let is_held = self.lock.holder.is_some();
        if was_held != is_held {
            metrics::HELD.add(if is_held { 1 } else { -1 });
            let now = metrics::monotonic_us();
            if is_held {
                self.held_since = Some(now);
            } else if let Some(since) = self.held_since.take() {
                metrics::HOLD.record(now.saturating_sub(since));
            }
        }
        raise_fence_floor(self.lock.fence);
        result
    }
}

impl Drop for Stored {
    fn drop(&mut self) {
        metrics::KEYS.add(-1);
        if self.lock.holder.is_some() {
            metrics::HELD.add(-1);
        }
    }
}

/// The type as Redis sees it (`TYPE key` answers `lockstate`). The name and encoding version are
/// part of every RDB file that holds a lock: never change them.
pub static LOCK_TYPE: RedisType = RedisType::new(
    "lockstate",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(crate::ffi::rdb_load),
        rdb_save: Some(crate::ffi::rdb_save),
        aof_rewrite: Some(crate::ffi::aof_rewrite),
        mem_usage: Some(crate::ffi::mem_usage),
        digest: Some(crate::ffi::digest),
        free: Some(crate::ffi::free),
        aux_load: Some(crate::ffi::aux_load),
        aux_save: Some(crate::ffi::aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as i32,
        free_effort: None,
        unlink: None,
        copy: Some(crate::ffi::copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    },
);

/// A source of RDB fields; `None` on a short read.
pub trait RdbReader {
    fn unsigned(&mut self) -> Option<u64>;
    fn buffer(&mut self) -> Option<Vec<u8>>;
}

/// A sink for RDB fields.
pub trait RdbWriter {
    fn unsigned(&mut self, value: u64);
    fn buffer(&mut self, value: &[u8]);
}

/// Why a stored value could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    NewerVersion(i32),
    ShortRead,
    Invalid(&'static str),
}

pub fn save(lock: &Lock, out: &mut impl RdbWriter) {
    out.unsigned(lock.fence);
    match &lock.holder {
        None => out.unsigned(0),
        Some(holder) => {
            out.unsigned(1);
            out.buffer(&holder.token);
            out.unsigned(holder.deadline);
            out.unsigned(u64::from(holder.holds));
            out.unsigned(if holder.session { FLAG_SESSION } else { 0 });
        }
    }
}

pub fn load(version: i32, input: &mut impl RdbReader) -> Result<Lock, DecodeError> {
    if version > ENCODING_VERSION || version < 1 {
        return Err(DecodeError::NewerVersion(version));
    }
    let fence = input.unsigned().ok_or(DecodeError::ShortRead)?;
    if fence > crate::core::MAX_FENCE {
        return Err(DecodeError::Invalid("fence out of range"));
    }
    let holder = match input.unsigned().ok_or(DecodeError::ShortRead)? {
        0 => None,
        1 => {
            let token = input.buffer().ok_or(DecodeError::ShortRead)?;
            let deadline = input.unsigned().ok_or(DecodeError::ShortRead)?;
            let holds = input.unsigned().ok_or(DecodeError::ShortRead)?;
            let flags = input.unsigned().ok_or(DecodeError::ShortRead)?;
            if token.is_empty() {
                return Err(DecodeError::Invalid("empty token"));
            }
            let holds = u32::try_from(holds)
                .ok()
                .filter(|h| *h > 0)
                .ok_or(DecodeError::Invalid("hold count out of range"))?;
            if fence == 0 {
                return Err(DecodeError::Invalid("held lock without a fence"));
            }
            Some(Holder {
                token: token.into_boxed_slice(),
                deadline,
                holds,
                session: flags & FLAG_SESSION != 0,
            })
        }
        _ => return Err(DecodeError::Invalid("bad holder flag")),
    };
    Ok(Lock { fence, holder })
}

/// An in-memory RDB stream of fields, for tests of the encoding.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Fields(pub(crate) std::collections::VecDeque<Result<u64, Vec<u8>>>);

#[cfg(test)]
impl RdbWriter for Fields {
    fn unsigned(&mut self, value: u64) {
        self.0.push_back(Ok(value));
    }
    fn buffer(&mut self, value: &[u8]) {
        self.0.push_back(Err(value.to_vec()));
    }
}

#[cfg(test)]
impl RdbReader for Fields {
    fn unsigned(&mut self) -> Option<u64> {
        self.0.pop_front()?.ok()
    }
    fn buffer(&mut self) -> Option<Vec<u8>> {
        self.0.pop_front()?.err()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> Lock {
        Lock {
            fence: 77,
            holder: Some(Holder {
                token: b"t\0k".to_vec().into_boxed_slice(),
                deadline: 123,
                holds: 2,
                session: true,
            }),
        }
    }

    #[test]
    fn held_and_free_locks_round_trip() {
        for lock in [
            held(),
            Lock {
                fence: 5,
                holder: None,
            },
        ] {
            let mut fields = Fields::default();
            save(&lock, &mut fields);
            assert_eq!(load(ENCODING_VERSION, &mut fields), Ok(lock));
            assert!(fields.0.is_empty());
        }
    }

    #[test]
    fn newer_encoding_is_refused() {
        let mut fields = Fields::default();
        save(&held(), &mut fields);
        assert_eq!(load(2, &mut fields), Err(DecodeError::NewerVersion(2)));
    }

    #[test]
    fn every_truncation_is_a_short_read() {
        let mut full = Fields::default();
        save(&held(), &mut full);
        for cut in 0..full.0.len() {
            let mut part = Fields(full.0.iter().take(cut).cloned().collect());
            assert_eq!(
                load(1, &mut part),
                Err(DecodeError::ShortRead),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn nonsense_fields_are_invalid() {
        let mut bad_flag = Fields(vec![Ok(1), Ok(7)].into());
        assert_eq!(
            load(1, &mut bad_flag),
            Err(DecodeError::Invalid("bad holder flag"))
        );
        let mut zero_holds =
            Fields(vec![Ok(1), Ok(1), Err(b"t".to_vec()), Ok(1), Ok(0), Ok(0)].into());
        assert_eq!(
            load(1, &mut zero_holds),
            Err(DecodeError::Invalid("hold count out of range"))
        );
        let mut huge_fence = Fields(vec![Ok(u64::MAX), Ok(0)].into());
        assert_eq!(
            load(1, &mut huge_fence),
            Err(DecodeError::Invalid("fence out of range"))
        );
    }
}
