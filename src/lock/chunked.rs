//! An ordered map kept in chunks: runs of up to [`CAP`] entries in key order, each run one
//! allocation, the runs themselves in a B-tree by a lower bound of their keys.
//!
//! The lease index holds an entry per lock with a deadline, so what an entry costs is what a
//! held lock costs beside its value. A `BTreeMap` node has room for 11 entries and, filled in
//! key order (as deadlines mostly come), is left a little over half full by its splits: an
//! entry of 40 bytes took about 85. Here a chunk that is full when its last entry is passed
//! starts a new chunk instead of splitting, so entries that come in order fill their chunks,
//! and an entry takes its own size plus a share of its chunk's B-tree slot.
//!
//! What stays true after every change:
//! - a chunk is never empty, and its entries are in key order without repeats;
//! - a chunk's B-tree key is at most its first entry's key, and above the last entry of the
//!   chunk before it (a lower bound, so taking an entry from the front needs no new key);
//! - a chunk holds at most [`CAP`] entries.
//!
//! Every operation finds its chunk in the B-tree (O(log n)) and moves at most a chunk's entries
//! within it (O(CAP)). A chunk left a quarter full or less by a removal, or left a multiple of
//! [`JOIN_STEP`] entries, is joined with a neighbour when the two fit in three quarters of a
//! chunk, and `retain` joins what it leaves: a map thinned out, in whatever order, keeps about
//! a fifth of a chunk's entries per chunk or more.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;

/// Entries per chunk: 16 entries of the lease index (48 bytes each) are one 768-byte
/// allocation, a size the allocator has a class for. Larger chunks cost a removal more (a
/// search over more cache lines, more entries moved): taking random entries out of 500,000,
/// cache cold, took 1.2 µs each with 64, 0.87 with 16, 0.75 in a `BTreeMap`; 16 costs a held
/// lock 5 bytes more than 64 (the chunk's share of its B-tree slot).
pub const CAP: usize = 16;

/// A chunk at most this full after a removal is joined with a neighbour, when together they
/// fill no more than [`JOINED`].
const SPARSE: usize = CAP / 4;
const JOINED: usize = CAP * 3 / 4;
/// A chunk fuller than [`SPARSE`] also looks at its neighbours each time a removal leaves it a
/// multiple of this many entries: a chunk left sparse beside full ones is joined once they
/// have thinned out, at the cost of a look at the neighbours now and then.
const JOIN_STEP: usize = CAP / 2;

type Chunk<K, V> = VecDeque<(K, V)>;

pub struct ChunkedMap<K, V> {
    chunks: BTreeMap<K, Chunk<K, V>>,
    len: usize,
}

impl<K: Ord + Copy, V> Default for ChunkedMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord + Copy, V> ChunkedMap<K, V> {
    pub const fn new() -> Self {
        ChunkedMap {
            chunks: BTreeMap::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Puts `value` under `key`, returning the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        // The chunk `key` belongs in: the last one keyed at most `key` (one look in the B-tree).
        let Some((&at, chunk)) = self.chunks.range_mut(..=key).next_back() else {
            // Below every chunk's key: the first chunk takes it, keyed anew (its own entries
            // are all above `key`), or a first chunk is made.
            let chunk = match self.chunks.pop_first() {
                Some((_, chunk)) => chunk,
                None => VecDeque::with_capacity(CAP),
            };
            self.chunks.insert(key, chunk);
            return self.insert(key, value);
        };
        let place = chunk.partition_point(|(k, _)| *k < key);
        if let Some((_, there)) = chunk.get_mut(place).filter(|(k, _)| *k == key) {
            return Some(std::mem::replace(there, value));
        }
        self.len += 1;
        if chunk.len() < CAP {
            chunk.insert(place, (key, value));
            return None;
        }
        if place == chunk.len() {
            // Past a full chunk's last entry (every key of the next chunk is above `key`): the
            // next chunk takes it first, keyed anew, when it has room (keys that come in
            // descending order share a chunk); else a new chunk, so entries that come in order
            // leave full chunks behind them.
            let next = self
                .chunks
                .range((Bound::Excluded(at), Bound::Unbounded))
                .next()
                .filter(|(_, next)| next.len() < CAP)
                .map(|(next, _)| *next);
            let mut taker = match next.and_then(|next| self.chunks.remove(&next)) {
                Some(next) => next,
                None => VecDeque::with_capacity(CAP),
            };
            taker.push_front((key, value));
            self.chunks.insert(key, taker);
            return None;
        }
        let mut right: Chunk<K, V> = VecDeque::with_capacity(CAP);
        right.extend(chunk.drain(CAP / 2..));
        if place <= CAP / 2 {
            chunk.insert(place, (key, value));
        } else {
            right.insert(place - CAP / 2, (key, value));
        }
        if let Some((first, _)) = right.front() {
            self.chunks.insert(*first, right);
        }
        None
    }

    /// Takes the entry under `key` out.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let (&at, chunk) = self.chunks.range_mut(..=*key).next_back()?;
        let place = chunk.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        let (_, value) = chunk.remove(place)?;
        self.len -= 1;
        let left = chunk.len();
        if left == 0 {
            self.chunks.remove(&at);
        } else if left <= SPARSE || left % JOIN_STEP == 0 {
            self.join(at, left);
        }
        Some(value)
    }

