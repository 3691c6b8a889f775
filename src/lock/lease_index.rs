//! The lease index: every lock with a deadline, ordered by it, so the expiry timer finds what is
//! due without scanning the keyspace.
//!
//! An entry is (deadline, lock id) -> (database handle, key name). A lock id is unique per value
//! for the life of the process, so the value's own free callback can take its entry out (see
//! [`LeaseIndex::forget`]) whatever removed it: a deleted, overwritten, evicted or flushed lock
//! leaves nothing behind. Entries are still hints: one may come due early, and whoever pops an
//! entry checks the key's value before acting on it.
//!
//! Beside the B-tree, a queue of reclaim times: a release makes a lock due for reclaim
//! `lock.tombstone-ttl` after it, a time no earlier than any queued before while that config
//! stays, so it is appended at the back (no search), and the timer takes from whichever of the
//! two comes due first.
//!
//! A lock has one entry at most, in the B-tree or in the queue, and its value names it (an
//! [`Entry`]): a new entry replaces the one named, and the value's free callback takes out
//! exactly the one named.
//!
//! Databases are named through handles so that SWAPDB is O(1): it swaps which database two
//! handles stand for, and every entry follows its data.

use std::collections::VecDeque;

use super::chunked::ChunkedMap;
use super::text::Text;

/// The latest time an entry can have: a lock's value marks its entry's time in 62 bits (see
/// `service::value`).
pub const LATEST: u64 = (1 << 62) - 1;

/// The time a lock due at `due` is indexed at: at least 1 (a mark of 0 names no entry), at most
/// [`LATEST`] (millions of years away: an entry may come due early, never late). Both the index
/// and the value's mark get the time this gives, so the value always names its entry.
pub fn entry_time(due: u64) -> u64 {
    due.clamp(1, LATEST)
}

/// A lock's entry: when it comes due, and whether it is a queued reclaim rather than a B-tree
/// entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub at: u64,
    pub queued: bool,
}

impl Entry {
    /// An entry in the B-tree.
    pub const fn tree(at: u64) -> Entry {
        Entry { at, queued: false }
    }

    /// A queued reclaim.
    pub const fn queued(at: u64) -> Entry {
        Entry { at, queued: true }
    }
}

/// An entry that came due.
#[derive(Debug, PartialEq, Eq)]
pub struct Due {
    pub db: i32,
    /// The lock's id.
    pub id: u64,
    pub key: Text,
    /// Its time.
    pub at: u64,
    /// From the reclaim queue, not the B-tree.
    pub queued: bool,
}

impl Due {
    /// The entry that came due, as its lock names it.
    pub fn entry(&self) -> Entry {
        Entry {
            at: self.at,
            queued: self.queued,
        }
    }
}

/// Where a lock is: a database handle and the key name (inline when short, as most lock names
/// are: no allocation of its own).
#[derive(Debug)]
struct Place {
    handle: u32,
    key: Text,
}

// An entry of the B-tree, as its chunks hold it (see `chunked::CAP`).
const _: () = assert!(std::mem::size_of::<((u64, u64), Place)>() == 48);

/// A queued reclaim.
#[derive(Debug)]
struct Reclaim {
    at: u64,
    id: u64,
    place: Place,
}

/// Entries per chunk of the reclaim queue (32 KiB).
const CHUNK: usize = 1024;

/// A first-in first-out queue in chunks of fixed capacity: it never moves its entries to grow
/// (one large copy would stall the event loop in the middle of a mass expiry), and a chunk is
/// freed as soon as it is drained.
#[derive(Default)]
struct ReclaimQueue {
    chunks: VecDeque<VecDeque<Reclaim>>,
    len: usize,
}

impl ReclaimQueue {
    const fn new() -> Self {
        ReclaimQueue {
            chunks: VecDeque::new(),
            len: 0,
        }
    }

    fn front(&self) -> Option<&Reclaim> {
        self.chunks.front()?.front()
    }

