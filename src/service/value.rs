//! The value behind a lock key (`TYPE key` answers `lockstate`): the lock, plus what the process
//! keeps beside it (an id for the lease index, when the hold began). Its constructor, updates and
//! Drop keep the `lock_keys` and `lock_held` gauges and the fence floor in step, whatever created
//! or removed the value (a grant, RDB, RESTORE, COPY, DEL, FLUSHALL).

use std::cell::Cell;
use std::ffi::CStr;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use redis_module::key::{RedisKey, RedisKeyWritable};
use redis_module::native_types::RedisType;
use redis_module::KeyType;

use crate::config;
use crate::error::LockError;
use crate::host;
use crate::host::server::now_ms;
use crate::host::value::{Digest, Rdb, ValueType};
use crate::lock::ages::AgeSlot;
use crate::lock::codec::{self, Sink, Source};
use crate::lock::core::{Grant, Lock};
use crate::lock::event::Event;
use crate::lock::floor;
use crate::lock::lease_index::{self, Entry};
use crate::metrics;

/// The internal command that restates a lock in the AOF and to replicas.
pub const APPLY: &CStr = c"LOCK.APPLY";

/// The next lock id.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What a freed value has beside it: its entries in the lease index and the ages of holds, and
/// whether the long-hold log and the session table have entries of it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Entries {
    /// Its entry in the lease index.
    pub index: Option<Entry>,
    /// Its slot in the ages.
    pub age: Option<AgeSlot>,
    /// It had long holds.
    pub long: bool,
    /// It had session holders.
    pub sessions: bool,
}

/// What takes a value's entries out of what the module keeps beside it when the value is
/// freed: its id, its entries. Installed at load (those are layers above); it may be called
/// from a lazy-free thread.
pub type ForgetEntries = fn(u64, Entries);

static FORGET_ENTRIES: OnceLock<ForgetEntries> = OnceLock::new();

/// Installs what a freed value calls to leave the lease index (once, at load).
pub fn set_forget_entries(forget: ForgetEntries) {
    let _ = FORGET_ENTRIES.set(forget);
}

/// The value behind a lock key.
#[derive(Debug)]
pub struct Stored {
    lock: Lock,
    /// Unique per value in this process: the lease index's handle on it (never persisted).
    id: u64,
    /// A held lock: when its hold began (monotonic µs), for the hold-time histogram; unknown for
    /// a holder that arrived by loading, RESTORE or COPY. A free lock: when it may be reclaimed
    /// (deleted), `lock.tombstone-ttl` after it became free or arrived free (ms since the
    /// epoch). A lock is one or the other, so one field serves both (see [`Stored::reclaim_at`]) and
    /// the value stays within 80 bytes.
    since_or_reclaim: Option<Moment>,
    /// Where this lock is in the lease index (see [`Stored::index_plan`]), and whether the
    /// waiters of a free lock in a lock-delay are to be served when it ends. A `Cell`: the index
    /// is kept from shared borrows too.
    index_mark: Cell<IndexMark>,
    /// Its slot in the ages of holds plus 1 (0: none; see `Ages`), kept by `holds`.
    age: Cell<u32>,
}

/// A lock's one entry in the lease index: its time in the low 62 bits (0: none; see
/// `lease_index::entry_time`), and in the top bit whether it is a queued reclaim rather than a
/// B-tree entry. Entries may come due early (a look at the lock, which then gets a new one),
/// never late. The next bit: a free lock's lock-delay, until `Lock::delayed_until`, is to wake
/// its waiters when it ends (in memory only, derived from the lock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct IndexMark(u64);

impl IndexMark {
    const QUEUED: u64 = 1 << 63;
    const WAKE: u64 = 1 << 62;
    const AT: u64 = !(Self::QUEUED | Self::WAKE);

    fn entry(self) -> Option<Entry> {
        let at = self.0 & Self::AT;
        (at != 0).then_some(Entry {
            at,
            queued: self.0 & Self::QUEUED != 0,
        })
    }

    fn wake(self) -> bool {
        self.0 & Self::WAKE != 0
    }

    /// It names `entry` (the wake-up stays). Entry times never exceed `lease_index::LATEST`,
    /// which is `AT`: the mark names exactly the time the index has.
    fn with_entry(self, entry: Option<Entry>) -> Self {
        let bits = entry.map_or(0, |entry| {
            (entry.at & Self::AT) | if entry.queued { Self::QUEUED } else { 0 }
        });
        IndexMark((self.0 & Self::WAKE) | bits)
    }

