//! How old the holds are: every held lock by the grant time of its oldest hold, so the oldest
//! hold of the whole server is the first entry; and the long-hold log, the holds that lasted
//! longer than `lock.long-hold`, newest first, bounded like SLOWLOG.
//!
//! Locks are named by their value's id, with a tag of their key (see [`tag_of`]) for the one
//! place a key must be named without its name: INFO.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

/// A key's tag: a keyed hash of its name, with a key drawn once per process. The same key name
/// has the same tag in INFO, `LOCK.WHO` and the long-hold log of one server process, whatever
/// its database (so SWAPDB changes no tag), and nobody outside can compute it, so a tag in a
/// metrics system says nothing of the name.
pub fn tag_of(key: &[u8]) -> u64 {
    static SECRET: OnceLock<RandomState> = OnceLock::new();
    SECRET.get_or_init(RandomState::new).hash_one(key)
}

/// A tag as text: 16 hex digits.
pub fn tag_text(tag: u64) -> String {
    format!("{tag:016x}")
}

/// The held locks by the grant time of their oldest hold.
#[derive(Default)]
pub struct Ages {
    by_time: BTreeSet<(u64, u64)>,
    /// Lock id -> (its oldest grant time, its key's tag): a hash map, since every change of a
    /// lock looks its id up (made at the first use: a static needs a const constructor).
    of: Option<HashMap<u64, (u64, u64)>>,
}

impl Ages {
    pub const fn new() -> Self {
        Ages {
            by_time: BTreeSet::new(),
            of: None,
        }
    }

    fn of(&mut self) -> &mut HashMap<u64, (u64, u64)> {
        self.of.get_or_insert_with(HashMap::new)
    }

    /// Lock `id`'s oldest hold was granted at `since` (`None`: it has no hold whose grant
    /// time is known). `tag` is asked only for a lock not tracked yet.
    pub fn set(&mut self, id: u64, since: Option<u64>, tag: impl FnOnce() -> u64) {
        match (self.of().get(&id).copied(), since) {
            (Some((old, _)), Some(new)) if old == new => {}
            (Some((old, tag)), Some(new)) => {
                self.by_time.remove(&(old, id));
                self.by_time.insert((new, id));
                self.of().insert(id, (new, tag));
            }
            (None, Some(new)) => {
                self.by_time.insert((new, id));
                let tag = tag();
                self.of().insert(id, (new, tag));
            }
            (Some(_), None) => self.forget(id),
            (None, None) => {}
        }
    }

    /// Lock `id` now lives under the key with tag `tag` (RENAME, MOVE).
    pub fn retag(&mut self, id: u64, tag: u64) {
        if let Some(entry) = self.of().get_mut(&id) {
            entry.1 = tag;
        }
    }

    pub fn forget(&mut self, id: u64) {
        if let Some((since, _)) = self.of.as_mut().and_then(|of| of.remove(&id)) {
            self.by_time.remove(&(since, id));
        }
    }

    /// The oldest hold's grant time and its key's tag.
    pub fn oldest(&self) -> Option<(u64, u64)> {
        let (since, id) = self.by_time.first()?;
        Some((*since, self.of.as_ref()?.get(id)?.1))
    }

    pub fn len(&self) -> usize {
        self.of.as_ref().map_or(0, HashMap::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        self.by_time.clear();
        self.of = None;
    }
}

/// How a logged long hold ended; `None` while it lasts.
pub type Ending = Option<&'static str>;

/// One hold that lasted longer than `lock.long-hold`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LongHold {
    /// Unique, increasing.
    pub id: u64,
    /// When it crossed the threshold, ms since the epoch.
    pub at: u64,
    pub db: i32,
    pub key: Box<[u8]>,
    pub tag: u64,
    pub fence: u64,
    /// When it was granted, ms since the epoch.
    pub since: u64,
    pub client: u64,
    /// `addr name label` (see `core::Grant::who`).
    pub who: Box<[u8]>,
    /// How long it was held: set when it ended.
    pub held_ms: Option<u64>,
    pub ended: Ending,
    /// The lock value's id, to find the entry when the hold ends.
    lock: u64,
}

impl LongHold {
    /// The hold ended at `now`, `ending` says how: its time stays as it was then.
    fn end(&mut self, ending: &'static str, now: u64) {
        self.ended = Some(ending);
        self.held_ms = Some(now.saturating_sub(self.since));
    }
}

/// The long-hold log: newest first, at most `max` entries.
#[derive(Default)]
pub struct LongLog {
    entries: VecDeque<LongHold>,
    next_id: u64,
}

/// A hold crossing the threshold, as the log records it.
pub struct Crossing<'a> {
    pub at: u64,
    pub db: i32,
    pub key: &'a [u8],
    pub lock: u64,
    pub fence: u64,
    pub since: u64,
    pub client: u64,
    pub who: &'a [u8],
}