    fn back(&self) -> Option<&Reclaim> {
        self.chunks.back()?.back()
    }

    fn push_back(&mut self, entry: Reclaim) {
        match self.chunks.back_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push_back(entry),
            _ => {
                let mut chunk = VecDeque::with_capacity(CHUNK);
                chunk.push_back(entry);
                self.chunks.push_back(chunk);
            }
        }
        self.len += 1;
    }

    fn pop_front(&mut self) -> Option<Reclaim> {
        let chunk = self.chunks.front_mut()?;
        let entry = chunk.pop_front();
        if chunk.is_empty() {
            self.chunks.pop_front();
        }
        if entry.is_some() {
            self.len -= 1;
        }
        entry
    }

    /// Removes the reclaim of lock `id` queued at `at`, if there is one.
    fn remove(&mut self, at: u64, id: u64) -> Option<Reclaim> {
        // Times never decrease from front to back, within and across chunks.
        let first = self
            .chunks
            .partition_point(|chunk| chunk.back().is_some_and(|r| r.at < at));
        for c in first..self.chunks.len() {
            let chunk = &mut self.chunks[c];
            if chunk.front().is_some_and(|r| r.at > at) {
                break;
            }
            let from = chunk.partition_point(|r| r.at < at);
            let found = (from..chunk.len())
                .take_while(|&i| chunk[i].at == at)
                .find(|&i| chunk[i].id == id);
            if let Some(i) = found {
                let reclaim = chunk.remove(i);
                if chunk.is_empty() {
                    self.chunks.remove(c);
                }
                self.len -= 1;
                return reclaim;
            }
        }
        None
    }

    fn retain(&mut self, keep: impl Fn(&Reclaim) -> bool) {
        for chunk in &mut self.chunks {
            chunk.retain(&keep);
        }
        self.chunks.retain(|chunk| !chunk.is_empty());
        self.len = self.chunks.iter().map(VecDeque::len).sum();
    }

    fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[derive(Default)]
pub struct LeaseIndex {
    /// (time, lock id) -> place, in chunks that entries coming in time order fill.
    entries: ChunkedMap<(u64, u64), Place>,
    /// `at` never decreases from front to back.
    queue: ReclaimQueue,
    /// Handle -> database number.
    dbs: Vec<i32>,
    /// Database number -> handle (`u32::MAX`: none yet).
    handles: Vec<u32>,
}

impl LeaseIndex {
    pub const fn new() -> Self {
        LeaseIndex {
            entries: ChunkedMap::new(),
            queue: ReclaimQueue::new(),
            dbs: Vec::new(),
            handles: Vec::new(),
        }
    }

    fn handle(&mut self, db: i32) -> u32 {
        let at = usize::try_from(db).unwrap_or(0);
        if self.handles.len() <= at {
            self.handles.resize(at + 1, u32::MAX);
        }
        if self.handles[at] == u32::MAX {
            self.handles[at] = u32::try_from(self.dbs.len()).unwrap_or(u32::MAX - 1);
            self.dbs.push(db);
        }
        self.handles[at]
    }

    fn place(&mut self, db: i32, key: &[u8]) -> Place {
        Place {
            handle: self.handle(db),
            key: Text::of_pieces(&[key]),
        }
    }

    fn db_of(&self, handle: u32) -> i32 {
        self.dbs.get(handle as usize).copied().unwrap_or(-1)
    }

    /// Adds an entry for lock `id` under `key` in `db`, due at `at`; an entry of the lock at
    /// that time already now names this place (the lock was renamed or moved).
    pub fn insert(&mut self, at: u64, db: i32, id: u64, key: &[u8]) {
        let place = self.place(db, key);
        self.entries.insert((at, id), place);
    }

    /// Replaces the entry `old` of lock `id` (if it has one) by a B-tree entry at `new`, reusing
    /// its copy of the key name.
    pub fn reindex(&mut self, db: i32, id: u64, key: &[u8], old: Option<Entry>, new: u64) {
        let place = self.replacing(old, id, db, key);
        self.entries.insert((new, id), place);
    }