    /// Joins the chunk keyed `at`, holding `len` entries, with the next chunk or else the one
    /// before, when the two fit in [`JOINED`] entries.
    fn join(&mut self, at: K, len: usize) {
        let next = self
            .chunks
            .range((Bound::Excluded(at), Bound::Unbounded))
            .next()
            .map(|(k, c)| (*k, c.len()));
        if let Some((next, _)) = next.filter(|(_, n)| len + n <= JOINED) {
            let (Some(moved), Some(chunk)) = (self.chunks.remove(&next), self.chunks.get_mut(&at))
            else {
                return;
            };
            chunk.extend(moved);
            return;
        }
        let before = self
            .chunks
            .range(..at)
            .next_back()
            .map(|(k, c)| (*k, c.len()));
        if let Some((before, _)) = before.filter(|(_, b)| len + b <= JOINED) {
            let Some(moved) = self.chunks.remove(&at) else {
                return;
            };
            if let Some(chunk) = self.chunks.get_mut(&before) {
                chunk.extend(moved);
            }
        }
    }

    /// The entry with the least key.
    pub fn first_key_value(&self) -> Option<(&K, &V)> {
        let (_, chunk) = self.chunks.first_key_value()?;
        chunk.front().map(|(k, v)| (k, v))
    }

    /// Takes the entry with the least key out.
    pub fn pop_first(&mut self) -> Option<(K, V)> {
        let mut first = self.chunks.first_entry()?;
        let entry = first.get_mut().pop_front();
        if first.get().is_empty() {
            first.remove();
        }
        if entry.is_some() {
            self.len -= 1;
        }
        entry
    }