impl LongLog {
    pub const fn new() -> Self {
        LongLog {
            entries: VecDeque::new(),
            next_id: 0,
        }
    }

    /// Records a hold that crossed the threshold, keeping at most `max` entries.
    pub fn record(&mut self, crossing: Crossing, max: usize) {
        let entry = LongHold {
            id: self.next_id,
            at: crossing.at,
            db: crossing.db,
            key: crossing.key.into(),
            tag: tag_of(crossing.key),
            fence: crossing.fence,
            since: crossing.since,
            client: crossing.client,
            who: crossing.who.into(),
            held_ms: None,
            ended: None,
            lock: crossing.lock,
        };
        self.next_id += 1;
        self.entries.push_front(entry);
        self.entries.truncate(max);
    }

    /// The hold with `fence` of lock `lock` ended at `now` (`ending` says how): its entry, if
    /// still logged, says so.
    pub fn ended(&mut self, lock: u64, fence: u64, ending: &'static str, now: u64) {
        let open = self
            .entries
            .iter_mut()
            .find(|e| e.lock == lock && e.fence == fence && e.ended.is_none());
        if let Some(entry) = open {
            entry.end(ending, now);
        }
    }

    /// Every open entry of lock `lock` ended at `now` (its value was deleted).
    pub fn all_ended(&mut self, lock: u64, ending: &'static str, now: u64) {
        for entry in self.entries.iter_mut() {
            if entry.lock == lock && entry.ended.is_none() {
                entry.end(ending, now);
            }
        }
    }

    /// The newest `count` entries.
    pub fn newest(&self, count: usize) -> impl Iterator<Item = &LongHold> {
        self.entries.iter().take(count)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Empties the log (ids keep growing).
    pub fn reset(&mut self) {
        self.entries.clear();
    }

    /// Drops the oldest entries beyond `max` (the config was lowered).
    pub fn trim(&mut self, max: usize) {
        self.entries.truncate(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_hold_is_first_and_follows_changes() {
        let mut ages = Ages::new();
        assert_eq!(ages.oldest(), None);
        ages.set(1, Some(500), || 11);
        ages.set(2, Some(300), || 22);
        ages.set(3, None, || 33);
        assert_eq!(ages.oldest(), Some((300, 22)));
        assert_eq!(ages.len(), 2);
        // The tag is kept; the time moves.
        ages.set(2, Some(700), || 99);
        assert_eq!(ages.oldest(), Some((500, 11)));
        ages.retag(1, 44);
        assert_eq!(ages.oldest(), Some((500, 44)));
        ages.set(1, None, || 0);
        assert_eq!(ages.oldest(), Some((700, 22)));
        ages.forget(2);
        assert!(ages.is_empty());
        assert_eq!(ages.oldest(), None);
    }

    #[test]
    fn tags_are_stable_and_differ_by_key() {
        assert_eq!(tag_of(b"orders:42"), tag_of(b"orders:42"));
        assert_ne!(tag_of(b"orders:42"), tag_of(b"orders:43"));
        assert_eq!(tag_text(0xab).len(), 16);
    }

    fn crossing(lock: u64, fence: u64) -> Crossing<'static> {
        Crossing {
            at: 2000,
            db: 0,
            key: b"k",
            lock,
            fence,
            since: 1000,
            client: 5,
            who: b"127.0.0.1:1 w l",
        }
    }

    #[test]
    fn the_log_is_newest_first_bounded_and_records_endings() {
        let mut log = LongLog::new();
        log.record(crossing(1, 10), 2);
        log.record(crossing(2, 20), 2);
        log.record(crossing(3, 30), 2);
        assert_eq!(log.len(), 2);
        let ids: Vec<u64> = log.newest(10).map(|e| e.id).collect();
        assert_eq!(ids, [2, 1]);
        log.ended(2, 20, "released", 4500);
        log.ended(2, 21, "expired", 9999);
        let entry = log.newest(10).nth(1).cloned();
        assert_eq!(entry.as_ref().and_then(|e| e.ended), Some("released"));
        assert_eq!(entry.and_then(|e| e.held_ms), Some(3500));
        // An ended entry stays as it ended.
        log.all_ended(2, "deleted", 8000);
        assert_eq!(
            log.newest(10).nth(1).and_then(|e| e.ended),
            Some("released")
        );
        log.all_ended(3, "deleted", 8000);
        assert_eq!(log.newest(1).next().and_then(|e| e.ended), Some("deleted"));
        log.trim(1);
        assert_eq!(log.len(), 1);
        log.reset();
        assert!(log.is_empty());
        log.record(crossing(4, 40), 2);
        assert_eq!(log.newest(1).next().map(|e| e.id), Some(3));
    }
}