    fn with_wake(self, wake: bool) -> Self {
        IndexMark(if wake {
            self.0 | Self::WAKE
        } else {
            self.0 & !Self::WAKE
        })
    }
}

// Every time the index can have fits in a mark.
const _: () = assert!(IndexMark::AT == lease_index::LATEST);

/// What the lease index must do so that a lock comes due in time (see [`Stored::index_plan`]).
/// Either new entry replaces the lock's entry `old` (then [`Stored::set_indexed`]).
#[derive(Debug, PartialEq, Eq)]
pub enum IndexPlan {
    /// An entry already comes due no later than the lock.
    Keep,
    /// Queue a reclaim at `at`, or if the queue refuses it, add a B-tree entry there.
    Queue { old: Option<Entry>, at: u64 },
    /// Add a B-tree entry at `new`.
    Move { old: Option<Entry>, new: u64 },
}

/// A point in time (ms since the epoch, or monotonic µs), never 0: an `Option` of it takes 8
/// bytes, not 16, which keeps the value within a smaller allocation size.
type Moment = NonZeroU64;

/// `time` as a [`Moment`] (0, which no clock here reads, becomes 1).
fn moment(time: u64) -> Moment {
    NonZeroU64::new(time).unwrap_or(NonZeroU64::MIN)
}

/// When a lock that is free from `now` on may be reclaimed.
fn reclaim_time(now: u64) -> u64 {
    let ttl = u64::try_from(config::TOMBSTONE_TTL.get()).unwrap_or(0);
    now.saturating_add(ttl)
}

impl Stored {
    pub fn new(lock: Lock) -> Self {
        let now = now_ms();
        floor::raise(lock.fence, now);
        metrics::KEYS.add(1);
        if lock.has_holders() {
            metrics::HELD.add(1);
        }
        let reclaim_at = (!lock.has_holders()).then(|| moment(reclaim_time(now)));
        let mut stored = Stored {
            lock,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            since_or_reclaim: reclaim_at,
            index_mark: Cell::new(IndexMark::default()),
            age: Cell::new(0),
        };
        stored.follow_delay(now);
        stored
    }

    /// Keeps the wake-up and the reclaim time in step with the lock's lock-delay: its waiters
    /// are looked at when it ends, and the lock (with the delay) is not deleted before.
    fn follow_delay(&mut self, now: u64) {
        let until = self.lock.delayed_until;
        let wake = !self.lock.has_holders() && until > now;
        if wake {
            self.since_or_reclaim = self.since_or_reclaim.map(|at| at.max(moment(until)));
        }
        self.index_mark.set(self.index_mark.get().with_wake(wake));
    }

    /// For a free lock in a lock-delay: when the delay ends and its waiters are to be served.
    fn wake_at(&self) -> Option<u64> {
        self.index_mark
            .get()
            .wake()
            .then_some(self.lock.delayed_until)
    }

    /// True (once) when the lock-delay of this free lock has ended by `now`: its waiters may be
    /// served.
    pub fn take_wake(&mut self, now: u64) -> bool {
        if self.wake_at().is_some_and(|at| at <= now) {
            self.index_mark.set(self.index_mark.get().with_wake(false));
            return true;
        }
        false
    }