    /// Keeps the entries `keep` says yes to, joining what is left of neighbouring chunks while
    /// they fit in [`JOINED`] entries.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        let mut kept: Option<(K, Chunk<K, V>)> = None;
        for (at, mut chunk) in std::mem::take(&mut self.chunks) {
            chunk.retain(|(k, v)| keep(k, v));
            if chunk.is_empty() {
                continue;
            }
            match &mut kept {
                // Keyed below every entry of both, and above every entry before.
                Some((_, last)) if last.len() + chunk.len() <= JOINED => last.extend(chunk),
                _ => {
                    if let Some((at, last)) = kept.replace((at, chunk)) {
                        self.chunks.insert(at, last);
                    }
                }
            }
        }
        if let Some((at, last)) = kept {
            self.chunks.insert(at, last);
        }
        self.len = self.chunks.values().map(VecDeque::len).sum();
    }

    pub fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
    }

    /// How many chunks hold the entries (for tests of how full they are).
    #[cfg(test)]
    fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Every entry in key order (for tests).
    #[cfg(test)]
    fn entries(&self) -> Vec<(K, &V)> {
        self.chunks
            .values()
            .flat_map(|chunk| chunk.iter().map(|(k, v)| (*k, v)))
            .collect()
    }

    /// Checks what stays true after every change (for tests).
    #[cfg(test)]
    fn check(&self) {
        let mut last: Option<K> = None;
        let mut count = 0;
        for (at, chunk) in &self.chunks {
            assert!(!chunk.is_empty(), "an empty chunk is kept");
            assert!(chunk.len() <= CAP, "a chunk over its capacity");
            if let Some(last) = last {
                assert!(
                    *at > last,
                    "a chunk keyed at or below the chunk before's last entry"
                );
            }
            let mut previous: Option<K> = None;
            for (k, _) in chunk {
                assert!(*at <= *k, "a chunk keyed above its first entry");
                if let Some(previous) = previous {
                    assert!(previous < *k, "entries out of order or repeated");
                }
                previous = Some(*k);
                count += 1;
            }
            last = previous;
        }
        assert_eq!(count, self.len, "len counts every entry");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::lock::model_tests::Rng;

    #[test]
    fn entries_that_come_in_order_fill_their_chunks() {
        let mut map = ChunkedMap::new();
        for i in 0..10 * CAP as u64 {
            assert_eq!(map.insert((100, i), i), None);
        }
        map.check();
        assert_eq!(map.chunk_count(), 10);
        assert_eq!(map.len(), 10 * CAP);
    }

    #[test]
    fn acts_as_an_ordered_map_under_any_mix_of_changes() {
        for seed in [1_u64, 7, 0x9e37_79b9, 12_345_678] {
            let mut rng = Rng(seed);
            let mut map = ChunkedMap::new();
            let mut model = BTreeMap::new();
            for step in 0..20_000_u64 {
                let key = rng.next() % 3_000;
                match rng.next() % 8 {
                    0..=3 => assert_eq!(map.insert(key, step), model.insert(key, step)),
                    4..=5 => assert_eq!(map.remove(&key), model.remove(&key)),
                    6 => assert_eq!(map.pop_first(), model.pop_first()),
                    _ => {
                        // Keys past every other: the append path.
                        let key = 3_000 + step;
                        assert_eq!(map.insert(key, step), model.insert(key, step));
                    }
                }
                assert_eq!(
                    map.first_key_value().map(|(k, v)| (*k, *v)),
                    model.first_key_value().map(|(k, v)| (*k, *v))
                );
                if step % 500 == 0 {
                    map.check();
                    let entries: Vec<(u64, u64)> =
                        map.entries().into_iter().map(|(k, v)| (k, *v)).collect();
                    let expected: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
                    assert_eq!(entries, expected, "seed {seed}, step {step}");
                }
            }
            map.retain(|k, _| k % 3 == 0);
            model.retain(|k, _| k % 3 == 0);
            map.check();
            assert_eq!(map.len(), model.len());
            while let Some(entry) = model.pop_first() {
                assert_eq!(map.pop_first(), Some(entry));
            }
            assert!(map.is_empty());
            assert_eq!(map.chunk_count(), 0);
        }
    }

    #[test]
    fn a_map_thinned_out_by_removals_joins_its_chunks() {
        let mut map = ChunkedMap::new();
        let n = 100 * CAP as u64;
        for i in 0..n {
            map.insert(i, ());
        }
        assert_eq!(map.chunk_count(), 100);
        // Nine in ten go, spread over every chunk.
        for i in (0..n).filter(|i| i % 10 != 0) {
            assert_eq!(map.remove(&i), Some(()));
        }
        map.check();
        assert_eq!(map.len(), (n / 10) as usize);
        // 640 entries left: without joining, 100 chunks of 6 or 7.
        assert!(
            map.chunk_count() <= 25,
            "{} chunks for {} entries",
            map.chunk_count(),
            map.len()
        );
    }

    #[test]
    fn a_key_below_every_chunk_goes_into_the_first() {
        let mut map = ChunkedMap::new();
        for i in 10..10 + 2 * CAP as u64 {
            map.insert(i, i);
        }
        for i in (0..10).rev() {
            map.insert(i, i);
            map.check();
        }
        assert_eq!(map.first_key_value(), Some((&0, &0)));
        assert_eq!(map.len(), 2 * CAP + 10);
        let entries: Vec<u64> = map.entries().into_iter().map(|(k, _)| k).collect();
        assert_eq!(entries, (0..10 + 2 * CAP as u64).collect::<Vec<_>>());
    }

    #[test]
    fn a_full_chunk_splits_when_a_key_falls_inside_it() {
        let mut map = ChunkedMap::new();
        for i in 0..CAP as u64 {
            map.insert(2 * i, ());
        }
        assert_eq!(map.chunk_count(), 1);
        map.insert(41, ());
        map.check();
        assert_eq!(map.chunk_count(), 2);
        assert_eq!(map.remove(&41), Some(()));
        assert_eq!(map.remove(&41), None);
        map.check();
    }
}

/// review13: probes of the chunked map's invariants, memory and cost.
#[cfg(test)]
mod review13_tests {
    use super::*;