    /// Replaces the entry `old` of lock `id` (if it has one) by a reclaim queued at `at`, when
    /// no queued one is later; false (and nothing changed) otherwise. The queued reclaim takes
    /// the old entry's copy of the key name.
    pub fn queue(&mut self, at: u64, db: i32, id: u64, key: &[u8], old: Option<Entry>) -> bool {
        if self.queue.back().is_some_and(|last| last.at > at) {
            return false;
        }
        let place = self.replacing(old, id, db, key);
        self.queue.push_back(Reclaim { at, id, place });
        true
    }

    /// Takes the entry `old` of lock `id` out, and returns the place for its successor: the
    /// old entry's, when it names the same one.
    fn replacing(&mut self, old: Option<Entry>, id: u64, db: i32, key: &[u8]) -> Place {
        let handle = self.handle(db);
        match old.and_then(|old| self.take(id, old)) {
            Some(place) if place.handle == handle && place.key.as_bytes() == key => place,
            _ => self.place(db, key),
        }
    }

    /// Takes the entry of lock `id` out (its value is gone, or it moved): true when it was
    /// there.
    pub fn forget(&mut self, id: u64, entry: Entry) -> bool {
        self.take(id, entry).is_some()
    }

    fn take(&mut self, id: u64, entry: Entry) -> Option<Place> {
        if entry.queued {
            self.queue.remove(entry.at, id).map(|reclaim| reclaim.place)
        } else {
            self.entries.remove(&(entry.at, id))
        }
    }

    /// The earliest entry's time, and whether it is in the queue (not the B-tree).
    fn earliest(&self) -> Option<(u64, bool)> {
        let tree = self.entries.first_key_value().map(|((at, _), _)| *at);
        let queue = self.queue.front().map(|r| r.at);
        match (tree, queue) {
            (Some(a), Some(b)) if b < a => Some((b, true)),
            (Some(a), _) => Some((a, false)),
            (None, Some(b)) => Some((b, true)),
            (None, None) => None,
        }
    }

    /// The earliest time anything is due.
    pub fn first_due(&self) -> Option<u64> {
        self.earliest().map(|(at, _)| at)
    }