    /// A value created by a grant, whose hold starts now.
    pub fn granted(lock: Lock) -> Self {
        let mut stored = Stored::new(lock);
        if stored.lock.has_holders() {
            stored.since_or_reclaim = Some(moment(metrics::monotonic_us()));
        }
        stored
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its slot in the ages of holds, if it has one.
    pub fn age_slot(&self) -> Option<AgeSlot> {
        self.age.get().checked_sub(1)
    }

    /// Its slot in the ages of holds is now `slot`.
    pub fn set_age_slot(&self, slot: Option<AgeSlot>) {
        self.age.set(slot.map_or(0, |slot| slot.saturating_add(1)));
    }

    /// A free lock: when it may be reclaimed.
    fn reclaim_at(&self) -> Option<Moment> {
        self.since_or_reclaim.filter(|_| !self.lock.has_holders())
    }

    /// What the lease index must do so that this lock comes due no later than [`Stored::due`].
    /// A later due time (a renewal, a grant of a free lock, a reclaim postponed) needs nothing:
    /// the entry comes due early and the lock gets a new one then. A free lock due only for
    /// reclaim is queued (a release: no search in the B-tree). Anything else earlier gets a
    /// B-tree entry. Either replaces the entry the lock had, so that it has one at most.
    pub fn index_plan(&self, long_hold: u64) -> IndexPlan {
        let Some(due) = self.index_time(long_hold) else {
            return IndexPlan::Keep;
        };
        let old = self.indexed();
        if old.is_some_and(|old| old.at <= due) {
            return IndexPlan::Keep;
        }
        if !self.lock.has_holders() && self.wake_at().is_none() {
            return IndexPlan::Queue { old, at: due };
        }
        IndexPlan::Move { old, new: due }
    }

    /// When the lease index must look at this lock next: its due time, as the index can hold
    /// it (see `lease_index::entry_time`).
    fn index_time(&self, long_hold: u64) -> Option<u64> {
        self.due(long_hold).map(lease_index::entry_time)
    }

    /// Forgets this lock's entry and marks a B-tree entry at its due time, which the caller
    /// adds (rebuilding the index after loading); that time, or `None` when nothing is due.
    pub fn index_afresh(&self, long_hold: u64) -> Option<u64> {
        let at = self.index_time(long_hold);
        self.set_indexed(at.map(Entry::tree));
        at
    }

    /// This lock's entry in the lease index, if it has one.
    pub fn indexed(&self) -> Option<Entry> {
        self.index_mark.get().entry()
    }

    /// The lease index now has `entry` for this lock, and no other (`None`: none).
    pub fn set_indexed(&self, entry: Option<Entry>) {
        self.index_mark.set(self.index_mark.get().with_entry(entry));
    }

    /// The entry `due` of this lock came due: the lock has none from now on, and is indexed
    /// afresh. Returns the entry it named if that is another one (only after the timer put an
    /// entry off, for a slot being imported): the caller takes that one out of the index too.
    pub fn entry_came_due(&self, due: Entry) -> Option<Entry> {
        let named = self.indexed().filter(|named| *named != due);
        self.set_indexed(None);
        named
    }

    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// When the lease index should look at this lock next: the earliest lease deadline when
    /// held (or earlier, when a hold becomes a long hold by `long_hold`, the threshold of its
    /// key: see `policy::long_hold_of`), the reclaim time when free.
    pub fn due(&self, long_hold: u64) -> Option<u64> {
        let reclaim_at = self.reclaim_at().map(NonZeroU64::get);
        match (self.lock.next_deadline(), self.wake_at()) {
            (Some(deadline), _) => {
                // The clock is read only when long holds are counted here.
                let long = (long_hold > 0)
                    .then(|| self.lock.long_due(long_hold, now_ms()))
                    .flatten();
                Some(long.map_or(deadline, |long| long.min(deadline)))
            }
            (None, Some(wake)) => Some(reclaim_at.map_or(wake, |at| at.min(wake))),
            (None, None) => reclaim_at,
        }
    }

    /// Marks the holds that became long holds by `now`, by the threshold `long_hold` (see
    /// `Lock::mark_long`).
    pub fn mark_long(&mut self, long_hold: u64, now: u64) -> Vec<(u64, Grant)> {
        self.lock.mark_long(long_hold, now)
    }

    /// For a free lock: true when its tombstone time is up at `now` (and no lock-delay runs).
    pub fn reclaimable(&self, now: u64) -> bool {
        !self.lock.has_holders()
            && self.reclaim_at().is_some_and(|at| at.get() <= now)
            && self.lock.delayed_until <= now
    }

    /// A free lock that could not be reclaimed yet (clients queue for it): looks again later.
    pub fn postpone_reclaim(&mut self, now: u64) {
        if !self.lock.has_holders() {
            self.since_or_reclaim = Some(moment(reclaim_time(now).max(now.saturating_add(1000))));
        }
    }

    /// Runs `change` on the lock and keeps the held gauge, the reclaim time and the fence floor
    /// in step, reading the clock (a replicated change).
    pub fn update<R>(&mut self, change: impl FnOnce(&mut Lock) -> R) -> R {
        self.update_at(now_ms(), change)
    }

    /// [`Stored::update`] at `now`, the time the caller judges the lock by: a lock it frees
    /// becomes reclaimable by that same time (with `lock.tombstone-ttl 0`, in the same step,
    /// however long the step takes).
    pub fn update_at<R>(&mut self, now: u64, change: impl FnOnce(&mut Lock) -> R) -> R {
        let was_held = self.lock.has_holders();
        let was_delayed = self.lock.delayed_until > now;
        let result = change(&mut self.lock);
        let is_held = self.lock.has_holders();
        if was_held != is_held {
            metrics::HELD.add(if is_held { 1 } else { -1 });
            let us = metrics::monotonic_us();
            if is_held {
                self.since_or_reclaim = Some(moment(us));
            } else if let Some(since) = self.since_or_reclaim.take().map(NonZeroU64::get) {
                metrics::HOLD.record(us.saturating_sub(since));
            }
        }
        // A free lock whose lock-delay was ended early (LOCK.FORCERELEASE) is kept for
        // `lock.tombstone-ttl` from now, no longer until the delay would have ended.
        let delay_ended = was_delayed && self.lock.delayed_until <= now;
        if !is_held && (self.since_or_reclaim.is_none() || delay_ended) {
            self.since_or_reclaim = Some(moment(reclaim_time(now)));
        }
        self.follow_delay(now);
        floor::raise(self.lock.fence, now);
        result
    }
}

/// Whatever frees the value (DEL, an overwrite, eviction, a flush, a reclaim; perhaps on a
/// lazy-free thread), the gauges, the lease index, the ages, the long-hold log and the session
/// table let go of it here.
impl Drop for Stored {
    fn drop(&mut self) {
        metrics::KEYS.add(-1);
        if self.lock.has_holders() {
            metrics::HELD.add(-1);
        }
        let index = self.indexed();
        if index.is_some() || self.age_slot().is_some() || self.lock.has_holders() {
            if let Some(forget) = FORGET_ENTRIES.get() {
                let mut entries = Entries {
                    index,
                    age: self.age_slot(),
                    ..Entries::default()
                };
                for (_, holder) in self.lock.all_holders() {
                    entries.long |= holder.long;
                    entries.sessions |= holder.session;
                }
                forget(self.id, entries);
            }
        }
    }
}

/// The type as Redis sees it. The name and encoding version are part of every RDB file that
/// holds a lock: never change them.
/// The lock type's name: what TYPE answers for a lock key, and SCAN's TYPE filter takes.
pub const LOCK_TYPE_NAME: &str = "lockstate";

pub static LOCK_TYPE: RedisType = RedisType::new(
    LOCK_TYPE_NAME,
    codec::ENCODING_VERSION,
    host::value::methods::<Stored>(),
);

impl Source for Rdb {
    fn unsigned(&mut self) -> Option<u64> {
        self.load_unsigned()
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        self.load_bytes()
    }
}

impl Sink for Rdb {
    fn unsigned(&mut self, value: u64) {
        self.save_unsigned(value);
    }
    fn bytes(&mut self, value: &[u8]) {
        self.save_bytes(value);
    }
}

impl Sink for Digest {
    fn unsigned(&mut self, value: u64) {
        self.add_unsigned(value);
    }
    fn bytes(&mut self, value: &[u8]) {
        self.add_bytes(value);
    }
}

impl ValueType for Stored {
    fn rdb_load(version: i32, rdb: &mut Rdb) -> Option<Self> {
        match codec::load(version, rdb) {
            Ok(lock) if !floor::is_plausible(lock.fence, now_ms()) => {
                let limit = floor::plausible_limit(now_ms());
                if rdb.is_dataset_load() {
                    // Refusing would stop the whole load: keep the lock (its own fences go on
                    // from its fence), but leave the floor, shared by every key, as it is.
                    host::log_warning(&format!(
                        "lock module: a loaded lock has fence {}, more than a year ahead of \
                         the clock (at most {limit} is believed); other keys' fences ignore it",
                        lock.fence
                    ));
                    Some(Stored::new(lock))
                } else {
                    host::log_warning(&format!(
                        "lock module refused a RESTOREd lock: its fence {} is more than a year \
                         ahead of the clock (at most {limit} is believed)",
                        lock.fence
                    ));
                    None
                }
            }
            Ok(lock) => Some(Stored::new(lock)),
            Err(error) => {
                host::log_warning(&format!(
                    "lock module cannot load a lock: {}",
                    error.describe()
                ));
                None
            }
        }
    }