    use crate::lock::model_tests::Rng;

    /// Entries per allocated chunk slot: what a map's entries cost against their own size.
    fn fill(map: &ChunkedMap<u64, ()>) -> f64 {
        map.len() as f64 / (map.chunk_count() * CAP) as f64
    }

    /// Every step checked (not every 500th), key spaces small (a few chunks, joins with the
    /// chunk before and after, inserts below every chunk) and large (many full chunks, splits),
    /// pop_first in bursts between inserts that split, and retain midway.
    #[test]
    fn stays_an_ordered_map_with_every_step_checked() {
        for (seed, space) in [
            (3_u64, 150_u64),
            (11, 700),
            (0xdead_beef, 5_000),
            (99, 40_000),
        ] {
            let mut rng = Rng(seed);
            let mut map = ChunkedMap::new();
            let mut model = std::collections::BTreeMap::new();
            for step in 0..30_000_u64 {
                match rng.next() % 16 {
                    0..=6 => {
                        let key = rng.next() % space;
                        assert_eq!(map.insert(key, step), model.insert(key, step));
                    }
                    7..=10 => {
                        let key = rng.next() % space;
                        assert_eq!(map.remove(&key), model.remove(&key));
                    }
                    11 => {
                        for _ in 0..rng.next() % 40 {
                            assert_eq!(map.pop_first(), model.pop_first());
                        }
                    }
                    12 => {
                        // Below every key there is: the first chunk takes it, or splits.
                        if let Some((&first, _)) = model.first_key_value() {
                            if first > 0 {
                                let key = first - 1 - rng.next() % first.min(3);
                                assert_eq!(map.insert(key, step), model.insert(key, step));
                            }
                        }
                    }
                    13 => {
                        // Removals from the front by key (forget of the earliest entries).
                        let keys: Vec<u64> = model.keys().take(5).copied().collect();
                        for key in keys {
                            assert_eq!(map.remove(&key), model.remove(&key));
                        }
                    }
                    14 if step % 97 == 0 => {
                        let m = 2 + rng.next() % 5;
                        map.retain(|k, _| k % m != 0);
                        model.retain(|k, _| k % m != 0);
                    }
                    _ => {
                        let key = space + step;
                        assert_eq!(map.insert(key, step), model.insert(key, step));
                    }
                }
                map.check();
                assert_eq!(map.len(), model.len(), "seed {seed} step {step}");
                assert_eq!(
                    map.first_key_value().map(|(k, v)| (*k, *v)),
                    model.first_key_value().map(|(k, v)| (*k, *v)),
                    "seed {seed} step {step}"
                );
                if step % 1000 == 0 {
                    let entries: Vec<(u64, u64)> =
                        map.entries().into_iter().map(|(k, v)| (k, *v)).collect();
                    let expected: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
                    assert_eq!(entries, expected, "seed {seed}, step {step}");
                }
            }
        }
    }

    /// Join with the chunk before (the next one has no room), then take entries out of the
    /// front of the joined chunk and put some below its old first key.
    #[test]
    fn a_join_with_the_chunk_before_keeps_keys_lower_bounds() {
        let mut map = ChunkedMap::new();
        for i in 0..3 * CAP as u64 {
            map.insert(10 * i, ());
        }
        assert_eq!(map.chunk_count(), 3);
        // The middle chunk thins to a quarter while the last stays full: it joins the first?
        // The first is full too: no join. Thin the first to 20, then the middle to 16.
        for i in 20..CAP as u64 {
            map.remove(&(10 * i));
        }
        for i in CAP as u64..(CAP as u64 + 48) {
            map.remove(&(10 * i));
        }
        map.check();
        // Keys between the first chunk's last and the middle chunk's first, and below all.
        for key in [195_u64, 201, 5, 1, 0] {
            map.insert(key + 1_000_000, ());
            map.insert(key, ());
            map.check();
        }
        let keys: Vec<u64> = map.entries().into_iter().map(|(k, _)| k).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(keys, sorted);
    }