    /// Takes the earliest entry if it is due at `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<Due> {
        let (at, queued) = self.earliest()?;
        if at > now {
            return None;
        }
        let (id, place) = if queued {
            self.queue.pop_front().map(|r| (r.id, r.place))?
        } else {
            self.entries
                .pop_first()
                .map(|((_, id), place)| (id, place))?
        };
        Some(Due {
            db: self.db_of(place.handle),
            id,
            key: place.key,
            at,
            queued,
        })
    }

    /// Drops the entries of database `db`, or all for `None` (FLUSHDB / FLUSHALL).
    pub fn forget_db(&mut self, db: Option<i32>) {
        match db {
            Some(db) => {
                let handle = self.handle(db);
                self.entries.retain(|_, place| place.handle != handle);
                self.queue.retain(|r| r.place.handle != handle);
            }
            None => {
                self.entries.clear();
                self.queue.clear();
            }
        }
    }

    /// SWAPDB: the data of `a` is now in `b` and the other way round.
    pub fn swap_dbs(&mut self, a: i32, b: i32) {
        let (ha, hb) = (self.handle(a), self.handle(b));
        self.dbs.swap(ha as usize, hb as usize);
        if let (Ok(a), Ok(b)) = (usize::try_from(a), usize::try_from(b)) {
            self.handles.swap(a, b);
        }
    }

    /// Replaces every entry (after loading): `(at, db, id, key)` for each lock with a deadline.
    pub fn replace(&mut self, found: impl IntoIterator<Item = (u64, i32, u64, Box<[u8]>)>) {
        self.entries.clear();
        self.queue.clear();
        for (at, db, id, key) in found {
            let handle = self.handle(db);
            let key = Text::of_pieces(&[&key]);
            self.entries.insert((at, id), Place { handle, key });
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len() + self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(at: u64, db: i32, id: u64, key: &str) -> Due {
        Due {
            db,
            id,
            key: Text::of_pieces(&[key.as_bytes()]),
            at,
            queued: false,
        }
    }

    fn queued(at: u64, db: i32, id: u64, key: &str) -> Due {
        Due {
            queued: true,
            ..due(at, db, id, key)
        }
    }

    #[test]
    fn queued_reclaims_and_tree_entries_come_due_in_one_order() {
        let mut index = LeaseIndex::new();
        index.insert(20, 0, 1, b"held");
        assert!(index.queue(10, 0, 2, b"early", None));
        assert!(index.queue(30, 0, 3, b"late", None));
        // Earlier than the back: refused, left to the tree.
        assert!(!index.queue(25, 0, 4, b"refused", None));
        assert_eq!(index.len(), 3);
        assert_eq!(index.first_due(), Some(10));
        assert_eq!(index.pop_due(5), None);
        assert_eq!(index.pop_due(40), Some(queued(10, 0, 2, "early")));
        assert_eq!(index.pop_due(40), Some(due(20, 0, 1, "held")));
        assert_eq!(index.first_due(), Some(30));
        assert_eq!(index.pop_due(29), None);
        assert_eq!(index.pop_due(30), Some(queued(30, 0, 3, "late")));
        assert!(index.is_empty());
    }

    #[test]
    fn the_queue_keeps_its_order_across_chunks_and_frees_drained_ones() {
        let mut index = LeaseIndex::new();
        let n = 3 * CHUNK as u64 + 7;
        for i in 0..n {
            assert!(index.queue(i, 0, i, b"k", None));
        }
        assert_eq!(index.queue.chunks.len(), 4);
        index.forget_db(Some(1));
        assert_eq!(index.len(), n as usize);
        for i in 0..CHUNK as u64 + 1 {
            assert_eq!(index.pop_due(n).map(|d| d.id), Some(i));
        }
        assert_eq!(index.queue.chunks.len(), 3);
        assert_eq!(index.len(), (n - CHUNK as u64 - 1) as usize);
        for i in CHUNK as u64 + 1..n {
            assert_eq!(index.pop_due(n).map(|d| d.id), Some(i));
        }
        assert!(index.is_empty());
        assert!(index.queue.chunks.is_empty());
    }

    #[test]
    fn flushes_and_swaps_reach_the_queue() {
        let mut index = LeaseIndex::new();
        assert!(index.queue(1, 0, 1, b"zero", None));
        assert!(index.queue(2, 5, 2, b"five", None));
        assert!(index.queue(3, 7, 3, b"seven", None));
        index.swap_dbs(0, 7);
        index.forget_db(Some(5));
        assert_eq!(index.pop_due(10), Some(queued(1, 7, 1, "zero")));
        assert_eq!(index.pop_due(10), Some(queued(3, 0, 3, "seven")));
        assert!(index.queue(4, 0, 4, b"k", None));
        index.forget_db(None);
        assert!(index.is_empty());
        assert!(index.queue(1, 0, 5, b"after a flush, any time", None));
    }

    #[test]
    fn a_freed_lock_takes_its_entry_out_of_the_tree_or_the_queue() {
        let mut index = LeaseIndex::new();
        index.insert(50, 0, 1, b"held");
        index.insert(50, 0, 2, b"other");
        // Many reclaims at one time, across chunks: the one of lock 7 is found among them.
        for id in 100..100 + 2 * CHUNK as u64 {
            assert!(index.queue(60, 0, id, b"released", None));
        }
        assert!(index.queue(60, 0, 7, b"released", None));
        assert!(index.queue(70, 0, 8, b"later", None));
        assert!(index.forget(1, Entry::tree(50)));
        assert!(index.forget(7, Entry::queued(60)));
        // Not there (any more), or not of that kind: nothing else goes.
        assert!(!index.forget(7, Entry::queued(60)));
        assert!(!index.forget(1, Entry::tree(50)));
        assert!(!index.forget(8, Entry::queued(60)));
        assert!(!index.forget(2, Entry::queued(50)));
        assert!(!index.forget(8, Entry::tree(70)));
        assert_eq!(index.len(), 1 + 2 * CHUNK + 1);
        assert_eq!(index.pop_due(100), Some(due(50, 0, 2, "other")));
        for id in 100..100 + 2 * CHUNK as u64 {
            assert_eq!(index.pop_due(100).map(|d| d.id), Some(id));
        }
        assert!(index.forget(8, Entry::queued(70)));
        assert!(index.is_empty());
        assert!(index.queue.chunks.is_empty());
    }

    #[test]
    fn a_new_entry_replaces_the_old_one_of_either_kind() {
        let mut index = LeaseIndex::new();
        index.insert(500, 0, 1, b"released");
        index.insert(600, 0, 2, b"held");
        // Released: the reclaim takes the lease's place.
        assert!(index.queue(100, 0, 1, b"released", Some(Entry::tree(500))));
        assert_eq!(index.len(), 2);
        // Taken again with a lease due before its reclaim: the lease takes the reclaim's place.
        index.reindex(0, 1, b"released", Some(Entry::queued(100)), 90);
        assert_eq!(index.len(), 2);
        assert!(index.queue.is_empty());
        // Released again: queued once more.
        assert!(index.queue(150, 0, 1, b"released", Some(Entry::tree(90))));
        assert_eq!(index.pop_due(1000), Some(queued(150, 0, 1, "released")));
        assert_eq!(index.pop_due(1000), Some(due(600, 0, 2, "held")));
        // Refused (a later one is queued): the B-tree entry stays.
        index.insert(500, 0, 3, b"refused");
        assert!(index.queue(200, 0, 4, b"later", None));
        assert!(!index.queue(150, 0, 3, b"refused", Some(Entry::tree(500))));
        assert_eq!(index.pop_due(1000), Some(queued(200, 0, 4, "later")));
        assert_eq!(index.pop_due(1000), Some(due(500, 0, 3, "refused")));
        assert!(index.is_empty());
    }

    #[test]
    fn an_entry_inserted_again_at_its_time_names_the_new_place() {
        let mut index = LeaseIndex::new();
        index.insert(5, 0, 1, b"before");
        index.insert(5, 3, 1, b"after");
        assert_eq!(index.len(), 1);
        assert_eq!(index.pop_due(5), Some(due(5, 3, 1, "after")));
    }

    #[test]
    fn entries_come_due_in_deadline_order() {
        let mut index = LeaseIndex::new();
        index.insert(30, 0, 3, b"c");
        index.insert(10, 1, 1, b"a");
        index.insert(20, 0, 2, b"b");
        assert_eq!(index.first_due(), Some(10));
        assert_eq!(index.pop_due(9), None);
        assert_eq!(index.pop_due(20), Some(due(10, 1, 1, "a")));
        assert_eq!(index.pop_due(20), Some(due(20, 0, 2, "b")));
        assert_eq!(index.pop_due(20), None);
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn reindex_moves_an_entry() {
        let mut index = LeaseIndex::new();
        index.reindex(0, 7, b"k", None, 100);
        index.reindex(0, 7, b"k", Some(Entry::tree(100)), 200);
        assert_eq!(index.len(), 1);
        assert_eq!(index.pop_due(150), None);
        assert!(index.forget(7, Entry::tree(200)));
        assert!(index.is_empty());
    }

    #[test]
    fn entry_times_stay_within_what_a_mark_can_name() {
        assert_eq!(entry_time(0), 1);
        assert_eq!(entry_time(1_764_000_000_000), 1_764_000_000_000);
        assert_eq!(entry_time(LATEST), LATEST);
        assert_eq!(entry_time(LATEST + 1), LATEST);
        assert_eq!(entry_time(u64::MAX), LATEST);
    }

    #[test]
    fn databases_beyond_u16_keep_their_number() {
        let mut index = LeaseIndex::new();
        index.insert(5, 70_000, 1, b"k");
        assert_eq!(index.pop_due(5), Some(due(5, 70_000, 1, "k")));
    }

    #[test]
    fn swapdb_moves_entries_with_their_data_and_flushdb_drops_one_db() {
        let mut index = LeaseIndex::new();
        index.insert(1, 0, 1, b"zero");
        index.insert(2, 3, 2, b"three");
        index.insert(3, 5, 3, b"five");
        index.swap_dbs(0, 3);
        index.swap_dbs(3, 9);
        // "zero" went 0 -> 3 -> 9, "three" 3 -> 0.
        index.forget_db(Some(5));
        assert_eq!(index.pop_due(10), Some(due(1, 9, 1, "zero")));
        assert_eq!(index.pop_due(10), Some(due(2, 0, 2, "three")));
        assert_eq!(index.pop_due(10), None);
        index.insert(4, 3, 4, b"new in three");
        assert_eq!(index.pop_due(10), Some(due(4, 3, 4, "new in three")));
    }
}

/// review13: key names kept inline up to 22 bytes, on the heap beyond, come back intact.
#[cfg(test)]
mod review13_tests {
    use super::*;

    #[test]
    fn key_names_of_every_length_and_byte_come_due_intact() {
        let mut index = LeaseIndex::new();
        let mut names: Vec<Vec<u8>> = Vec::new();
        for len in [0_usize, 1, 21, 22, 23, 24, 254, 255, 256, 257, 1_000] {
            names.push((0..len).map(|i| (i * 37 % 256) as u8).collect());
        }
        names.push(vec![0; 22]);
        names.push(vec![0xff; 23]);
        names.push(b"a:b\0c\r\n".to_vec());
        for (id, name) in names.iter().enumerate() {
            index.insert(100 + id as u64, (id % 3) as i32, id as u64, name);
        }
        // Renamed (a new place) and moved: the entry takes the new name.
        let renamed = vec![b'r'; 23];
        let old = Entry {
            at: 103,
            queued: false,
        };
        index.reindex(1, 3, &renamed, Some(old), 103);
        names[3] = renamed;
        for (id, name) in names.iter().enumerate() {
            let due = index.pop_due(u64::MAX).expect("an entry due");
            assert_eq!(due.id, id as u64);
            assert_eq!(due.key.as_bytes(), &name[..], "id {id}");
            let db = if id == 3 { 1 } else { (id % 3) as i32 };
            assert_eq!(due.db, db, "id {id}");
        }
        assert!(index.is_empty());
    }

    #[test]
    fn swap_and_flush_of_one_db_follow_through_the_chunks() {
        let mut index = LeaseIndex::new();
        // Interleaved in time: db 0, 1, 2 in turn, over many chunks.
        for i in 0..3_000_u64 {
            let name = format!("key-of-exactly-22-b{:03}", i % 1000);
            index.insert(i, (i % 3) as i32, i, name.as_bytes());
        }
        index.swap_dbs(0, 2);
        index.forget_db(Some(1));
        assert_eq!(index.len(), 2_000);
        let mut last = 0;
        while let Some(due) = index.pop_due(u64::MAX) {
            assert!(due.at >= last);
            last = due.at;
            assert_ne!(due.id % 3, 1, "a flushed db's entry came due");
            // db 0's data is now in 2 and the other way round.
            let expected = if due.id % 3 == 0 { 2 } else { 0 };
            assert_eq!(due.db, expected);
            assert_eq!(due.key.as_bytes().len(), 22);
        }
        assert!(index.is_empty());
    }
}