    fn rdb_save(&self, rdb: &mut Rdb) {
        codec::save(&self.lock, rdb);
    }

    fn aof_command(&self) -> (&'static CStr, Vec<Vec<u8>>) {
        (APPLY, codec::effect_args(Event::Sync, &self.lock))
    }

    fn memory(&self) -> usize {
        std::mem::size_of::<Stored>() + self.lock.heap_bytes()
    }

    fn digest(&self, digest: &mut Digest) {
        codec::save(&self.lock, digest);
        digest.end_sequence();
    }

    fn copy(&self) -> Self {
        let mut lock = self.lock.clone();
        // The sessions belong to the connections that hold the original key.
        if let Some(holder) = lock.holder.as_mut() {
            holder.session = false;
        }
        if let Some(group) = lock.group.as_deref_mut() {
            group.change_members(|members| {
                for member in members {
                    member.holder.session = false;
                }
            });
        }
        Stored::new(lock)
    }

    fn aux_save(rdb: &mut Rdb) {
        rdb.save_unsigned(floor::get());
    }

    fn aux_load(version: i32, rdb: &mut Rdb) -> bool {
        if version > codec::AUX_VERSION {
            host::log_warning(&format!(
                "lock module cannot load fence floor of encoding version {version}"
            ));
            return false;
        }
        match rdb.load_unsigned() {
            Some(value) => {
                if !floor::is_plausible(value, now_ms()) {
                    host::log_warning(&format!(
                        "lock module: ignoring a saved fence floor of {value}, more than a year \
                         ahead of the clock"
                    ));
                }
                floor::raise(value, now_ms());
                true
            }
            None => false,
        }
    }
}

/// Whether a key of this type may hold a lock: `Ok(false)` when empty, WRONGTYPE for types
/// other than module types (whose value is checked to be ours when it is read).
fn may_hold_lock(key_type: KeyType) -> Result<bool, LockError> {
    match key_type {
        KeyType::Empty => Ok(false),
        KeyType::Module => Ok(true),
        _ => Err(LockError::WrongType),
    }
}

/// The lock stored in an open key: `None` when the key is empty, WRONGTYPE for other types.
pub fn in_key_mut(key: &RedisKeyWritable) -> Result<Option<&mut Stored>, LockError> {
    if !may_hold_lock(key.key_type())? {
        return Ok(None);
    }
    key.get_value::<Stored>(&LOCK_TYPE)
        .map_err(|_| LockError::WrongType)
}

/// The lock stored in a key opened for reading.
pub fn in_key(key: &RedisKey) -> Result<Option<&Stored>, LockError> {
    if !may_hold_lock(key.key_type())? {
        return Ok(None);
    }
    key.get_value::<Stored>(&LOCK_TYPE)
        .map_err(|_| LockError::WrongType)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::core::Holder;

    /// The allocator serves 80 bytes exactly, the next size is 96: every lock pays the step.
    #[test]
    fn a_lock_value_fits_an_80_byte_allocation() {
        assert!(std::mem::size_of::<Stored>() <= 80);
    }

    fn held_until(deadline: u64) -> Lock {
        Lock {
            fence: 1,
            holder: Some(Holder {
                provisional: false,
                long: false,
                deadline,
                holds: 1,
                session: false,
                grant: Box::new(Grant::of_token(crate::lock::core::TokenDigest::of(b"t"))),
            }),
            ..Lock::default()
        }
    }

    fn set_deadline(lock: &mut Lock, deadline: u64) {
        if let Some(holder) = lock.holder.as_mut() {
            holder.deadline = deadline;
        }
    }

    #[test]
    fn a_lock_has_one_entry_which_moves_to_earlier_times_only() {
        let deadline = now_ms() + 3_600_000;
        let mut stored = Stored::new(held_until(deadline));
        assert_eq!(stored.indexed(), None);
        assert_eq!(
            stored.index_plan(0),
            IndexPlan::Move {
                old: None,
                new: deadline
            }
        );
        stored.set_indexed(Some(Entry::tree(deadline)));
        assert_eq!(stored.index_plan(0), IndexPlan::Keep);
        // A renewal: the entry comes due early and is looked at then.
        stored.update(|lock| set_deadline(lock, deadline + 60_000));
        assert_eq!(stored.index_plan(0), IndexPlan::Keep);
        // A shorter lease moves it.
        stored.update(|lock| set_deadline(lock, deadline - 60_000));
        assert_eq!(
            stored.index_plan(0),
            IndexPlan::Move {
                old: Some(Entry::tree(deadline)),
                new: deadline - 60_000
            }
        );
        stored.set_indexed(Some(Entry::tree(deadline - 60_000)));
        // A release: due for reclaim only, before the deadline: queued in the entry's place.
        stored.update(|lock| lock.holder = None);
        let reclaim = stored.due(0).expect("a free lock is due for reclaim");
        assert!(reclaim < deadline - 60_000);
        assert_eq!(
            stored.index_plan(0),
            IndexPlan::Queue {
                old: Some(Entry::tree(deadline - 60_000)),
                at: reclaim
            }
        );
        stored.set_indexed(Some(Entry::queued(reclaim)));
        assert_eq!(stored.index_plan(0), IndexPlan::Keep);
        // Taken again with a lease due after the reclaim: the reclaim comes due first.
        stored.update(|lock| *lock = held_until(reclaim + 1));
        assert_eq!(stored.index_plan(0), IndexPlan::Keep);
        // Released again (a later reclaim), and taken again with a lease due before the queued
        // reclaim: the lease's entry replaces it.
        stored.update(|lock| lock.holder = None);
        assert_eq!(stored.index_plan(0), IndexPlan::Keep);
        stored.update(|lock| *lock = held_until(reclaim - 1));
        assert_eq!(
            stored.index_plan(0),
            IndexPlan::Move {
                old: Some(Entry::queued(reclaim)),
                new: reclaim - 1
            }
        );
        stored.set_indexed(Some(Entry::tree(reclaim - 1)));
        // The entry came due: the lock is indexed afresh.
        assert_eq!(stored.entry_came_due(Entry::tree(reclaim - 1)), None);
        assert_eq!(stored.indexed(), None);
        assert_eq!(
            stored.index_plan(0),
            IndexPlan::Move {
                old: None,
                new: reclaim - 1
            }
        );
        // An entry the timer put off came due: the one the lock names is to go too.
        stored.set_indexed(Some(Entry::tree(reclaim - 1)));
        assert_eq!(
            stored.entry_came_due(Entry::tree(reclaim + 100)),
            Some(Entry::tree(reclaim - 1))
        );
        assert_eq!(stored.indexed(), None);
    }

    #[test]
    fn a_lease_beyond_what_a_mark_holds_is_indexed_and_marked_at_the_latest_time() {
        let latest = lease_index::LATEST;
        for deadline in [latest, latest + 1, 1 << 62, 1 << 63, u64::MAX] {
            let stored = Stored::new(held_until(deadline));
            assert_eq!(
                stored.index_plan(0),
                IndexPlan::Move {
                    old: None,
                    new: latest
                },
                "{deadline}"
            );
            stored.set_indexed(Some(Entry::tree(latest)));
            assert_eq!(stored.indexed(), Some(Entry::tree(latest)));
            assert_eq!(stored.index_plan(0), IndexPlan::Keep);
            stored.set_indexed(Some(Entry::queued(latest)));
            assert_eq!(stored.indexed(), Some(Entry::queued(latest)));
            assert_eq!(stored.index_afresh(0), Some(latest));
            assert_eq!(stored.indexed(), Some(Entry::tree(latest)));
        }
    }

    #[test]
    fn a_free_lock_in_a_lock_delay_is_not_left_to_its_queued_reclaim() {
        let now = now_ms();
        let mut stored = Stored::new(held_until(now + 3_600_000));
        // Released once (a reclaim queued), then taken again with a longer lease.
        stored.set_indexed(Some(Entry::queued(now + 10_000)));
        // Its lease ran out with a lock-delay: the end of the delay is due first, in the
        // reclaim's place.
        stored.update(|lock| {
            lock.holder = None;
            lock.delayed_until = now + 500;
        });
        assert_eq!(stored.due(0), Some(now + 500));
        assert_eq!(
            stored.index_plan(0),
            IndexPlan::Move {
                old: Some(Entry::queued(now + 10_000)),
                new: now + 500
            }
        );
        stored.set_indexed(Some(Entry::tree(now + 500)));
        // The delay ended: its waiters are served, and the lock is queued for its reclaim.
        assert_eq!(stored.entry_came_due(Entry::tree(now + 500)), None);
        assert!(stored.take_wake(now + 500));
        assert!(matches!(
            stored.index_plan(0),
            IndexPlan::Queue { old: None, .. }
        ));
    }
}