    /// FLUSHDB of one database keeps the other's entries with `retain`, which never joins:
    /// a map left with one entry per chunk keeps a 64-entry allocation for each (3,072 bytes
    /// per lease-index entry of 48).
    #[test]
    fn retain_that_leaves_a_few_entries_per_chunk_joins_them() {
        let mut map = ChunkedMap::new();
        let n = 200 * CAP as u64;
        for i in 0..n {
            map.insert(i, ());
        }
        // One entry in 64 survives: another database's lock among this one's.
        map.retain(|k, _| k % CAP as u64 == 0);
        map.check();
        assert_eq!(map.len(), 200);
        assert!(
            map.chunk_count() <= map.len() / SPARSE + 1,
            "{} chunks of {CAP} slots for {} entries (fill {:.3})",
            map.chunk_count(),
            map.len(),
            fill(&map)
        );
    }

    /// The join rule looks at a chunk only when it itself thins out, and at its neighbours as
    /// they are then: a chunk brought to 1 entry beside full chunks stays a chunk when those
    /// thin out to 17 later. The doc says a map thinned out by removals does not keep a chunk
    /// for a few entries.
    #[test]
    fn removals_that_thin_neighbours_afterwards_still_leave_no_chunk_of_a_few_entries() {
        let mut map = ChunkedMap::new();
        let chunks = 100_u64;
        let cap = CAP as u64;
        for i in 0..chunks * cap {
            map.insert(i, ());
        }
        assert_eq!(map.chunk_count(), chunks as usize);
        // Odd chunks down to 1 entry while their neighbours are full: no join possible.
        for c in (1..chunks).step_by(2) {
            for i in 1..cap {
                assert_eq!(map.remove(&(c * cap + i)), Some(()));
            }
        }
        // Even chunks down to one above a quarter, so no join is tried on the way there.
        for c in (0..chunks).step_by(2) {
            for i in SPARSE as u64 + 1..cap {
                assert_eq!(map.remove(&(c * cap + i)), Some(()));
            }
        }
        map.check();
        assert_eq!(map.len(), 50 * (SPARSE + 2));
        assert!(
            map.chunk_count() <= map.len() / SPARSE + 1,
            "{} chunks of {CAP} slots for {} entries (fill {:.3})",
            map.chunk_count(),
            map.len(),
            fill(&map)
        );
    }

    /// Deadlines that come in order but with jitter (ttls of two sizes) still fill their
    /// chunks at least half: no chunk holds fewer than half of CAP once the map has settled.
    #[test]
    fn entries_with_a_little_jitter_fill_chunks_at_least_half() {
        let mut map = ChunkedMap::new();
        let mut rng = Rng(5);
        for i in 0..50_000_u64 {
            let key = (i * 10 + rng.next() % 30, i);
            map.insert(key, ());
        }
        map.check();
        let fill = map.len() as f64 / (map.chunk_count() * CAP) as f64;
        assert!(fill >= 0.5, "fill {fill:.3}");
    }

    /// Many entries at one deadline (ids ascending), then removal and insertion around one
    /// chunk boundary again and again: each step moves at most a chunk's entries.
    #[test]
    fn churn_at_a_chunk_boundary_stays_cheap() {
        let mut map = ChunkedMap::new();
        let n = 200_000_u64;
        for id in 0..n {
            map.insert((7_u64, id), ());
        }
        let started = std::time::Instant::now();
        // Around the boundary of two full chunks: insert makes a split, removal a join.
        for round in 0..200_000_u64 {
            let id = n / 2 + (round % 3);
            map.remove(&(7, id));
            map.insert((7, id), ());
        }
        map.check();
        assert_eq!(map.len(), n as usize);
        let elapsed = started.elapsed();
        assert!(
            elapsed < std::time::Duration::from_secs(10),
            "200,000 changes took {elapsed:?}"
        );
    }
}

/// review15: probes of 9de9ce0 (joins at multiples of JOIN_STEP, retain that joins).
#[cfg(test)]
mod review15_tests {
    use super::*;

    use crate::lock::model_tests::Rng;

    fn sizes(map: &ChunkedMap<u64, ()>) -> Vec<usize> {
        map.chunks.values().map(VecDeque::len).collect()
    }

    /// A map of `sizes.len()` chunks with exactly these sizes (keys spaced by 1,000 per chunk),
    /// built by filling each chunk in order and removing from its back.
    fn with_sizes(sizes: &[usize]) -> ChunkedMap<u64, ()> {
        let mut map = ChunkedMap::new();
        for (c, _) in sizes.iter().enumerate() {
            for i in 0..CAP as u64 {
                map.insert(c as u64 * 1_000 + i, ());
            }
        }
        assert_eq!(map.chunk_count(), sizes.len());
        // Only removals that keep every chunk above a quarter and off multiples of 8 would keep
        // chunks apart; set the sizes straight through the B-tree instead.
        for (c, &size) in sizes.iter().enumerate() {
            let chunk = map.chunks.get_mut(&(c as u64 * 1_000)).unwrap();
            chunk.truncate(size);
        }
        map.len = sizes.iter().sum();
        map.check();
        map
    }

