//! Session locks: a grant made with SESSION is also released when the connection that owns it
//! closes. Ownership is per server and not persisted: after a restart or failover a session lock
//! lives until its lease ends.
//!
//! The owner is the connection that most recently acquired the lock with SESSION (a retry from
//! a new connection after a lost reply takes the session over); a same-token re-acquire without
//! SESSION leaves the owner as it is.
//!
//! The table follows its keys: RENAME and MOVE carry a session to the new name, SWAPDB to the
//! other database, and DEL, expiry, eviction, FLUSHDB, FLUSHALL and values put in the key's place
//! (RESTORE, COPY) end it. Each entry also names the lock value it belongs to (its id), and a
//! session is only ever released on that value: whatever the table missed, the close of a
//! connection never frees a lock it did not take. And whatever frees that value (a SET or a
//! `*STORE` over it included, which announce nothing the module listens to) takes its sessions
//! along ([`value_freed`]), so nothing of a gone lock waits for its connection to close.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::lock::token::TokenDigest;
use crate::lock::KeyRef;

/// A session lock's owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub client: u64,
    pub token: TokenDigest,
    /// The id of the lock value the session belongs to.
    pub lock_id: u64,
}

#[derive(Default)]
struct Sessions {
    /// Key -> the sessions of its holders (one for an exclusive lock; one per shared or permit
    /// holder that asked for SESSION).
    by_key: HashMap<KeyRef, Vec<Session>>,
    /// Client id -> lock keys it owns a session on.
    by_client: HashMap<u64, HashSet<KeyRef>>,
    /// The sessions of a key just renamed or moved away, until its new name is announced.
    moving: Option<Vec<Session>>,
    /// Lock value id -> the key of its sessions.
    by_lock: HashMap<u64, KeyRef>,
}

impl Sessions {
    /// Records `session` on `key`, replacing the session of the same token, and those of an
    /// older value of the key.
    fn insert(&mut self, key: KeyRef, session: Session) {
        self.retain(&key, |s| {
            s.token != session.token && s.lock_id == session.lock_id
        });
        self.by_client
            .entry(session.client)
            .or_default()
            .insert(key.clone());
        self.by_lock.insert(session.lock_id, key.clone());
        self.by_key.entry(key).or_default().push(session);
    }

    /// The sessions in `gone` left the list of `key`: their clients and locks no longer name
    /// `key`, unless another session there still does.
    fn left(&mut self, key: &KeyRef, gone: &[Session]) {
        for session in gone {
            self.unlink(session.client, key);
            let lock_stays = self
                .by_key
                .get(key)
                .is_some_and(|list| list.iter().any(|s| s.lock_id == session.lock_id));
            if !lock_stays && self.by_lock.get(&session.lock_id) == Some(key) {
                self.by_lock.remove(&session.lock_id);
            }
        }
    }

    /// Forgets that `client` owns a session on `key`, unless it still does.
    fn unlink(&mut self, client: u64, key: &KeyRef) {
        let still = self
            .by_key
            .get(key)
            .is_some_and(|list| list.iter().any(|s| s.client == client));
        if still {
            return;
        }
        if let Some(keys) = self.by_client.get_mut(&client) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_client.remove(&client);
            }
        }
    }

    fn remove(&mut self, key: &KeyRef) -> Option<Vec<Session>> {
        let list = self.by_key.remove(key)?;
        self.left(key, &list);
        Some(list)
    }

    /// Keeps the sessions of `key` that `keep` says to; returns the others.
    fn retain(&mut self, key: &KeyRef, keep: impl Fn(&Session) -> bool) -> Vec<Session> {
        let Some(list) = self.by_key.get_mut(key) else {
            return Vec::new();
        };
        let (kept, gone): (Vec<Session>, Vec<Session>) = list.drain(..).partition(keep);
        *list = kept;
        if list.is_empty() {
            self.by_key.remove(key);
        }
        self.left(key, &gone);
        gone
    }
}

static SESSIONS: LazyLock<Mutex<Sessions>> = LazyLock::new(|| Mutex::new(Sessions::default()));

/// Number of session locks owned, so the common case (none) needs no lookup.
static OWNED: AtomicUsize = AtomicUsize::new(0);

fn with<R>(f: impl FnOnce(&mut Sessions) -> R) -> R {
    let mut sessions = super::locked(&SESSIONS);
    let result = f(&mut sessions);
    OWNED.store(
        sessions.by_key.len() + sessions.moving.as_ref().map_or(0, Vec::len),
        Ordering::Relaxed,
    );
    result
}

