//! Session locks: a grant made with SESSION is also released when the connection that owns it
//! closes. Ownership is per server and not persisted: after a restart or failover a session lock
//! lives until its lease ends.
//!
//! The owner is the connection that most recently acquired the lock with SESSION (a retry from
//! a new connection after a lost reply takes the session over); a same-token re-acquire without
//! SESSION leaves the owner as it is.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::lock::KeyRef;

#[derive(Default)]
struct Sessions {
    /// Lock key -> (owning client id, token).
    owner: HashMap<KeyRef, (u64, Box<[u8]>)>,
    /// Client id -> lock keys it owns.
    by_client: HashMap<u64, HashSet<KeyRef>>,
}

static SESSIONS: LazyLock<Mutex<Sessions>> = LazyLock::new(|| Mutex::new(Sessions::default()));

/// Number of session locks owned, so the common case (none) needs no lookup.
static OWNED: AtomicUsize = AtomicUsize::new(0);

fn with<R>(f: impl FnOnce(&mut Sessions) -> R) -> R {
    let mut sessions = SESSIONS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let result = f(&mut sessions);
    OWNED.store(sessions.owner.len(), Ordering::Relaxed);
    result
}

/// True when some connection owns a session lock.
pub fn any() -> bool {
    OWNED.load(Ordering::Relaxed) > 0
}

/// Makes `client` the session owner of `key`, held by `token`.
pub fn claim(key: KeyRef, client: u64, token: &[u8]) {
    with(|s| {
        if let Some((previous, _)) = s.owner.get(&key) {
            if *previous != client {
                if let Some(keys) = s.by_client.get_mut(previous) {
                    keys.remove(&key);
                }
            }
        }
        s.by_client.entry(client).or_default().insert(key.clone());
        s.owner.insert(key, (client, token.into()));
    });
}

/// Forgets the session of `key` (the lock was released, expired, forced or deleted).
pub fn forget(key: &KeyRef) {
    with(|s| {
        if let Some((client, _)) = s.owner.remove(key) {
            if let Some(keys) = s.by_client.get_mut(&client) {
                keys.remove(key);
                if keys.is_empty() {
                    s.by_client.remove(&client);
                }
            }
        }
    });
}

/// True when `client` owns at least one session lock.
pub fn owns_any(client: u64) -> bool {
    with(|s| s.by_client.contains_key(&client))
}

/// The locks `client` owned, with their tokens, now that it is gone.
pub fn disconnected(client: u64) -> Vec<(KeyRef, Box<[u8]>)> {
    with(|s| {
        let keys = s.by_client.remove(&client).unwrap_or_default();
        keys.into_iter()
            .filter_map(|key| {
                let (owner, token) = s.owner.remove(&key)?;
                (owner == client).then_some((key, token))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> KeyRef {
        (0, name.as_bytes().into())
    }

    #[test]
    fn latest_session_acquirer_owns_the_lock() {
        claim(key("s1"), 101, b"t");
        claim(key("s1"), 102, b"t");
        assert!(disconnected(101).is_empty());
        assert_eq!(
            disconnected(102),
            vec![(key("s1"), b"t".to_vec().into_boxed_slice())]
        );
        assert!(disconnected(102).is_empty());
    }

    #[test]
    fn forgotten_session_is_not_released_on_disconnect() {
        claim(key("s2"), 201, b"t");
        claim(key("s3"), 201, b"u");
        forget(&key("s2"));
        assert_eq!(
            disconnected(201),
            vec![(key("s3"), b"u".to_vec().into_boxed_slice())]
        );
    }
}
