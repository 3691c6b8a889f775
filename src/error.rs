//! Every error a client can see, with its exact reply text.

use std::fmt;

use redis_module::RedisError;

/// One variant per reply a client may get; [`LockError::reply`] is the exact text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockError {
    /// The standard arity error; Redis words it itself.
    WrongArity,
    WrongType,
    /// A numeric argument that is not an integer in range. `name` is the argument's name.
    BadInteger {
        name: &'static str,
        detail: &'static str,
    },
    /// A numeric argument above its configured limit.
    TooLarge {
        name: &'static str,
        config: &'static str,
        max: i64,
    },
    EmptyToken,
    /// A subcommand the command does not have.
    UnknownSubcommand {
        command: &'static str,
        expected: &'static str,
    },
    /// A LABEL that is not printable ASCII without spaces, or longer than `max` bytes.
    BadLabel {
        max: usize,
    },
    TokenTooLong {
        max: i64,
    },
    /// An argument in an option's place that is no option; `position` counts the arguments
    /// after the command name from 1. Never echoed: it may be a token put there by mistake.
    UnknownOption {
        position: usize,
        /// The options the command takes, for the message.
        expected: &'static str,
    },
    RepeatedOption(&'static str),
    FenceExhausted,
    /// The queue of waiters on this lock is full.
    TooManyWaiters {
        max: i64,
    },
    /// In a cluster, the key a client waited on was deleted, possibly by a slot migration: the
    /// client sends its command again and Redis routes it to the key's node.
    Displaced,
    /// SYNC: the replicas did not acknowledge in time. `undone`: a new grant, taken back.
    NotAcknowledged {
        undone: bool,
        replicas: u64,
        timeout_ms: u64,
    },
    /// SYNC where the client cannot wait (MULTI, scripts).
    SyncCannotWait,
    /// FSYNC: the change was not fsynced to the AOF in time. `undone`: a new grant, taken back.
    NotFsynced {
        undone: bool,
        timeout_ms: u64,
    },
    /// FSYNC where the client cannot wait (MULTI, scripts).
    FsyncCannotWait,
    /// FSYNC on a server without the AOF.
    FsyncNeedsAof,
    /// SESSION inside a script: the script's client is not a connection, and never closes.
    SessionInScript,
    /// SYNC or FSYNC sent to a (writable) replica, whose changes reach no other replica and
    /// give way to its primary's data at the next sync.
    SyncOnReplica,
    /// WAIT sent to a (writable) replica, which grants nothing from a queue.
    WaitOnReplica,
    /// A SYNC or FSYNC wait still blocked when its server became a replica (which Redis
    /// normally answers itself): the outcome is the new primary's to tell.
    NoLongerPrimary,
    /// LOCK.APPLY or LOCK.FLOOR sent by a client instead of the replication link or AOF.
    InternalCommand(&'static str),
    /// A malformed LOCK.APPLY (from a corrupted AOF, say).
    BadEffect(&'static str),
    /// LOCK.MACQUIRE / LOCK.MRELEASE: fewer arguments after numkeys than its keys and the
    /// arguments that must follow them (`after`, by name).
    ShortOfKeys {
        numkeys: usize,
        given: usize,
        after: &'static [&'static str],
    },
    /// LOCK.MACQUIRE / LOCK.MRELEASE named a key twice.
    DuplicateKey,
    /// An option of LOCK.ACQUIRE that LOCK.MACQUIRE does not take.
    NotForMulti(&'static str),
    /// LOCK.GUARD: the fence is not the lock's current one, so the command did not run.
    StaleFence,
    /// LOCK.GUARD: the calling user may not run the guarded command (or touch its keys).
    GuardNoPerm,
    /// LOCK.GUARD: a command it must not run, and why.
    Unguardable(&'static str),
    /// A shared holder asked for the lock exclusive.
    Upgrade,
    /// LIMIT on a key held as a lock, exclusive or shared.
    NotSemaphore,
    /// The key is a semaphore of `limit` permits; the request asked otherwise.
    SemaphoreLimit {
        limit: u32,
    },
    /// An option that only exclusive holds take, given with SHARED or LIMIT.
    ExclusiveOnly(&'static str),
    /// A namespace in `enforce` mode refused the request (see `crate::policy`): its name,
    /// and what rule the request broke, with the figures.
    Policy {
        namespace: String,
        detail: String,
    },
    /// LOCK.LIST NAMESPACE with a name the policy in force does not have (never echoed).
    UnknownNamespace,
    /// Something that should not happen (a bug, or the server refusing what it never refuses):
    /// what it was goes to the server log when the error is replied.
    Internal(&'static str),
}

impl LockError {
    pub fn reply(&self) -> String {
        match self {
            LockError::WrongArity => "wrong number of arguments".into(),
            LockError::WrongType => {
                "WRONGTYPE Operation against a key holding the wrong kind of value".into()
            }
            LockError::BadInteger { name, detail } => format!("ERR invalid {name}: {detail}"),
            LockError::TooLarge { name, config, max } => {
                format!("ERR invalid {name}: exceeds {config} ({max})")
            }
            LockError::EmptyToken => "ERR invalid token: must not be empty".into(),
            LockError::UnknownSubcommand { command, expected } => {
                format!("ERR unknown subcommand or wrong number of arguments for {command} (expected {expected})")
            }
            LockError::BadLabel { max } => {
                format!("ERR invalid label: printable ASCII without spaces, at most {max} bytes")
            }
            LockError::TokenTooLong { max } => {
                format!("ERR invalid token: longer than lock.max-token-len ({max} bytes)")
            }
            LockError::UnknownOption { position, expected } => {
                format!("ERR unknown option at argument {position} (expected {expected})")
            }
            LockError::RepeatedOption(opt) => format!("ERR option {opt} given more than once"),
            LockError::FenceExhausted => "ERR fence space exhausted for this key".into(),
            LockError::TooManyWaiters { max } => {
                format!("ERR too many waiters on this lock (lock.max-waiters is {max})")
            }
            LockError::Displaced => "TRYAGAIN the lock's key was deleted or moved to another \
                 node while the client waited; send the command again"
                .into(),
            LockError::NotAcknowledged {
                undone: true,
                replicas,
                timeout_ms,
            } => format!(
                "NOREPLICAS the grant was not acknowledged by {replicas} replica(s) within \
                 {timeout_ms} ms and was undone"
            ),
            LockError::NotAcknowledged {
                undone: false,
                replicas,
                timeout_ms,
            } => format!(
                "NOREPLICAS the change was not acknowledged by {replicas} replica(s) within \
                 {timeout_ms} ms: a failover may lose it"
            ),
            LockError::SyncCannotWait => "ERR SYNC cannot wait for replicas inside MULTI or a \
                 script; send WAIT after EXEC instead"
                .into(),
            LockError::NotFsynced {
                undone: true,
                timeout_ms,
            } => format!(
                "ERR the grant was not fsynced to the AOF within {timeout_ms} ms and was undone"
            ),
            LockError::NotFsynced {
                undone: false,
                timeout_ms,
            } => format!(
                "ERR the change was not fsynced to the AOF within {timeout_ms} ms: a crash of \
                 this machine may lose it"
            ),
            LockError::FsyncCannotWait => "ERR FSYNC cannot wait inside MULTI or a script; send \
                 WAITAOF after EXEC instead"
                .into(),
            LockError::FsyncNeedsAof => "ERR FSYNC needs appendonly yes".into(),
            LockError::SessionInScript => "ERR SESSION cannot be kept inside a script, whose \
                 client never closes; acquire the lock outside the script"
                .into(),
            LockError::SyncOnReplica => "ERR SYNC and FSYNC cannot be kept on a replica, whose \
                 changes its primary's next sync replaces: send the command to the primary"
                .into(),
            LockError::WaitOnReplica => "ERR WAIT cannot queue on a replica, which grants \
                 nothing from a queue: send the command to the primary"
                .into(),
            LockError::NoLongerPrimary => "UNBLOCKED this server became a replica while the \
                 change waited for acknowledgement: send the command to the primary, with the \
                 same token"
                .into(),
            LockError::InternalCommand(name) => format!(
                "ERR {name} is internal: only the replication link and AOF loading may send it"
            ),
            LockError::BadEffect(what) => format!("ERR malformed LOCK.APPLY: {what}"),
            LockError::ShortOfKeys {
                numkeys,
                given,
                after,
            } => {
                let names = after.join(" and ");
                format!(
                    "ERR invalid numkeys: {numkeys} key(s) then the {names} need {} arguments \
                     after numkeys, {given} given (the {names} left out, or numkeys too large?)",
                    numkeys + after.len()
                )
            }
            LockError::DuplicateKey => "ERR duplicate key: each key may be named once".into(),
            LockError::NotForMulti(option) => {
                format!("ERR option {option} is not supported by LOCK.MACQUIRE")
            }
            LockError::StaleFence => "FENCED the fence is not the current holder's; the \
                 command did not run"
                .into(),
            LockError::GuardNoPerm => "NOPERM this user has no permissions to run the guarded \
                 command with these arguments"
                .into(),
            LockError::Unguardable(why) => format!("ERR LOCK.GUARD cannot run this command: {why}"),
            LockError::Upgrade => "ERR this token holds the lock shared: an upgrade to \
                 exclusive is refused, as two upgrades would wait for each other forever; \
                 release it and acquire again"
                .into(),
            LockError::NotSemaphore => {
                "ERR the lock is held as a lock, not a semaphore: LIMIT does not apply".into()
            }
            LockError::SemaphoreLimit { limit } => format!(
                "ERR the key is a semaphore of {limit} permits: acquire it with LIMIT {limit}"
            ),
            LockError::ExclusiveOnly(option) => {
                format!("ERR option {option} applies to exclusive holds only, not SHARED or LIMIT")
            }
            LockError::Policy { namespace, detail } => format!("POLICY {namespace}: {detail}"),
            LockError::UnknownNamespace => {
                "ERR no such namespace in lock.namespaces (LOCK.POLICY LIST names them)".into()
            }
            LockError::Internal(_) => {
                "ERR internal error in the lock module; details are in the server log".into()
            }
        }
    }

    /// An internal error; `what` is logged when it is replied.
    pub fn internal(what: &'static str) -> LockError {
        LockError::Internal(what)
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reply())
    }
}

impl From<LockError> for RedisError {
    fn from(err: LockError) -> Self {
        match err {
            LockError::WrongArity => RedisError::WrongArity,
            LockError::WrongType => RedisError::WrongType,
            other => RedisError::String(other.reply()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_option_is_named_by_its_position_only() {
        let error = LockError::UnknownOption {
            position: 4,
            expected: "SYNC",
        };
        assert_eq!(
            error.reply(),
            "ERR unknown option at argument 4 (expected SYNC)"
        );
    }
}
