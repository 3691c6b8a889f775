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
    /// A renewal's reply (a success, a renewal applied but unconfirmed under SYNC or FSYNC, or
    /// any other answer) arrived after the local lease end: the lock may have been free for a
    /// while, so it is not trusted any more.
    LateReply,
    /// The server refused a renewal with `-POLICY` (a lock namespace's rule, e.g. a
    /// `min-ttl` set after the grant): the lease cannot be kept as asked, since every renewal
    /// would break the same rule. The grant lasts until its current lease ends, unrenewed.
    Refused,
    /// A renewal failed with an error that is not retried (`READONLY`: the node became a
    /// replica; `WRONGTYPE`, ...) or its retries ran out: the lease cannot be known to be
    /// renewed, so the lock counts as lost, as in the Python and Node.js helpers.
    RenewalFailed,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::NotHeld => "the server says the token no longer holds the lock",
            LostReason::LeaseExpired => "the lease ran out before it could be renewed",
            LostReason::LateReply => "a renewal was answered only after the lease had run out",
            LostReason::Refused => "the server's lock namespace policy refused the renewal",
            LostReason::RenewalFailed => "a renewal failed, so the lease may not have been renewed",
        })
    }
}

/// A [`Lock`](crate::Lock) setting that makes no sense, refused by `acquire()` before any
/// command is sent. [`reason`](Invalid::reason) is one keyword, the same in every helper of the
/// repository (`clients/conformance/README.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Invalid {
    /// The lease is zero or longer than one year (31536000000 ms, the highest `lock.max-ttl`
    /// a server accepts). Keyword `ttl`.
    Ttl,
    /// The watchdog is on and the lease is under 3 ms (it renews every ttl/3). Keyword
    /// `watchdog-ttl`.
    WatchdogTtl,
    /// The wait is above 2^45 ms (the server's bound for `WAIT`). Keyword `wait`.
    Wait,
    /// A semaphore of 0 or more than 10000 permits. Keyword `limit`.
    Limit,
    /// Both [`shared`](crate::Lock::shared) and [`limit`](crate::Lock::limit): the server
    /// takes it as a permit, but asking for both is ambiguous. Keyword `shared+limit`.
    SharedWithLimit,
    /// A retry policy with no attempts or a zero deadline. Keyword `retry`.
    Retry,
    /// A label that is empty, longer than 128 bytes, or not printable ASCII without spaces.
    /// Keyword `label`.
    Label,
    /// A [`sync`](crate::Lock::sync) timeout of zero or above 2^45 ms (the server's bound).
    /// Keyword `sync`.
    Sync,
    /// An [`fsync`](crate::Lock::fsync) timeout of zero or above 2^45 ms (the server's bound).
    /// Keyword `fsync`.
    Fsync,
}

impl Invalid {
    /// The keyword naming the refused setting: `ttl`, `watchdog-ttl`, `wait`, `limit`,
    /// `shared+limit`, `retry`, `label`, `sync` or `fsync`.
    pub fn reason(&self) -> &'static str {
        match self {
            Invalid::Ttl => "ttl",
            Invalid::WatchdogTtl => "watchdog-ttl",
            Invalid::Wait => "wait",
            Invalid::Limit => "limit",
            Invalid::SharedWithLimit => "shared+limit",
            Invalid::Retry => "retry",
            Invalid::Label => "label",
            Invalid::Sync => "sync",
            Invalid::Fsync => "fsync",
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self {
            Invalid::Ttl => "the lease must be from 1 ms to one year (31536000000 ms)",
            Invalid::WatchdogTtl => {
                "a watchdog renews every ttl / 3: the lease must be at least 3 ms"
            }
            Invalid::Wait => "the wait must be at most 2^45 ms",
            Invalid::Limit => "a semaphore has 1 to 10000 permits",
            Invalid::SharedWithLimit => {
                "shared and limit together are ambiguous: a permit is already a shared hold; \
                 ask for one of them"
            }
            Invalid::Retry => "a retry policy needs at least 1 attempt and a non-zero deadline",
            Invalid::Label => "a label is 1 to 128 bytes of printable ASCII without spaces",
            Invalid::Sync => "the SYNC timeout must be from 1 ms to 2^45 ms",
            Invalid::Fsync => "the FSYNC timeout must be from 1 ms to 2^45 ms",
        };
        write!(f, "{}: {why}", self.reason())
    }
}

