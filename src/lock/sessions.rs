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

/// The sessions on one key: all of one lock value, one per token that holds with SESSION (one
/// for an exclusive lock; one per shared or permit holder that asked for it).
#[derive(Debug, Default)]
struct KeySessions {
    lock_id: u64,
    /// Token -> the client that owns its session.
    owners: HashMap<TokenDigest, u64>,
}

/// Every operation costs O(1) per session it touches, however many sessions a key or a client
/// has: a key with ten thousand session holders changes one at a time.
#[derive(Default)]
struct Sessions {
    by_key: HashMap<KeyRef, KeySessions>,
    /// Client id -> the keys it owns sessions on, and the tokens of those sessions there.
    by_client: HashMap<u64, HashMap<KeyRef, HashSet<TokenDigest>>>,
    /// The sessions of a key just renamed or moved away, until its new name is announced.
    moving: Option<KeySessions>,
    /// Lock value id -> the key of its sessions.
    by_lock: HashMap<u64, KeyRef>,
}

impl Sessions {
    /// Records `session` on `key`: it replaces the session of the same token, and the sessions
    /// of an older value of the key.
    fn insert(&mut self, key: KeyRef, session: Session) {
        let older = self
            .by_key
            .get(&key)
            .is_some_and(|sessions| sessions.lock_id != session.lock_id);
        if older {
            self.remove(&key);
        }
        let sessions = self.by_key.entry(key.clone()).or_default();
        sessions.lock_id = session.lock_id;
        let replaced = sessions.owners.insert(session.token, session.client);
        if let Some(client) = replaced {
            self.unlink(client, &key, &session.token);
        }
        self.by_client
            .entry(session.client)
            .or_default()
            .entry(key.clone())
            .or_default()
            .insert(session.token);
        self.by_lock.insert(session.lock_id, key);
    }

    /// Forgets that `client` owns the session of `token` on `key`.
    fn unlink(&mut self, client: u64, key: &KeyRef, token: &TokenDigest) {
        let Some(keys) = self.by_client.get_mut(&client) else {
            return;
        };
        if let Some(tokens) = keys.get_mut(key) {
            tokens.remove(token);
            if tokens.is_empty() {
                keys.remove(key);
            }
        }
        if keys.is_empty() {
            self.by_client.remove(&client);
        }
    }

    /// Removes every session of `key`.
    fn remove(&mut self, key: &KeyRef) -> Option<KeySessions> {
        let sessions = self.by_key.remove(key)?;
        for (token, client) in &sessions.owners {
            self.unlink(*client, key, token);
        }
        if self.by_lock.get(&sessions.lock_id) == Some(key) {
            self.by_lock.remove(&sessions.lock_id);
        }
        Some(sessions)
    }

    /// Removes the session of each of `tokens` on `key` (owned by `only`, when given); returns
    /// the sessions removed.
    fn remove_tokens<'a>(
        &mut self,
        key: &KeyRef,
        tokens: impl IntoIterator<Item = &'a TokenDigest>,
        only: Option<u64>,
    ) -> Vec<Session> {
        let Some(sessions) = self.by_key.get_mut(key) else {
            return Vec::new();
        };
        let lock_id = sessions.lock_id;
        let mut gone = Vec::new();
        for token in tokens {
            let owner = sessions.owners.get(token).copied();
            if owner.is_some_and(|client| only.is_none_or(|only| only == client)) {
                sessions.owners.remove(token);
                gone.push(Session {
                    client: owner.unwrap_or_default(),
                    token: *token,
                    lock_id,
                });
            }
        }
        let empty = sessions.owners.is_empty();
        for session in &gone {
            self.unlink(session.client, key, &session.token);
        }
        if empty {
            self.remove(key);
        }
        gone
    }
}

static SESSIONS: LazyLock<Mutex<Sessions>> = LazyLock::new(|| Mutex::new(Sessions::default()));

/// Number of keys with session locks, so the common case (none) needs no lookup.
static OWNED: AtomicUsize = AtomicUsize::new(0);

