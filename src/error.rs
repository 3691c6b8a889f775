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
    TokenTooLong {
        max: i64,
    },
    UnknownOption(String),
    RepeatedOption(&'static str),
    FenceExhausted,
    /// The queue of waiters on this lock is full.
    TooManyWaiters {
        max: i64,
    },
    /// LOCK.APPLY or LOCK.FLOOR sent by a client instead of the replication link or AOF.
    InternalCommand(&'static str),
    /// A malformed LOCK.APPLY (from a corrupted AOF, say).
    BadEffect(&'static str),
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
            LockError::TokenTooLong { max } => {
                format!("ERR invalid token: longer than lock.max-token-len ({max} bytes)")
            }
            LockError::UnknownOption(opt) => format!("ERR unknown option '{opt}'"),
            LockError::RepeatedOption(opt) => format!("ERR option {opt} given more than once"),
            LockError::FenceExhausted => "ERR fence space exhausted for this key".into(),
            LockError::TooManyWaiters { max } => {
                format!("ERR too many waiters on this lock (lock.max-waiters is {max})")
            }
            LockError::InternalCommand(name) => format!(
                "ERR {name} is internal: only the replication link and AOF loading may send it"
            ),
            LockError::BadEffect(what) => format!("ERR malformed LOCK.APPLY: {what}"),
            LockError::Internal(_) => {
                "ERR internal error in the lock module; details are in the server log".into()
            }
        }
    }

    /// An internal error; `what` is logged when it is replied.
    pub fn internal(what: &'static str) -> LockError {
        LockError::Internal(what)
    }

    /// An unknown option as typed, made printable ASCII and short (it never holds the token:
    /// the token is always a positional argument).
    pub fn unknown_option(raw: &[u8]) -> LockError {
        // Printable ASCII only: error replies are single protocol lines.
        let shown: String = raw
            .iter()
            .take(64)
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    char::from(b)
                } else {
                    '?'
                }
            })
            .collect();
        LockError::UnknownOption(shown)
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
    fn unknown_options_are_shown_as_short_printable_ascii() {
        let shown = LockError::unknown_option("x\u{100}\u{e9}\0\r\nfoo bar".as_bytes()).reply();
        assert_eq!(shown, "ERR unknown option 'x???????foo bar'");
        assert!(shown.bytes().all(|b| b.is_ascii_graphic() || b == b' '));
        let long = LockError::unknown_option(&[b'a'; 100]).reply();
        assert_eq!(long, format!("ERR unknown option '{}'", "a".repeat(64)));
    }
}