/// Everything that can go wrong when taking, keeping or using a lock.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A setting makes no sense ([`Invalid`]): refused before any command was sent.
    Invalid(Invalid),
    /// The lock is held by another token (or others queue for it), or the `WAIT` budget ran
    /// out. Nothing was granted and no user code ran.
    NotAcquired,
    /// The lock was held but is not any more (see [`LockGuard::lost_reason`]). Stop working on
    /// the protected resource.
    ///
    /// [`LockGuard::lost_reason`]: crate::LockGuard::lost_reason
    Lost,
    /// Acquiring gave up after the retry policy (attempts or deadline) was used up, or a retry
    /// after a lost reply was answered by an error that is not retried (`-POLICY`: the policy
    /// changed; `-READONLY`, `-MOVED`: the retry reached another node; `-NOREPLICAS` ...): that
    /// answer says nothing about the earlier try. A grant may
    /// or may not exist on the server (a command can run even when its reply is lost): when an
    /// attempt failed with an I/O error after its request was sent, `acquire` sent one
    /// `LOCK.RELEASE` with the token before returning this (best effort: if that failed too,
    /// the lease ends the grant). The last error seen is attached; if none of the attempts
    /// failed with an I/O error after its request was sent, no attempt can have been granted.
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
    /// The server's lock namespaces refused the request with `-POLICY <namespace>: <detail>`
    /// (the key's namespace is in `enforce` mode in the server's `lock.namespaces`): nothing
    /// was changed. Returned on the first reply, never retried, since the same request breaks
    /// the same rule; but a retry refused so after a lost reply is [`Error::Unknown`] (the
    /// lost try may have been granted). A renewal refused so also marks the guard lost
    /// ([`LostReason::Refused`]).
    Policy {
        /// The namespace whose rule the request broke, e.g. `orders`.
        namespace: String,
        /// The rule broken, in the server's words, e.g. `ttl 600000 above the namespace's
        /// max-ttl 30000` or `a LABEL is required`.
        detail: String,
    },
    /// Any other error from the server or the connection (not retried, or retries used up
    /// outside acquire).
    Redis(redis::RedisError),
}

/// True for a renewal the server applied but could not confirm: SYNC's `NOREPLICAS the change
/// was not acknowledged ...: a failover may lose it` or FSYNC's `ERR the change was not fsynced
/// ...` (the Python and Node.js helpers read them alike).
pub(crate) fn is_unconfirmed(e: &redis::RedisError) -> bool {
    match e.code() {
        Some("NOREPLICAS") => e.detail().is_some_and(|detail| !detail.is_empty()),
        Some("ERR") => e
            .detail()
            .is_some_and(|detail| detail.starts_with("the change was not fsynced")),
        _ => false,
    }
}

/// True for a `-POLICY <text>` reply (a lock namespace refused the request). A bare `-POLICY`,
/// which the module never sends, is an ordinary server error, as the other helpers read it.
pub(crate) fn is_policy(e: &redis::RedisError) -> bool {
    e.code() == Some("POLICY") && e.detail().is_some_and(|detail| !detail.is_empty())
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(why) => write!(f, "invalid lock setting, {why}"),
            Error::NotAcquired => f.write_str("lock not acquired: held by another client"),
            Error::Lost => f.write_str("lock lost: it is no longer held by this client"),
            Error::Unknown(e) => write!(
                f,
                "lock acquisition outcome unknown after retries (any grant was released, or its \
                 lease ends it): {e}"
            ),
            Error::Connection(e) => write!(f, "could not connect, nothing was sent: {e}"),
            Error::Conflict { attempts } => write!(
                f,
                "fenced transaction aborted {attempts} times by concurrent changes"
            ),
            Error::Policy { namespace, detail } => {
                write!(
                    f,
                    "refused by the policy of lock namespace {namespace}: {detail}"
                )
            }
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
    /// [`Error::Policy`] for a `-POLICY` reply, [`Error::Redis`] for any other.
    fn from(e: redis::RedisError) -> Self {
        if is_policy(&e) {
            let (namespace, detail) = e
                .detail()
                .unwrap_or_default()
                .split_once(": ")
                .unwrap_or((e.detail().unwrap_or_default(), ""));
            return Error::Policy {
                namespace: namespace.to_string(),
                detail: detail.to_string(),
            };
        }
        Error::Redis(e)
    }
}