/// True when some connection owns a session lock.
pub fn any() -> bool {
    OWNED.load(Ordering::Relaxed) > 0
}

/// Makes `client` the session owner of the lock value `lock_id` under `key`, held by `token`.
pub fn claim(key: KeyRef, client: u64, token: TokenDigest, lock_id: u64) {
    with(|s| {
        s.insert(
            key,
            Session {
                client,
                token,
                lock_id,
            },
        )
    });
}

/// Forgets the sessions of `key` (the lock was deleted, or another value took the key's
/// place).
pub fn forget(key: &KeyRef) {
    with(|s| {
        s.remove(key);
    });
}

/// Forgets the sessions of `key` whose token no longer holds the lock (a hold was released,
/// expired or forced).
pub fn keep_only(key: &KeyRef, holds: impl Fn(&TokenDigest) -> bool) {
    with(|s| {
        s.retain(key, |session| holds(&session.token));
    });
}

/// The lock value `lock_id` is being freed, by whatever removed it (possibly on a lazy-free
/// thread): its sessions end.
pub fn value_freed(lock_id: u64) {
    if !any() {
        return;
    }
    with(|s| {
        if let Some(key) = s.by_lock.get(&lock_id).cloned() {
            s.retain(&key, |session| session.lock_id != lock_id);
        }
    });
}

/// The key was renamed or moved away (`rename_from`, `move_from`): its session waits for
/// [`arrived`].
pub fn leaving(key: &KeyRef) {
    with(|s| s.moving = s.remove(key));
}

/// A key arrived under this name (`rename_to`, `move_to`): whatever sessions the name had
/// belonged to the value it replaced; the sessions that were [`leaving`] move here.
pub fn arrived(key: &KeyRef) {
    with(|s| {
        s.remove(key);
        for session in s.moving.take().unwrap_or_default() {
            s.insert(key.clone(), session);
        }
    });
}

/// FLUSHDB of `db`, or FLUSHALL for `None`.
pub fn flushed(db: Option<i32>) {
    with(|s| {
        let gone: Vec<KeyRef> = s
            .by_key
            .keys()
            .filter(|(d, _)| db.is_none_or(|db| *d == db))
            .cloned()
            .collect();
        for key in gone {
            s.remove(&key);
        }
    });
}

/// SWAPDB of `a` and `b`: the sessions follow their data.
pub fn swapped(a: i32, b: i32) {
    with(|s| {
        let moved: Vec<(KeyRef, Vec<Session>)> = s
            .by_key
            .keys()
            .filter(|(d, _)| *d == a || *d == b)
            .cloned()
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|key| s.remove(&key).map(|list| (key, list)))
            .collect();
        for ((db, name), list) in moved {
            let db = if db == a { b } else { a };
            for session in list {
                s.insert((db, name.clone()), session);
            }
        }
    });
}

/// True when `client` owns at least one session lock.
pub fn owns_any(client: u64) -> bool {
    with(|s| s.by_client.contains_key(&client))
}