    /// Removals in every order the join rule could be beaten by (halves, alternate chunks,
    /// three phases with different targets, random), each step checked: the doc promises a
    /// map thinned out in whatever order keeps about a fifth of a chunk per chunk or more.
    #[test]
    fn review15_adversarial_removal_orders_keep_a_fifth_of_a_chunk_per_chunk() {
        let cap = CAP as u64;
        let chunks = 60_u64;
        // (phase targets per chunk class): chunk c of class c % k is thinned to targets[phase][class].
        let schedules: Vec<(&str, u64, Vec<Vec<u64>>)> = vec![
            (
                "odd to 1, then even to 17",
                2,
                vec![vec![64, 1], vec![17, 1]],
            ),
            ("even to 17, odd to 25", 2, vec![vec![17, 64], vec![17, 25]]),
            (
                "even to 1 beside 48, then odd to 41",
                2,
                vec![vec![1, 48], vec![1, 41]],
            ),
            (
                "thirds",
                3,
                vec![vec![1, 64, 64], vec![1, 41, 64], vec![1, 41, 23]],
            ),
            (
                "thirds b",
                3,
                vec![vec![64, 64, 1], vec![41, 64, 1], vec![41, 25, 1]],
            ),
            (
                "quarters",
                4,
                vec![vec![1, 64, 1, 64], vec![1, 47, 1, 47], vec![1, 41, 1, 41]],
            ),
        ];
        for (name, k, phases) in schedules {
            for from_front in [false, true] {
                let mut map = ChunkedMap::new();
                for i in 0..chunks * cap {
                    map.insert(i, ());
                }
                let mut left: Vec<u64> = vec![cap; chunks as usize];
                for targets in &phases {
                    for c in 0..chunks {
                        let target = targets[(c % k) as usize];
                        while left[c as usize] > target {
                            let i = if from_front {
                                cap - left[c as usize]
                            } else {
                                left[c as usize] - 1
                            };
                            assert_eq!(map.remove(&(c * cap + i)), Some(()), "{name}");
                            left[c as usize] -= 1;
                        }
                    }
                    map.check();
                }
                let per_chunk = map.len() as f64 / map.chunk_count() as f64;
                assert!(
                    per_chunk >= CAP as f64 / 5.0,
                    "{name} (from front {from_front}): {} entries in {} chunks ({per_chunk:.1} per chunk), sizes {:?}",
                    map.len(),
                    map.chunk_count(),
                    &sizes(&map)[..12.min(map.chunk_count())]
                );
            }
        }
        // Random removal orders down to a tenth.
        for seed in [1_u64, 2, 3, 0xfeed] {
            let mut rng = Rng(seed);
            let mut map = ChunkedMap::new();
            let n = 100 * cap;
            for i in 0..n {
                map.insert(i, ());
            }
            let mut keys: Vec<u64> = (0..n).collect();
            for i in (1..keys.len()).rev() {
                keys.swap(i, (rng.next() % (i as u64 + 1)) as usize);
            }
            for key in &keys[..(n as usize * 9 / 10)] {
                assert_eq!(map.remove(key), Some(()));
            }
            map.check();
            let per_chunk = map.len() as f64 / map.chunk_count() as f64;
            assert!(per_chunk >= CAP as f64 / 5.0, "seed {seed}: {per_chunk:.1}");
        }
    }

    /// Entries whose keys come in descending order just past a full chunk (deadlines that come
    /// a little earlier each time, e.g. leases of a shrinking remaining budget) each start a
    /// chunk of their own: a 64-entry allocation per entry.
    #[test]
    fn review15_descending_keys_past_a_full_chunk_share_chunks() {
        let mut map = ChunkedMap::new();
        for i in 0..CAP as u64 {
            map.insert(i, ());
        }
        for key in (1_000..1_000 + 10 * CAP as u64).rev() {
            map.insert(key, ());
        }
        map.check();
        assert_eq!(map.len(), 11 * CAP);
        assert!(
            map.chunk_count() <= 2 * 11,
            "{} chunks for {} entries (fill {:.3})",
            map.chunk_count(),
            map.len(),
            map.len() as f64 / (map.chunk_count() * CAP) as f64
        );
    }

