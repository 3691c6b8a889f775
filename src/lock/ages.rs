//! How old the holds are: every held lock by the grant time of its oldest hold, so the oldest
//! hold of the whole server is the first entry; and the long-hold log, the holds that lasted
//! longer than `lock.long-hold`, newest first, bounded like SLOWLOG: in entries, and in the bytes
//! it keeps of each text (see `lock::kept`).
//!
//! Locks are named by their value's id, with a tag of their key (see [`tag_of`]) for the one
//! place a key must be named without its name: INFO.

use std::collections::{BTreeSet, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

use crate::lock::core::split_who;
use crate::lock::kept;

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

/// Where a lock is in [`Ages`]: a slot, valid while the node there still names the lock's id.
pub type AgeSlot = u32;

/// Which namespace's list a held lock is in (see `service::policy::space_of`): 0 for `default`
/// (and for every lock while no namespace is defined).
pub type Space = u16;

/// The held locks by the grant time of their oldest hold, in one list per namespace, so the
/// oldest hold of the whole server, and of each namespace, is found at once.
///
/// A lock is a node in a slab, and each lock keeps its node's slot (see `Stored`), so a change
/// reaches its node without a search. Grants arrive in time order, almost always: a node goes
/// at the back of its list, kept in time order, found by a short walk back from the tail when
/// it is a little out of order. One further back (a lock loaded from a file, a clock stepped
/// back, a shared lock whose oldest member left) goes into a small ordered set aside instead.
/// A list's oldest hold is the earlier of its head and its set's first.
pub struct Ages {
    nodes: Vec<Node>,
    /// Free slots, chained through `next`.
    free: u32,
    /// By space; a space beyond the end has no node.
    lists: Vec<List>,
    len: usize,
    /// Where [`Ages::merge_aside`] stopped: a node and its lock's id, and its list.
    merging: Option<(AgeSlot, u64)>,
    merging_list: usize,
}

/// One namespace's held locks.
struct List {
    head: u32,
    tail: u32,
    aside: BTreeSet<(u64, AgeSlot)>,
    len: usize,
}

impl List {
    const fn new() -> Self {
        List {
            head: NONE,
            tail: NONE,
            aside: BTreeSet::new(),
            len: 0,
        }
    }
}

/// No slot.
const NONE: u32 = u32::MAX;

/// How far back from the tail a node looks for its place before it is set aside.
const WALK: usize = 16;

/// The latest grant time a node records exactly (ms since the epoch: the year 10889); the bits
/// above it hold the node's space.
const SINCE_BITS: u32 = 48;
const SINCE_MAX: u64 = (1 << SINCE_BITS) - 1;

/// The grant time of a held lock none of whose holds has a known one (stored by a release
/// before 0.2.0): it is counted in its space, never the oldest of anything.
pub const UNKNOWN: u64 = SINCE_MAX;

#[derive(Clone, Copy)]
struct Node {
    /// The lock's oldest grant time in the low 48 bits, its space in the top 16 (the slab stays
    /// at 32 bytes a held lock).
    since_space: u64,
    /// Its key's tag.
    tag: u64,
    /// The lock's id (0: a free slot): a slot kept by a value after [`Ages::clear`] names
    /// another lock, and changes nothing.
    id: u64,
    /// In the list: its neighbours (`NONE` at the ends); set aside: `prev` is `ASIDE`. A free
    /// slot: `next` chains the free list.
    prev: u32,
    next: u32,
}

impl Node {
    fn since(&self) -> u64 {
        self.since_space & SINCE_MAX
    }

    fn space(&self) -> Space {
        Space::try_from(self.since_space >> SINCE_BITS).unwrap_or(0)
    }

    fn set_since(&mut self, since: u64) {
        self.since_space = (self.since_space & !SINCE_MAX) | since.min(SINCE_MAX);
    }

    fn set_space(&mut self, space: Space) {
        self.since_space = (self.since_space & SINCE_MAX) | (u64::from(space) << SINCE_BITS);
    }
}

/// `prev` of a node set aside.
const ASIDE: u32 = u32::MAX - 1;

impl Default for Ages {
    fn default() -> Self {
        Ages::new()
    }
}

impl Ages {
    pub const fn new() -> Self {
        Ages {
            nodes: Vec::new(),
            free: NONE,
            lists: Vec::new(),
            len: 0,
            merging: None,
            merging_list: 0,
        }
    }

    /// Lock `id`, at `slot` (if it has one), now has `since` as its oldest grant time (`None`:
    /// no hold whose grant time is known). Returns its slot from now on. `place` (its key's tag
    /// and space) is asked only for a lock not tracked yet.
    pub fn set(
        &mut self,
        id: u64,
        slot: Option<AgeSlot>,
        since: Option<u64>,
        place: impl FnOnce() -> (u64, Space),
    ) -> Option<AgeSlot> {
        let slot = slot.filter(|slot| self.owns(*slot, id));
        match (slot, since) {
            (Some(slot), Some(since)) => {
                if self.nodes[slot as usize].since() != since.min(SINCE_MAX) {
                    self.unlink(slot);
                    self.nodes[slot as usize].set_since(since);
                    self.link(slot);
                }
                Some(slot)
            }
            (None, Some(since)) => {
                let (tag, space) = place();
                let mut node = Node {
                    since_space: 0,
                    tag,
                    id,
                    prev: NONE,
                    next: NONE,
                };
                node.set_since(since);
                node.set_space(space);
                let slot = self.allocate(node)?;
                self.link(slot);
                self.len += 1;
                Some(slot)
            }
            (Some(slot), None) => {
                self.release(slot);
                None
            }
            (None, None) => None,
        }
    }

    /// The oldest grant time recorded for lock `id` at `slot` (None when [`UNKNOWN`]).
    pub fn since_of(&self, id: u64, slot: Option<AgeSlot>) -> Option<u64> {
        slot.filter(|slot| self.owns(*slot, id))
            .and_then(|slot| self.node(slot))
            .map(Node::since)
            .filter(|since| *since != UNKNOWN)
    }

    /// Lock `id`, at `slot`, now lives under a key with tag `tag`, in space `space` (RENAME,
    /// MOVE).
    pub fn retag(&mut self, id: u64, slot: Option<AgeSlot>, tag: u64, space: Space) {
        if let Some(slot) = slot.filter(|slot| self.owns(*slot, id)) {
            self.nodes[slot as usize].tag = tag;
        }
        self.respace(id, slot, space);
    }

    /// Lock `id`, at `slot`, is now in space `space` (the policy changed).
    pub fn respace(&mut self, id: u64, slot: Option<AgeSlot>, space: Space) {
        if let Some(slot) = slot.filter(|slot| self.owns(*slot, id)) {
            if self.nodes[slot as usize].space() != space {
                self.unlink(slot);
                self.nodes[slot as usize].set_space(space);
                self.link(slot);
            }
        }
    }

    /// Lock `id` is gone; `slot` was its slot.
    pub fn forget(&mut self, id: u64, slot: Option<AgeSlot>) {
        if let Some(slot) = slot.filter(|slot| self.owns(*slot, id)) {
            self.release(slot);
        }
    }

    /// The oldest hold's grant time and its key's tag.
    pub fn oldest(&self) -> Option<(u64, u64)> {
        (0..self.lists.len())
            .filter_map(|space| self.oldest_in(space as Space))
            .min_by_key(|(since, _)| *since)
    }

    /// The oldest hold in `space`: its grant time and its key's tag.
    pub fn oldest_in(&self, space: Space) -> Option<(u64, u64)> {
        let list = self.lists.get(usize::from(space))?;
        let listed = self.node(list.head).map(|n| (n.since(), n.tag));
        let aside = list
            .aside
            .first()
            .and_then(|(_, slot)| self.node(*slot))
            .map(|n| (n.since(), n.tag));
        let oldest = match (listed, aside) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        };
        // Unknown times sort last: an unknown oldest means no known one.
        oldest.filter(|(since, _)| *since != UNKNOWN)
    }

    /// Puts the locks set aside back into their lists, in time order, taking at most about
    /// `budget` steps (a node put back, or one passed on the way to its place); true once
    /// nothing is set aside. After many locks moved between spaces in no order of time (see
    /// `service::deferred`): called again and again, it ends with every list in order in about
    /// one pass over each, and each aside entry's memory given back.
    pub fn merge_aside(&mut self, mut budget: usize) -> bool {
        while budget > 0 {
            // The list it was at, else the next with anything aside: a list is looked for once
            // per list emptied, not once per lock.
            let from = self.merging_list.min(self.lists.len());
            let Some(list) = (from..self.lists.len())
                .chain(0..from)
                .find(|l| !self.lists[*l].aside.is_empty())
            else {
                self.merging = None;
                return true;
            };
            self.merging_list = list;
            let Some(&(since, slot)) = self.lists[list].aside.first() else {
                continue;
            };
            // Where the last call stopped, when that node is still in this list no later than
            // the next one to put back; else from the head.
            let mut after = match self.merging {
                Some((at, id))
                    if self.owns(at, id)
                        && self.nodes[at as usize].prev != ASIDE
                        && usize::from(self.nodes[at as usize].space()) == list
                        && self.nodes[at as usize].since() <= since =>
                {
                    at
                }
                _ => NONE,
            };
            loop {
                let next = match self.node(after) {
                    Some(node) => node.next,
                    None => self.lists[list].head,
                };
                match self.node(next) {
                    Some(node) if node.since() <= since => after = next,
                    _ => break,
                }
                budget -= 1;
                if budget == 0 {
                    self.merging = self.node(after).map(|node| (after, node.id));
                    return false;
                }
            }
            self.lists[list].aside.remove(&(since, slot));
            let next = match self.node(after) {
                Some(node) => node.next,
                None => self.lists[list].head,
            };
            self.join(list, after, slot);
            self.join(list, slot, next);
            self.merging = Some((slot, self.nodes[slot as usize].id));
            budget -= 1;
        }
        false
    }

    /// How many locks are set aside (out of time order) in all.
    #[cfg(test)]
    pub fn aside(&self) -> usize {
        self.lists.iter().map(|list| list.aside.len()).sum()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The held locks in `space`.
    pub fn len_in(&self, space: Space) -> usize {
        self.lists
            .get(usize::from(space))
            .map_or(0, |list| list.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every lock (their values' slots then name nothing, or a later lock: see
    /// [`Node::id`]).
    pub fn clear(&mut self) {
        *self = Ages::new();
    }

    fn node(&self, slot: u32) -> Option<&Node> {
        self.nodes.get(slot as usize)
    }

    fn owns(&self, slot: AgeSlot, id: u64) -> bool {
        self.node(slot).is_some_and(|n| n.id == id && id != 0)
    }

    /// A slot for `node`: a free one, or a new one (`None` only when 2^32 - 2 are in use).
    fn allocate(&mut self, node: Node) -> Option<AgeSlot> {
        if self.free != NONE {
            let slot = self.free;
            self.free = self.nodes[slot as usize].next;
            self.nodes[slot as usize] = node;
            return Some(slot);
        }
        let slot = u32::try_from(self.nodes.len())
            .ok()
            .filter(|s| *s < ASIDE)?;
        self.nodes.push(node);
        Some(slot)
    }

    fn release(&mut self, slot: AgeSlot) {
        self.unlink(slot);
        let node = &mut self.nodes[slot as usize];
        node.id = 0;
        node.next = self.free;
        self.free = slot;
        self.len -= 1;
    }

    /// The index of the list of the node at `slot` (made when it is the first of its space).
    fn list_of(&mut self, slot: AgeSlot) -> usize {
        let space = usize::from(self.nodes[slot as usize].space());
        if self.lists.len() <= space {
            self.lists.resize_with(space + 1, List::new);
        }
        space
    }

    /// Puts the node at `slot` (not linked) in its place by its time, in its space's list.
    fn link(&mut self, slot: AgeSlot) {
        let list = self.list_of(slot);
        let since = self.nodes[slot as usize].since();
        self.lists[list].len += 1;
        // The last node no later than it, a few steps back from the tail at most.
        let mut after = self.lists[list].tail;
        let mut steps = 0;
        while let Some(prev) = self
            .node(after)
            .filter(|n| n.since() > since)
            .map(|n| n.prev)
        {
            steps += 1;
            if steps > WALK {
                self.nodes[slot as usize].prev = ASIDE;
                self.lists[list].aside.insert((since, slot));
                return;
            }
            after = prev;
        }
        let next = match self.node(after) {
            Some(node) => node.next,
            None => self.lists[list].head,
        };
        self.join(list, after, slot);
        self.join(list, slot, next);
    }

    /// Takes the node at `slot` out of its list or the set aside.
    fn unlink(&mut self, slot: AgeSlot) {
        let list = self.list_of(slot);
        let node = self.nodes[slot as usize];
        self.lists[list].len -= 1;
        if node.prev == ASIDE {
            self.lists[list].aside.remove(&(node.since(), slot));
            return;
        }
        self.join(list, node.prev, node.next);
    }

    /// Makes `next` follow `prev` in the list `list`; `NONE` on either side is the list's end
    /// (the other becomes its head or tail).
    fn join(&mut self, list: usize, prev: u32, next: u32) {
        match self.nodes.get_mut(prev as usize) {
            Some(before) => before.next = next,
            None => self.lists[list].head = next,
        }
        match self.nodes.get_mut(next as usize) {
            Some(later) => later.prev = prev,
            None => self.lists[list].tail = prev,
        }
    }
}

/// How a logged long hold ended; `None` while it lasts.
pub type Ending = Option<&'static str>;

/// `text` as the long-hold log keeps it, cut (see `lock::kept`): key and client names are the
/// clients' to choose, of any length, and an entry outlives its key and its client. Cut, every
/// entry is small, and the log's memory is bounded by its length.
fn logged(text: &[u8]) -> Box<[u8]> {
    kept(text).into()
}

/// One hold that lasted longer than `lock.long-hold`. Its texts are cut (see [`logged`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LongHold {
    /// Unique, increasing.
    pub id: u64,
    /// When it crossed the threshold, ms since the epoch.
    pub at: u64,
    pub db: i32,
    pub key: Box<[u8]>,
    /// The tag of the whole key name.
    pub tag: u64,
    pub fence: u64,
    /// When it was granted, ms since the epoch.
    pub since: u64,
    pub client: u64,
    /// The address and name of the client it was granted to, and its label (see
    /// `core::Grant::who`).
    pub addr: Box<[u8]>,
    pub name: Box<[u8]>,
    pub label: Box<[u8]>,
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
        let [addr, name, label] = split_who(crossing.who);
        let entry = LongHold {
            id: self.next_id,
            at: crossing.at,
            db: crossing.db,
            key: logged(crossing.key),
            tag: tag_of(crossing.key),
            fence: crossing.fence,
            since: crossing.since,
            client: crossing.client,
            addr: logged(addr),
            name: logged(name),
            label: logged(label),
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
        let one = ages.set(1, None, Some(500), || (11, 0));
        let two = ages.set(2, None, Some(300), || (22, 0));
        assert_eq!(ages.set(3, None, None, || (33, 0)), None);
        assert_eq!(ages.oldest(), Some((300, 22)));
        assert_eq!(ages.len(), 2);
        // The tag is kept; the time moves; the slot stays.
        assert_eq!(ages.set(2, two, Some(700), || (99, 0)), two);
        assert_eq!(ages.oldest(), Some((500, 11)));
        ages.retag(1, one, 44, 0);
        assert_eq!(ages.oldest(), Some((500, 44)));
        assert_eq!(ages.set(1, one, None, || (0, 0)), None);
        assert_eq!(ages.oldest(), Some((700, 22)));
        ages.forget(2, two);
        assert!(ages.is_empty());
        assert_eq!(ages.oldest(), None);
    }

    #[test]
    fn grants_out_of_order_keep_the_oldest_first() {
        let mut ages = Ages::new();
        // In order, a little out of order (found by the walk back), far out of order (aside).
        let mut slots = Vec::new();
        for (id, since) in (1..=40).map(|i| (i, 1000 + i * 10)) {
            slots.push((id, ages.set(id, None, Some(since), || (id, 0))));
        }
        let near = ages.set(41, None, Some(1395), || (41, 0));
        let far = ages.set(42, None, Some(1001), || (42, 0));
        assert_eq!(ages.lists[0].aside.len(), 1);
        assert_eq!(ages.len(), 42);
        assert_eq!(ages.oldest(), Some((1001, 42)));
        ages.forget(42, far);
        assert_eq!(ages.oldest(), Some((1010, 1)));
        // Taken in any order, the oldest left is always first.
        for (id, slot) in slots.iter().step_by(2) {
            ages.forget(*id, *slot);
        }
        assert_eq!(ages.oldest(), Some((1020, 2)));
        assert_eq!(ages.set(41, near, Some(1005), || (0, 0)), near);
        assert_eq!(ages.oldest(), Some((1005, 41)));
        let order: Vec<u64> = std::iter::successors(ages.node(ages.lists[0].head).copied(), |n| {
            ages.node(n.next).copied()
        })
        .map(|n| n.since())
        .collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted);
        assert_eq!(order.len() + ages.lists[0].aside.len(), ages.len());
    }

    #[test]
    fn a_slot_names_its_lock_only_while_it_has_it() {
        let mut ages = Ages::new();
        let old = ages.set(1, None, Some(100), || (1, 0));
        ages.forget(1, old);
        // The slot is reused by lock 2; lock 1's stale slot changes nothing.
        let new = ages.set(2, None, Some(200), || (2, 0));
        assert_eq!(new, old);
        ages.forget(1, old);
        assert_eq!(ages.set(1, old, None, || (0, 0)), None);
        ages.retag(1, old, 9, 0);
        assert_eq!(ages.oldest(), Some((200, 2)));
        // After a clear, the values' old slots name nothing.
        ages.clear();
        assert_eq!(ages.set(2, new, Some(300), || (3, 0)), Some(0));
        assert_eq!(ages.len(), 1);
        assert_eq!(ages.oldest(), Some((300, 3)));
    }

    #[test]
    fn each_space_keeps_its_own_oldest_and_count() {
        let mut ages = Ages::new();
        let a = ages.set(1, None, Some(500), || (11, 2));
        let b = ages.set(2, None, Some(300), || (22, 0));
        let c = ages.set(3, None, Some(400), || (33, 2));
        assert_eq!((ages.len_in(0), ages.len_in(1), ages.len_in(2)), (1, 0, 2));
        assert_eq!(ages.len_in(7), 0);
        assert_eq!(ages.oldest_in(2), Some((400, 33)));
        assert_eq!(ages.oldest_in(1), None);
        assert_eq!(ages.oldest(), Some((300, 22)));
        // Renamed into another space: it leaves one list for the other, its time kept.
        ages.retag(3, c, 44, 0);
        assert_eq!((ages.len_in(0), ages.len_in(2)), (2, 1));
        assert_eq!(ages.oldest_in(2), Some((500, 11)));
        assert_eq!(ages.oldest_in(0), Some((300, 22)));
        // A grant time moves within the list; the space stays.
        assert_eq!(ages.set(2, b, Some(900), || (0, 5)), b);
        assert_eq!(ages.oldest_in(0), Some((400, 44)));
        assert_eq!(ages.len_in(5), 0);
        ages.forget(1, a);
        ages.forget(2, b);
        ages.forget(3, c);
        assert!(ages.is_empty());
        assert_eq!((ages.len_in(0), ages.len_in(2)), (0, 0));
        assert_eq!(ages.oldest(), None);
        // A grant time past what a node records (the year 10889) counts as unknown.
        let far = ages.set(4, None, Some(u64::MAX), || (44, 3));
        assert_eq!(ages.len_in(3), 1);
        assert_eq!(ages.oldest_in(3), None);
        assert_eq!(ages.since_of(4, far), None);
    }

    #[test]
    fn locks_moved_between_spaces_in_no_order_are_put_back_in_time_order() {
        let mut ages = Ages::new();
        let slots: Vec<_> = (1..=200u64)
            .map(|id| (id, ages.set(id, None, Some(1000 + id), || (id, 0))))
            .collect();
        // Moved in an order that is not time order: most go aside.
        for (id, slot) in slots.iter().rev() {
            ages.respace(*id, *slot, if id % 2 == 0 { 1 } else { 2 });
        }
        assert!(ages.aside() > 100, "{}", ages.aside());
        // In small steps, with a lock released and one granted between two of them.
        let mut calls = 0;
        while !ages.merge_aside(7) {
            calls += 1;
            if calls == 5 {
                ages.forget(2, slots[1].1);
                ages.set(201, None, Some(999), || (201, 1));
            }
            assert!(calls < 1_000);
        }
        assert_eq!(ages.aside(), 0);
        assert_eq!(
            (ages.len_in(0), ages.len_in(1), ages.len_in(2)),
            (0, 100, 100)
        );
        assert_eq!(ages.oldest_in(1), Some((999, 201)));
        assert_eq!(ages.oldest_in(2), Some((1001, 1)));
        for space in [1, 2] {
            let list = &ages.lists[space];
            let order: Vec<u64> = std::iter::successors(ages.node(list.head).copied(), |n| {
                ages.node(n.next).copied()
            })
            .map(|n| n.since())
            .collect();
            assert_eq!(order.len(), 100);
            assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
        }
        // Still reached from their values' slots.
        for (id, slot) in slots.iter().filter(|(id, _)| *id != 2) {
            assert_eq!(ages.since_of(*id, *slot), Some(1000 + id));
        }
    }

    #[test]
    fn a_lock_of_unknown_grant_time_counts_but_is_never_the_oldest() {
        let mut ages = Ages::new();
        let unknown = ages.set(1, None, Some(UNKNOWN), || (11, 3));
        assert_eq!(ages.len_in(3), 1);
        assert_eq!(ages.oldest_in(3), None);
        assert_eq!(ages.oldest(), None);
        assert_eq!(ages.since_of(1, unknown), None);
        ages.set(2, None, Some(500), || (22, 3));
        assert_eq!(ages.oldest_in(3), Some((500, 22)));
        assert_eq!(ages.len_in(3), 2);
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
    fn the_log_keeps_at_most_128_bytes_of_each_text_and_says_how_many_it_cut() {
        let mut log = LongLog::new();
        let key = [b'k'; 1 << 20];
        let name = [b'n'; 129];
        let label = [b'l'; 128];
        let who = [&b"10.0.0.1:5000 "[..], &name, b" ", &label].concat();
        log.record(
            Crossing {
                key: &key,
                who: &who,
                ..crossing(1, 10)
            },
            1,
        );
        let entry = log.newest(1).next().cloned().expect("an entry");
        let cut = |byte: u8, more: usize| {
            let mut text = vec![byte; 128];
            text.extend_from_slice(format!("... ({more} more bytes)").as_bytes());
            text.into_boxed_slice()
        };
        assert_eq!(entry.key, cut(b'k', (1 << 20) - 128));
        // The tag is the whole name's.
        assert_eq!(entry.tag, tag_of(&key));
        assert_eq!(entry.name, cut(b'n', 1));
        assert_eq!(&*entry.addr, b"10.0.0.1:5000");
        assert_eq!(&*entry.label, &label[..]);
        // Up to the limit, nothing is cut.
        assert_eq!(&*logged(&key[..128]), &key[..128]);
        assert_eq!(&*logged(b""), b"");
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