/// The locks `client` owned, with their sessions, now that it is gone.
pub fn disconnected(client: u64) -> Vec<(KeyRef, Session)> {
    with(|s| {
        let keys = s.by_client.remove(&client).unwrap_or_default();
        let mut owned = Vec::new();
        for key in keys {
            let mine = s.retain(&key, |session| session.client != client);
            owned.extend(mine.into_iter().map(|session| (key.clone(), session)));
        }
        owned
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(db: i32, name: &str) -> KeyRef {
        (db, name.as_bytes().into())
    }

    fn session(client: u64, token: &[u8], lock_id: u64) -> Session {
        Session {
            client,
            token: TokenDigest::of(token),
            lock_id,
        }
    }

    #[test]
    fn latest_session_acquirer_owns_the_lock() {
        claim(key(0, "s1"), 101, TokenDigest::of(b"t"), 1);
        claim(key(0, "s1"), 102, TokenDigest::of(b"t"), 1);
        assert!(disconnected(101).is_empty());
        assert_eq!(
            disconnected(102),
            vec![(key(0, "s1"), session(102, b"t", 1))]
        );
        assert!(disconnected(102).is_empty());
    }

    #[test]
    fn forgotten_session_is_not_released_on_disconnect() {
        claim(key(0, "s2"), 201, TokenDigest::of(b"t"), 2);
        claim(key(0, "s3"), 201, TokenDigest::of(b"u"), 3);
        forget(&key(0, "s2"));
        assert_eq!(
            disconnected(201),
            vec![(key(0, "s3"), session(201, b"u", 3))]
        );
    }

    #[test]
    fn sessions_follow_rename_move_and_swapdb() {
        claim(key(0, "s4"), 301, TokenDigest::of(b"t"), 4);
        claim(key(0, "s5"), 302, TokenDigest::of(b"u"), 5);
        // RENAME s4 s5: s5's old value (and session) is overwritten.
        leaving(&key(0, "s4"));
        arrived(&key(0, "s5"));
        assert!(disconnected(302).is_empty());
        // MOVE s5 3, then SWAPDB 3 7.
        leaving(&key(0, "s5"));
        arrived(&key(3, "s5"));
        swapped(3, 7);
        assert_eq!(
            disconnected(301),
            vec![(key(7, "s5"), session(301, b"t", 4))]
        );
    }

    #[test]
    fn shared_holders_keep_a_session_each() {
        claim(key(0, "s6"), 501, TokenDigest::of(b"r1"), 8);
        claim(key(0, "s6"), 502, TokenDigest::of(b"r2"), 8);
        claim(key(0, "s6"), 501, TokenDigest::of(b"r3"), 8);
        keep_only(&key(0, "s6"), |token| *token != TokenDigest::of(b"r3"));
        assert_eq!(
            disconnected(501),
            vec![(key(0, "s6"), session(501, b"r1", 8))]
        );
        // A new value of the key replaces the sessions of the old one.
        claim(key(0, "s6"), 503, TokenDigest::of(b"x"), 9);
        assert!(disconnected(502).is_empty());
        assert_eq!(
            disconnected(503),
            vec![(key(0, "s6"), session(503, b"x", 9))]
        );
    }

    #[test]
    fn a_freed_value_takes_its_sessions_along_wherever_its_key_went() {
        claim(key(0, "s7"), 601, TokenDigest::of(b"t"), 10);
        claim(key(0, "s7"), 602, TokenDigest::of(b"u"), 10);
        claim(key(21, "s8"), 601, TokenDigest::of(b"v"), 11);
        value_freed(10);
        assert!(disconnected(602).is_empty());
        // Swapped into another database first: found there.
        swapped(21, 22);
        value_freed(11);
        assert!(disconnected(601).is_empty());
        // An unknown value, or one already gone: nothing else ends.
        claim(key(0, "s9"), 603, TokenDigest::of(b"w"), 12);
        value_freed(99_999);
        value_freed(10);
        assert_eq!(
            disconnected(603),
            vec![(key(0, "s9"), session(603, b"w", 12))]
        );
    }

    #[test]
    fn a_lock_is_indexed_while_it_has_a_session_and_no_longer() {
        let mut s = Sessions::default();
        s.insert(key(0, "a"), session(1, b"r1", 7));
        s.insert(key(0, "a"), session(2, b"r2", 7));
        s.insert(key(0, "b"), session(1, b"t", 8));
        assert_eq!(s.by_lock.len(), 2);
        // One of two sessions of lock 7 ends: it is still indexed.
        s.retain(&key(0, "a"), |session| session.client != 2);
        assert_eq!(s.by_lock.get(&7), Some(&key(0, "a")));
        // A new value of "a" replaces lock 7.
        s.insert(key(0, "a"), session(3, b"x", 9));
        assert_eq!(s.by_lock.get(&7), None);
        assert_eq!(s.by_lock.get(&9), Some(&key(0, "a")));
        // Moved: indexed under the new name.
        let moving = s.remove(&key(0, "b")).unwrap_or_default();
        for session in moving {
            s.insert(key(4, "b"), session);
        }
        assert_eq!(s.by_lock.get(&8), Some(&key(4, "b")));
        s.remove(&key(0, "a"));
        s.retain(&key(4, "b"), |_| false);
        assert!(s.by_lock.is_empty());
        assert!(s.by_key.is_empty());
        assert!(s.by_client.is_empty());
    }

    #[test]
    fn flush_ends_the_sessions_of_its_database() {
        claim(key(11, "a"), 401, TokenDigest::of(b"t"), 6);
        claim(key(12, "b"), 401, TokenDigest::of(b"t"), 7);
        flushed(Some(11));
        assert_eq!(
            disconnected(401),
            vec![(key(12, "b"), session(401, b"t", 7))]
        );
    }
}