    /// A chunk oscillating at a join threshold (24/25, 32/33, 40/41, 48/49, 16/17) or at a
    /// split (64/65) with inserts and removals alternating: at most one join or split in all,
    /// not one per change.
    #[test]
    fn review15_alternating_changes_at_thresholds_do_not_join_and_split_each_time() {
        // Each size one above a threshold (a multiple of JOIN_STEP, SPARSE, JOINED, CAP)
        // beside a neighbour that just fits with it one below, or just does not.
        for (size, neighbour) in [
            (JOINED / 2 + 1, JOINED / 2),
            (JOINED / 2 + 1, JOINED / 2 - 1),
            (JOIN_STEP + 1, JOINED - JOIN_STEP),
            (JOIN_STEP + 1, JOINED - JOIN_STEP - 1),
            (JOINED + 1, 1),
            (SPARSE + 1, JOINED - SPARSE),
            (SPARSE + 1, JOINED - SPARSE - 1),
            (CAP, 1),
            (CAP, SPARSE),
        ] {
            for neighbour_after in [false, true] {
                let sizes_in = if neighbour_after {
                    vec![CAP, size, neighbour, CAP]
                } else {
                    vec![CAP, neighbour, size, CAP]
                };
                let at = if neighbour_after { 1 } else { 2 } as u64;
                let mut map = with_sizes(&sizes_in);
                let mut changes = 0;
                let mut count = map.chunk_count();
                for round in 0..10_000_u64 {
                    // Remove one of the chunk's middle entries, then put it back (or the other
                    // way round): the chunk's size moves by one.
                    let key = at * 1_000 + (size as u64 / 2) + round % 3;
                    if size == CAP {
                        let fresh = at * 1_000 + 500 + round % 7;
                        assert_eq!(map.insert(fresh, ()), None);
                        assert_eq!(map.remove(&fresh), Some(()));
                    } else {
                        assert_eq!(map.remove(&key), Some(()));
                        assert_eq!(map.insert(key, ()), None);
                    }
                    if map.chunk_count() != count {
                        changes += 1;
                        count = map.chunk_count();
                    }
                }
                map.check();
                assert!(
                    changes <= 2,
                    "size {size} beside {neighbour} (after {neighbour_after}): {changes} joins/splits in 10,000 rounds, sizes now {:?}",
                    sizes(&map)
                );
            }
        }
    }

    /// retain: entries in order, every invariant, nothing lost; what is left of neighbouring
    /// chunks is joined while it fits (no two neighbours that fit in JOINED together), and a
    /// retain that keeps all adds no chunk.
    #[test]
    fn review15_retain_keeps_order_and_joins_what_fits() {
        for seed in [5_u64, 6, 7, 8, 9] {
            let mut rng = Rng(seed);
            let mut map = ChunkedMap::new();
            let mut model = std::collections::BTreeMap::new();
            for step in 0..6_000_u64 {
                let key = rng.next() % 20_000;
                assert_eq!(map.insert(key, step), model.insert(key, step));
            }
            let before = map.chunk_count();
            map.retain(|_, _| true);
            map.check();
            assert!(map.chunk_count() <= before, "a retain that keeps all");
            let m = 2 + rng.next() % 9;
            map.retain(|k, _| k % m == 0);
            model.retain(|k, _| k % m == 0);
            map.check();
            let entries: Vec<(u64, u64)> =
                map.entries().into_iter().map(|(k, v)| (k, *v)).collect();
            let expected: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(entries, expected, "seed {seed}");
            let s: Vec<usize> = map.chunks.values().map(VecDeque::len).collect();
            for pair in s.windows(2) {
                assert!(
                    pair[0] + pair[1] > JOINED,
                    "seed {seed}: neighbours {pair:?} fit together"
                );
            }
            // And the map goes on working as a map after the retain.
            for step in 0..3_000_u64 {
                let key = rng.next() % 20_000;
                if rng.next() % 2 == 0 {
                    assert_eq!(map.insert(key, step), model.insert(key, step));
                } else {
                    assert_eq!(map.remove(&key), model.remove(&key));
                }
                map.check();
            }
            while let Some(entry) = model.pop_first() {
                assert_eq!(map.pop_first(), Some(entry));
            }
            assert_eq!(map.chunk_count(), 0);
        }
    }
}