fn with<R>(f: impl FnOnce(&mut Sessions) -> R) -> R {
    let mut sessions = super::locked(&SESSIONS);
    let result = f(&mut sessions);
    OWNED.store(
        sessions.by_key.len() + usize::from(sessions.moving.is_some()),
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

/// Forgets the sessions of `tokens` on `key`: their holds ended (released, expired, taken back).
pub fn forget_tokens<'a>(key: &KeyRef, tokens: impl IntoIterator<Item = &'a TokenDigest>) {
    if !any() {
        return;
    }
    with(|s| {
        s.remove_tokens(key, tokens, None);
    });
}

/// Forgets the sessions of `key` whose token no longer holds the lock (after a change of the
/// whole lock: a forced release, a downgrade).
pub fn keep_only(key: &KeyRef, holds: impl Fn(&TokenDigest) -> bool) {
    with(|s| {
        let gone: Vec<TokenDigest> = s
            .by_key
            .get(key)
            .map(|sessions| {
                sessions
                    .owners
                    .keys()
                    .filter(|token| !holds(token))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        s.remove_tokens(key, &gone, None);
    });
}

/// The lock value `lock_id` is being freed, by whatever removed it (possibly on a lazy-free
/// thread): its sessions end.
pub fn value_freed(lock_id: u64) {
    if !any() {
        return;
    }
    with(|s| {
        let key = s.by_lock.get(&lock_id).cloned();
        if let Some(key) = key {
            if s.by_key.get(&key).is_some_and(|k| k.lock_id == lock_id) {
                s.remove(&key);
            }
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
        if let Some(moved) = s.moving.take() {
            s.settle(key, moved);
        }
    });
}

impl Sessions {
    /// Puts the sessions of a value that moved under `key`.
    fn settle(&mut self, key: &KeyRef, moved: KeySessions) {
        for (token, client) in moved.owners {
            self.insert(
                key.clone(),
                Session {
                    client,
                    token,
                    lock_id: moved.lock_id,
                },
            );
        }
    }
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
        let keys: Vec<KeyRef> = s
            .by_key
            .keys()
            .filter(|(d, _)| *d == a || *d == b)
            .cloned()
            .collect();
        let moved: Vec<(KeyRef, KeySessions)> = keys
            .into_iter()
            .filter_map(|key| s.remove(&key).map(|sessions| (key, sessions)))
            .collect();
        for ((db, name), sessions) in moved {
            let db = if db == a { b } else { a };
            s.settle(&(db, name), sessions);
        }
    });
}

/// True when `client` owns at least one session lock.
pub fn owns_any(client: u64) -> bool {
    with(|s| s.by_client.contains_key(&client))
}

/// The keys on which `client` owns sessions now.
pub fn keys_of(client: u64) -> Vec<KeyRef> {
    with(|s| {
        s.by_client
            .get(&client)
            .map(|keys| keys.keys().cloned().collect())
            .unwrap_or_default()
    })
}

/// At most `max` of the sessions the closed connection `client` still owns on `key`, taken
/// out of the table now (not when the connection closed: a session another connection claimed
/// meanwhile is no longer its, and one whose key was renamed meanwhile is under its new name,
/// found by [`keys_of`] again). Fewer than `max`: it owns none there any more.
pub fn take_closed(client: u64, key: &KeyRef, max: usize) -> Vec<Session> {
    with(|s| {
        let tokens: Vec<TokenDigest> = s
            .by_client
            .get(&client)
            .and_then(|keys| keys.get(key))
            .map(|tokens| tokens.iter().take(max).copied().collect())
            .unwrap_or_default();
        let sessions = s.remove_tokens(key, &tokens, Some(client));
        // Whatever the table said of them, these tokens are no longer the client's there.
        for token in &tokens {
            s.unlink(client, key, token);
        }
        sessions
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(db: i32, name: &str) -> KeyRef {
        (db, name.as_bytes().into())
    }

    /// Every session a closed connection still owns, key by key as they are taken, one at a
    /// time.
    fn disconnected(client: u64) -> Vec<(KeyRef, Session)> {
        let mut owned = Vec::new();
        loop {
            let keys = keys_of(client);
            if keys.is_empty() {
                return owned;
            }
            for key in keys {
                loop {
                    let taken = take_closed(client, &key, 1);
                    if taken.is_empty() {
                        break;
                    }
                    owned.extend(taken.into_iter().map(|session| (key.clone(), session)));
                }
            }
        }
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
        s.remove_tokens(&key(0, "a"), &[TokenDigest::of(b"r2")], None);
        assert_eq!(s.by_lock.get(&7), Some(&key(0, "a")));
        // A new value of "a" replaces lock 7.
        s.insert(key(0, "a"), session(3, b"x", 9));
        assert_eq!(s.by_lock.get(&7), None);
        assert_eq!(s.by_lock.get(&9), Some(&key(0, "a")));
        // Moved: indexed under the new name.
        let moving = s.remove(&key(0, "b")).unwrap_or_default();
        s.settle(&key(4, "b"), moving);
        assert_eq!(s.by_lock.get(&8), Some(&key(4, "b")));
        s.remove(&key(0, "a"));
        s.remove_tokens(&key(4, "b"), &[TokenDigest::of(b"t")], None);
        assert!(s.by_lock.is_empty());
        assert!(s.by_key.is_empty());
        assert!(s.by_client.is_empty());
    }

    #[test]
    fn a_closed_connections_sessions_are_taken_a_key_at_a_time_as_they_are_then() {
        claim(key(5, "c1"), 701, TokenDigest::of(b"t"), 20);
        claim(key(5, "c2"), 701, TokenDigest::of(b"t"), 21);
        claim(key(5, "c3"), 701, TokenDigest::of(b"r1"), 22);
        claim(key(5, "c3"), 701, TokenDigest::of(b"r2"), 22);
        // After the close: c1 is claimed by another connection, c2 renamed.
        claim(key(5, "c1"), 702, TokenDigest::of(b"t"), 20);
        leaving(&key(5, "c2"));
        arrived(&key(5, "c2-renamed"));
        let mut taken = disconnected(701);
        taken.sort_by_key(|(key, session)| (key.clone(), session.token));
        let mut expected = vec![
            (key(5, "c2-renamed"), session(701, b"t", 21)),
            (key(5, "c3"), session(701, b"r1", 22)),
            (key(5, "c3"), session(701, b"r2", 22)),
        ];
        expected.sort_by_key(|(key, session)| (key.clone(), session.token));
        assert_eq!(taken, expected);
        assert_eq!(
            disconnected(702),
            vec![(key(5, "c1"), session(702, b"t", 20))]
        );
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
