//! The crate's error type.

use std::fmt;

/// Why a held lock counts as lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LostReason {
    /// The server said the token no longer holds the lock (`LOCK.RENEW` or `LOCK.FENCE`
    /// answered 0): it expired, was force-released, or someone else holds it now.
    NotHeld,
    /// The local, conservative lease end passed before a renewal could be sent (the process or
    /// the watchdog stalled, or the server could not be reached in time). No renewal is sent
    /// after this point.
    LeaseExpired,
    /// A renewal succeeded on the server, but its reply arrived after the local lease end: the
    /// lock may have been free for a while, so it is not trusted any more.
    LateReply,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::NotHeld => "the server says the token no longer holds the lock",
            LostReason::LeaseExpired => "the lease ran out before it could be renewed",
            LostReason::LateReply => "a renewal was confirmed only after the lease had run out",
        })
    }
}

/// Everything that can go wrong when taking, keeping or using a lock.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held by another token (or others queue for it), or the `WAIT` budget ran
    /// out. Nothing was granted and no user code ran.
    NotAcquired,
    /// The lock was held but is not any more (see [`LockGuard::lost_reason`]). Stop working on
    /// the protected resource.
    ///
    /// [`LockGuard::lost_reason`]: crate::LockGuard::lost_reason
    Lost,
    /// Acquiring gave up after the retry policy (attempts or deadline) was used up. A grant may
    /// or may not exist on the server (a command can run even when its reply is lost); if it
    /// does, its lease ends it. The last error seen is attached; if none of the attempts failed
    /// with an I/O error after its request was sent, no attempt can have been granted.
    Unknown(redis::RedisError),
    /// No connection to the server could be opened, so the request (`LOCK.ACQUIRE`, or
    /// `LOCK.RELEASE` from [`LockGuard::release`]) was never sent: nothing was granted (or
    /// released). Returned at once, without retries. The connect error is attached.
    ///
    /// [`LockGuard::release`]: crate::LockGuard::release
    Connection(redis::RedisError),
    /// A fenced transaction found the lock unchanged but its `EXEC` was aborted (a watched key
    /// changed) this many times in a row.
    Conflict {
        /// How many times `EXEC` was tried.
        attempts: u32,
    },
    /// Any other error from the server or the connection (not retried, or retries used up
    /// outside acquire).
    Redis(redis::RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotAcquired => f.write_str("lock not acquired: held by another client"),
            Error::Lost => f.write_str("lock lost: it is no longer held by this client"),
            Error::Unknown(e) => write!(
                f,
                "lock acquisition outcome unknown after retries (the lease ends any grant): {e}"
            ),
            Error::Connection(e) => write!(f, "could not connect, nothing was sent: {e}"),
            Error::Conflict { attempts } => write!(
                f,
                "fenced transaction aborted {attempts} times by concurrent changes"
            ),
            Error::Redis(e) => write!(f, "redis error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Unknown(e) | Error::Connection(e) | Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}
