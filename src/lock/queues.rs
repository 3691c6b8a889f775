//! The clients waiting on locks: per key, a FIFO of acquirers (`LOCK.ACQUIRE ... WAIT`) and the
//! watchers of `LOCK.WAIT`, grouped by the grant they wait to see end.
//!
//! Waiter ids grow with every enqueue, so an ordered map by id is the arrival order: the head is
//! its first entry, and removing any waiter (timeout, disconnect, `CLIENT UNBLOCK`) costs
//! O(log n), so a mass disconnect of n waiters costs O(n log n). Keys are grouped by database,
//! so FLUSHDB and SWAPDB find theirs without looking at other databases.
//!
//! A multi-lock waiter (`LOCK.MACQUIRE ... WAIT`) queues on each of its keys at once, with one
//! id: the waiter itself in the queue of its first key, a shadow entry in the others. Since one
//! call enqueues it on all its keys together, any two waiters that share keys are in the same
//! order in every queue they share, so the earliest of them is at the head of all its queues:
//! nobody waits in a cycle.
//!
//! `H` is the blocked-client handle of the host; nothing here touches it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use crate::error::LockError;
use crate::lock::ages::{self, Space};
use crate::lock::core;
use crate::lock::KeyRef;
use crate::metrics;

/// `SYNC numreplicas timeout-ms` and `FSYNC timeout-ms`: the reply waits until that many
/// replicas acknowledged the change, and (FSYNC) until it is fsynced to this server's AOF, each
/// for at most its timeout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncRequest {
    pub replicas: u64,
    pub timeout_ms: u64,
    /// FSYNC's timeout, when given.
    pub fsync_ms: Option<u64>,
}

impl SyncRequest {
    /// True when the reply has anything to wait for (`SYNC 0 ms` alone has not).
    pub fn waits(&self) -> bool {
        self.replicas > 0 || self.fsync_ms.is_some()
    }

    /// These options with FSYNC's timeout (none: `SYNC` alone).
    pub fn with_fsync(sync: Option<SyncRequest>, fsync_ms: Option<u64>) -> Option<SyncRequest> {
        match (sync, fsync_ms) {
            (sync, None) => sync,
            (sync, Some(ms)) => Some(SyncRequest {
                fsync_ms: Some(ms),
                ..sync.unwrap_or_default()
            }),
        }
    }
}

/// What a queued acquirer asked for.
#[derive(Clone, Debug)]
pub struct Request {
    /// The digest of the token it presented.
    pub token: core::TokenDigest,
    pub ttl: u64,
    pub reentrant: bool,
    pub session: bool,
    /// The grant's lock-delay, in ms (0: none).
    pub delay: u64,
    pub mode: core::Mode,
    pub client: u64,
    pub sync: Option<SyncRequest>,
    /// The public label the grant is to carry (empty: none).
    pub label: Box<[u8]>,
    /// The waiting client's `addr name` when it queued (see `core::Grant`).
    pub connection: Box<[u8]>,
}

impl Request {
    /// What the lock core is asked to grant for this waiter.
    pub fn grant(&self) -> core::Request<'_> {
        core::Request {
            token: self.token,
            ttl: self.ttl,
            reentrant: self.reentrant,
            session: self.session,
            delay: self.delay,
            mode: self.mode,
            provisional: self.sync.is_some_and(|s| s.waits()),
            client: self.client,
            connection: &self.connection,
            label: &self.label,
        }
    }
}

#[derive(Debug)]
pub enum Kind {
    Acquire(Request),
    /// `LOCK.MACQUIRE ... WAIT`: every key of `keys` (the first is where the waiter is queued;
    /// the others hold shadows), all or none.
    AcquireAll {
        request: Request,
        keys: Vec<Box<[u8]>>,
        /// Where the last look at its keys stopped (the index of the key that kept it out).
        stopped_at: usize,
    },
    /// `LOCK.WAIT`: the fence of the grant it waits to see end.
    Watch {
        fence: u64,
    },
}

#[derive(Debug)]
pub struct Waiter<H> {
    pub id: u64,
    pub handle: H,
    pub since: Instant,
    /// When its wait times out; `None`: it waits without a limit.
    pub until: Option<Instant>,
    pub kind: Kind,
}

/// Why the module ended a wait itself (rather than a timeout or `CLIENT UNBLOCK`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// A watcher whose grant ended.
    Watched,
    /// The key went away in a way that may have moved it to another node: the client is told
    /// to send its command again, and Redis routes the retry.
    Displaced,
    /// A wait for replica acknowledgement ended: the reply, or why there is none.
    Answered(Result<i64, LockError>),
    /// An acquirer whose wait ran out before the server answered its timeout (Redis 7.0 looks
    /// at blocked clients' timeouts only when its event loop wakes): taken off its queues
    /// instead of granted, and answered as a timeout.
    TimedOut,
}

/// What a blocked client carries (its private data): enough to find its queue entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    pub id: u64,
    pub key: KeyRef,
    /// `Some(fence)` for a watcher of the grant with that fence.
    pub watch: Option<u64>,
    /// A multi-lock waiter's other keys (same database), where its shadows are queued.
    pub also: Vec<Box<[u8]>>,
}

impl Tag {
    /// Every key the waiter is queued on, its first key first.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(&*self.key.1).chain(self.also.iter().map(|k| &**k))
    }
}

/// An acquirer's place in one key's queue: the waiter, or the shadow of a multi-lock waiter
/// queued on its first key `primary`. The shadows of one waiter share one copy of that name:
/// a copy each would take up to a thousand times the name the client sent.
enum Slot<H> {
    Waiter(Waiter<H>),
    Shadow { primary: Arc<[u8]> },
}

struct Queue<H> {
    acquirers: BTreeMap<u64, Slot<H>>,
    /// Fence waited on -> watchers by id.
    watchers: BTreeMap<u64, BTreeMap<u64, Waiter<H>>>,
    /// The watchers' ids, in the order they came: how many, and the longest waiting.
    watcher_ids: BTreeSet<u64>,
}

impl<H> Queue<H> {
    fn new() -> Self {
        Queue {
            acquirers: BTreeMap::new(),
            watchers: BTreeMap::new(),
            watcher_ids: BTreeSet::new(),
        }
    }

    fn len(&self) -> usize {
        self.acquirers.len() + self.watcher_ids.len()
    }
}

pub struct Queues<H> {
    /// Database -> key -> queue; a key without waiters has no queue.
    dbs: HashMap<i32, HashMap<Box<[u8]>, Queue<H>>>,
    /// Waiters taken off their queue and unblocked by the module, until their timeout callback
    /// answers them.
    woken: HashMap<u64, Ending>,
    next_id: u64,
    /// Every queued waiter by id (the order it arrived in): when it began waiting, its key's
    /// tag and its key's space (its namespace, see `ages::Space`), so the oldest is the first
    /// entry.
    ages: BTreeMap<u64, (Instant, u64, Space)>,
    /// The ids of `ages` by space: the waiters of each namespace, and the oldest of them first.
    spaces: Vec<BTreeSet<u64>>,
}

impl<H> Default for Queues<H> {
    fn default() -> Self {
        Queues {
            dbs: HashMap::new(),
            woken: HashMap::new(),
            next_id: 1,
            ages: BTreeMap::new(),
            spaces: Vec::new(),
        }
    }
}

impl<H> Queues<H> {
    fn queue(&self, db: i32, key: &[u8]) -> Option<&Queue<H>> {
        self.dbs.get(&db)?.get(key)
    }

    /// Runs `f` on the queue of `key`, dropping the queue (and the db's map) when it empties.
    fn with_queue<R>(
        &mut self,
        db: i32,
        key: &[u8],
        f: impl FnOnce(&mut Queue<H>) -> R,
    ) -> Option<R> {
        let keys = self.dbs.get_mut(&db)?;
        let queue = keys.get_mut(key)?;
        let result = f(queue);
        if queue.len() == 0 {
            keys.remove(key);
            if keys.is_empty() {
                self.dbs.remove(&db);
            }
        }
        Some(result)
    }

    /// A new waiter id, larger than every earlier one.
    pub fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Number of clients waiting on `key` (acquirers and watchers).
    pub fn waiting_on(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, Queue::len)
    }

    /// Number of acquirers queued on `key`: a new, non-waiting acquire must not overtake them.
    pub fn acquirers_on(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, |q| q.acquirers.len())
    }

    /// Waiter `id` began waiting at `since` on a key with tag `tag` in space `space`.
    fn age_in(&mut self, id: u64, since: Instant, tag: u64, space: Space) {
        self.ages.insert(id, (since, tag, space));
        let space = usize::from(space);
        if self.spaces.len() <= space {
            self.spaces.resize_with(space + 1, BTreeSet::new);
        }
        self.spaces[space].insert(id);
    }

    /// Waiter `id` waits no more.
    fn age_out(&mut self, id: u64) {
        if let Some((_, _, space)) = self.ages.remove(&id) {
            if let Some(ids) = self.spaces.get_mut(usize::from(space)) {
                ids.remove(&id);
            }
        }
    }

    /// Queues a blocked client whose (first) key is in space `space`; `tag` must be the tag it
    /// was blocked with.
    pub fn enqueue(&mut self, tag: &Tag, waiter: Waiter<H>, space: Space) {
        let (db, key) = &tag.key;
        let queue = self
            .dbs
            .entry(*db)
            .or_default()
            .entry(key.clone())
            .or_insert_with(Queue::new);
        let id = waiter.id;
        let since = waiter.since;
        match tag.watch {
            None => {
                queue.acquirers.insert(id, Slot::Waiter(waiter));
                let primary: Arc<[u8]> = Arc::from(&**key);
                for other in &tag.also {
                    self.dbs
                        .entry(*db)
                        .or_default()
                        .entry(other.clone())
                        .or_insert_with(Queue::new)
                        .acquirers
                        .insert(
                            id,
                            Slot::Shadow {
                                primary: Arc::clone(&primary),
                            },
                        );
                }
            }
            Some(fence) => {
                queue.watcher_ids.insert(waiter.id);
                queue
                    .watchers
                    .entry(fence)
                    .or_default()
                    .insert(waiter.id, waiter);
            }
        }
        self.age_in(id, since, ages::tag_of(key), space);
        metrics::WAITERS.add(1);
    }

    /// The waiters in `left` are no longer queued.
    fn left<'a>(&mut self, left: impl IntoIterator<Item = &'a Waiter<H>>)
    where
        H: 'a,
    {
        for waiter in left {
            self.age_out(waiter.id);
        }
    }

    /// Removes a waiter (timeout, disconnect, CLIENT UNBLOCK, freed). Returns it when it was
    /// still queued.
    pub fn remove(&mut self, tag: &Tag) -> Option<Waiter<H>> {
        let (db, key) = &tag.key;
        for other in &tag.also {
            self.with_queue(*db, other, |queue| queue.acquirers.remove(&tag.id));
        }
        let waiter = self.with_queue(*db, key, |queue| match tag.watch {
            None => match queue.acquirers.remove(&tag.id)? {
                Slot::Waiter(waiter) => Some(waiter),
                Slot::Shadow { .. } => None,
            },
            Some(fence) => {
                let group = queue.watchers.get_mut(&fence)?;
                let waiter = group.remove(&tag.id)?;
                if group.is_empty() {
                    queue.watchers.remove(&fence);
                }
                queue.watcher_ids.remove(&tag.id);
                Some(waiter)
            }
        })??;
        self.age_out(waiter.id);
        metrics::WAITERS.add(-1);
        Some(waiter)
    }

    /// True when waiter `id` is the first acquirer queued on `key`.
    pub fn is_head(&self, db: i32, key: &[u8], id: u64) -> bool {
        self.queue(db, key)
            .and_then(|q| q.acquirers.first_key_value())
            .is_some_and(|(head, _)| *head == id)
    }

    /// The first acquirer queued on `key`, when it is a single-key acquirer (`LOCK.ACQUIRE ...
    /// WAIT`): its id and handle.
    pub fn single_head(&self, db: i32, key: &[u8]) -> Option<(u64, &H)> {
        match self.queue(db, key)?.acquirers.first_key_value()? {
            (
                id,
                Slot::Waiter(Waiter {
                    handle,
                    kind: Kind::Acquire(_),
                    ..
                }),
            ) => Some((*id, handle)),
            _ => None,
        }
    }

    /// The first acquirer queued on `key`, when its wait ran out by `now`: its tag (a multi-lock
    /// waiter's names its first key and the others), to take it off every queue it is on.
    pub fn lapsed_head(&self, db: i32, key: &[u8], now: Instant) -> Option<Tag> {
        let (id, slot) = self.queue(db, key)?.acquirers.first_key_value()?;
        let (primary, waiter): (&[u8], &Waiter<H>) = match slot {
            Slot::Waiter(waiter) => (key, waiter),
            Slot::Shadow { primary } => match self.queue(db, primary)?.acquirers.get(id)? {
                Slot::Waiter(waiter) => (primary, waiter),
                Slot::Shadow { .. } => return None,
            },
        };
        if waiter.until.is_none_or(|until| until > now) {
            return None;
        }
        let also = match &waiter.kind {
            Kind::AcquireAll { keys, .. } => keys.iter().skip(1).cloned().collect(),
            Kind::Acquire(_) | Kind::Watch { .. } => Vec::new(),
        };
        Some(Tag {
            id: *id,
            key: (db, primary.into()),
            watch: None,
            also,
        })
    }

    /// True when the wait of the waiter `tag` ran out by `now` (and it is still queued).
    pub fn has_lapsed(&self, tag: &Tag, now: Instant) -> bool {
        let (db, key) = &tag.key;
        let Some(queue) = self.queue(*db, key) else {
            return false;
        };
        let waiter = match tag.watch {
            None => match queue.acquirers.get(&tag.id) {
                Some(Slot::Waiter(waiter)) => waiter,
                _ => return false,
            },
            Some(fence) => match queue.watchers.get(&fence).and_then(|w| w.get(&tag.id)) {
                Some(waiter) => waiter,
                None => return false,
            },
        };
        waiter.until.is_some_and(|until| until <= now)
    }

    /// True when `tag` is a multi-lock waiter (`LOCK.MACQUIRE ... WAIT`), even of one key.
    pub fn is_multi(&self, tag: &Tag) -> bool {
        let (db, key) = &tag.key;
        self.queue(*db, key)
            .and_then(|q| q.acquirers.get(&tag.id))
            .is_some_and(|slot| {
                matches!(
                    slot,
                    Slot::Waiter(Waiter {
                        kind: Kind::AcquireAll { .. },
                        ..
                    })
                )
            })
    }

    /// What the queued single-key acquirer `id` asked for.
    pub fn request_of(&self, db: i32, key: &[u8], id: u64) -> Option<&Request> {
        match self.queue(db, key)?.acquirers.get(&id)? {
            Slot::Waiter(Waiter {
                kind: Kind::Acquire(request),
                ..
            }) => Some(request),
            _ => None,
        }
    }

    /// Where the last look at multi-lock waiter `tag`'s keys stopped (0 at first).
    pub fn stopped_at(&self, tag: &Tag) -> usize {
        let (db, key) = &tag.key;
        match self.queue(*db, key).and_then(|q| q.acquirers.get(&tag.id)) {
            Some(Slot::Waiter(Waiter {
                kind: Kind::AcquireAll { stopped_at, .. },
                ..
            })) => *stopped_at,
            _ => 0,
        }
    }

    /// The last look at multi-lock waiter `tag`'s keys stopped at key `at`.
    pub fn set_stopped_at(&mut self, tag: &Tag, at: usize) {
        let (db, key) = &tag.key;
        let slot = self
            .dbs
            .get_mut(db)
            .and_then(|keys| keys.get_mut(key))
            .and_then(|q| q.acquirers.get_mut(&tag.id));
        if let Some(Slot::Waiter(Waiter {
            kind: Kind::AcquireAll { stopped_at, .. },
            ..
        })) = slot
        {
            *stopped_at = at;
        }
    }

    /// The token a queued acquirer asked for.
    pub fn token_of(&self, tag: &Tag) -> Option<core::TokenDigest> {
        let (db, key) = &tag.key;
        match self.queue(*db, key)?.acquirers.get(&tag.id)? {
            Slot::Waiter(Waiter {
                kind: Kind::Acquire(request) | Kind::AcquireAll { request, .. },
                ..
            }) => Some(request.token),
            _ => None,
        }
    }

    /// The acquirers queued on `key`, in queue order (a multi-lock waiter's shadow yields the
    /// waiter itself, found on its first key).
    pub fn acquirers(&self, db: i32, key: &[u8]) -> impl Iterator<Item = &Waiter<H>> {
        let queue = self.queue(db, key);
        queue
            .into_iter()
            .flat_map(|q| q.acquirers.iter())
            .filter_map(move |(id, slot)| match slot {
                Slot::Waiter(waiter) => Some(waiter),
                Slot::Shadow { primary } => match self.queue(db, primary)?.acquirers.get(id)? {
                    Slot::Waiter(waiter) => Some(waiter),
                    Slot::Shadow { .. } => None,
                },
            })
    }

    /// The clients waiting on `key` (acquirers, a multi-lock one on each of its keys, and
    /// watchers), and when the one waiting longest began.
    pub fn waiting_on_since(&self, db: i32, key: &[u8]) -> (usize, Option<Instant>) {
        let Some(queue) = self.queue(db, key) else {
            return (0, None);
        };
        let first_acquirer = queue.acquirers.first_key_value().map(|(id, _)| *id);
        let first_watcher = queue.watcher_ids.first().copied();
        let first = first_acquirer.into_iter().chain(first_watcher).min();
        let since = first.and_then(|id| self.ages.get(&id)).map(|age| age.0);
        (queue.len(), since)
    }

    /// The watchers (`LOCK.WAIT`) of `key`.
    pub fn watchers_on(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, |q| q.watcher_ids.len())
    }

    /// The oldest waiter of all (acquirer or watcher): when it began waiting, and its key's tag
    /// (a multi-lock waiter's first key).
    pub fn oldest(&self) -> Option<(Instant, u64)> {
        self.ages
            .first_key_value()
            .map(|(_, (since, tag, _))| (*since, *tag))
    }

    /// The waiters in space `space` (a multi-lock waiter in its first key's), and when the
    /// oldest of them began waiting.
    pub fn in_space(&self, space: Space) -> (usize, Option<Instant>) {
        let Some(ids) = self.spaces.get(usize::from(space)) else {
            return (0, None);
        };
        let oldest = ids
            .first()
            .and_then(|id| self.ages.get(id))
            .map(|(since, _, _)| *since);
        (ids.len(), oldest)
    }

    /// Puts every waiter in the space `space_of` gives its (first) key now (the policy
    /// changed). One pass over the waiters.
    pub fn respace(&mut self, space_of: impl Fn(&[u8]) -> Space) {
        let mut moves = Vec::new();
        for keys in self.dbs.values() {
            for (key, queue) in keys {
                let space = space_of(key);
                let acquirers = queue
                    .acquirers
                    .iter()
                    .filter(|(_, slot)| matches!(slot, Slot::Waiter(_)))
                    .map(|(id, _)| *id);
                let watchers = queue
                    .watchers
                    .values()
                    .flat_map(|group| group.keys().copied());
                moves.extend(acquirers.chain(watchers).map(|id| (id, space)));
            }
        }
        for (id, space) in moves {
            if let Some((since, tag, _)) = self.ages.get(&id).copied() {
                self.age_out(id);
                self.age_in(id, since, tag, space);
            }
        }
    }

    /// The acquirers queued on `key`: (exclusive, shared or permit).
    pub fn acquirers_by_mode(&self, db: i32, key: &[u8]) -> (usize, usize) {
        let Some(queue) = self.queue(db, key) else {
            return (0, 0);
        };
        let shared = queue
            .acquirers
            .values()
            .filter(|slot| {
                matches!(slot, Slot::Waiter(Waiter { kind: Kind::Acquire(r), .. })
                    if r.mode != core::Mode::Exclusive)
            })
            .count();
        (queue.acquirers.len() - shared, shared)
    }

    /// True when the first acquirer queued on `key` asked for SYNC (its answer waits for
    /// replicas).
    pub fn head_syncs(&self, db: i32, key: &[u8]) -> bool {
        self.queue(db, key)
            .and_then(|q| q.acquirers.first_key_value())
            .is_some_and(|(_, slot)| {
                matches!(slot, Slot::Waiter(w)
                    if matches!(&w.kind, Kind::Acquire(r) if r.sync.is_some_and(|s| s.waits())))
            })
    }

    /// Takes the watchers of `key` whose wait is over: all when the lock is free (`oldest` is
    /// `None`), else those that waited on grants older than `oldest`, the fence of the oldest
    /// current holder (each watcher waits for every holder up to the fence it noted).
    pub fn take_watchers(&mut self, db: i32, key: &[u8], oldest: Option<u64>) -> Vec<Waiter<H>> {
        let woken = self
            .with_queue(db, key, |queue| {
                let kept = oldest.map(|fence| queue.watchers.split_off(&fence));
                let woken: Vec<Waiter<H>> = std::mem::take(&mut queue.watchers)
                    .into_values()
                    .flat_map(BTreeMap::into_values)
                    .collect();
                queue.watchers = kept.unwrap_or_default();
                for waiter in &woken {
                    queue.watcher_ids.remove(&waiter.id);
                }
                woken
            })
            .unwrap_or_default();
        self.left(&woken);
        metrics::WAITERS.add(-i64::try_from(woken.len()).unwrap_or(i64::MAX));
        woken
    }

    /// Keys with waiters in `db` (all dbs for `None`).
    pub fn keys_in(&self, db: Option<i32>) -> Vec<KeyRef> {
        let keys = |(db, keys): (&i32, &HashMap<Box<[u8]>, Queue<H>>)| {
            keys.keys()
                .map(|key| (*db, key.clone()))
                .collect::<Vec<_>>()
        };
        match db {
            Some(db) => self.dbs.get_key_value(&db).map(keys).unwrap_or_default(),
            None => self.dbs.iter().flat_map(keys).collect(),
        }
    }

    /// Takes every waiter of `key`, acquirers and watchers.
    pub fn take_all(&mut self, db: i32, key: &[u8]) -> Vec<Waiter<H>> {
        let Some(keys) = self.dbs.get_mut(&db) else {
            return Vec::new();
        };
        let Some(queue) = keys.remove(key) else {
            return Vec::new();
        };
        if keys.is_empty() {
            self.dbs.remove(&db);
        }
        let mut all = Vec::new();
        for (id, slot) in queue.acquirers {
            match slot {
                Slot::Waiter(waiter) => {
                    self.forget_shadows(db, &waiter);
                    all.push(waiter);
                }
                // A multi-lock waiter queued on another key: it leaves all its queues too.
                Slot::Shadow { primary } => {
                    let Some(Slot::Waiter(waiter)) = self
                        .with_queue(db, &primary, |queue| queue.acquirers.remove(&id))
                        .flatten()
                    else {
                        continue;
                    };
                    self.forget_shadows(db, &waiter);
                    all.push(waiter);
                }
            }
        }
        all.extend(queue.watchers.into_values().flat_map(BTreeMap::into_values));
        self.left(&all);
        metrics::WAITERS.add(-i64::try_from(all.len()).unwrap_or(i64::MAX));
        all
    }

    /// Removes the shadows of a multi-lock waiter taken off its first key's queue.
    fn forget_shadows(&mut self, db: i32, waiter: &Waiter<H>) {
        if let Kind::AcquireAll { keys, .. } = &waiter.kind {
            for key in keys.iter().skip(1) {
                self.with_queue(db, key, |queue| queue.acquirers.remove(&waiter.id));
            }
        }
    }

    /// Records why the module ended waiter `id`'s wait (its timeout callback answers it).
    pub fn mark_woken(&mut self, id: u64, ending: Ending) {
        self.woken.insert(id, ending);
    }

    /// Why the module ended waiter `id`'s wait, if it did (once).
    pub fn take_woken(&mut self, id: u64) -> Option<Ending> {
        self.woken.remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(q: &mut Queues<u32>, key: &str, watch: Option<u64>) -> Tag {
        Tag {
            id: q.next_id(),
            key: (0, key.as_bytes().into()),
            watch,
            also: Vec::new(),
        }
    }

    fn waiter(tag: &Tag, handle: u32) -> Waiter<u32> {
        let kind = match tag.watch {
            Some(fence) => Kind::Watch { fence },
            None => Kind::Acquire(Request {
                token: core::TokenDigest::of(b"t"),
                ttl: 1,
                reentrant: false,
                session: false,
                delay: 0,
                mode: core::Mode::Exclusive,
                client: 1,
                sync: None,
                label: Box::default(),
                connection: Box::default(),
            }),
        };
        Waiter {
            until: None,
            id: tag.id,
            handle,
            since: Instant::now(),
            kind,
        }
    }

    #[test]
    fn acquirers_leave_in_arrival_order_from_anywhere_in_the_queue() {
        let mut q = Queues::default();
        let tags: Vec<Tag> = (0..5).map(|_| tag(&mut q, "k", None)).collect();
        for (n, t) in tags.iter().enumerate() {
            q.enqueue(t, waiter(t, n as u32), 0);
        }
        assert_eq!(q.acquirers_on(0, b"k"), 5);
        assert!(q.is_head(0, b"k", tags[0].id));
        assert_eq!(q.remove(&tags[2]).map(|w| w.handle), Some(2));
        assert!(q.remove(&tags[2]).is_none());
        assert_eq!(q.remove(&tags[0]).map(|w| w.handle), Some(0));
        assert!(q.is_head(0, b"k", tags[1].id));
        for t in [&tags[1], &tags[3], &tags[4]] {
            assert!(q.remove(t).is_some());
        }
        assert_eq!(q.waiting_on(0, b"k"), 0);
        assert!(q.keys_in(None).is_empty());
    }

    #[test]
    fn each_space_counts_its_waiters_and_knows_its_oldest() {
        let mut q = Queues::default();
        let a1 = tag(&mut q, "a", None);
        let b1 = tag(&mut q, "b", None);
        let a2 = tag(&mut q, "a", Some(3));
        q.enqueue(&a1, waiter(&a1, 1), 1);
        q.enqueue(&b1, waiter(&b1, 2), 2);
        q.enqueue(&a2, waiter(&a2, 3), 1);
        let count = |q: &Queues<u32>, space| q.in_space(space).0;
        assert_eq!(
            (count(&q, 0), count(&q, 1), count(&q, 2), count(&q, 9)),
            (0, 2, 1, 0)
        );
        let since_of = |w: &Tag| q.ages.get(&w.id).map(|age| age.0);
        assert_eq!(q.in_space(1).1, since_of(&a1));
        // The policy changed: key a is now in space 2, b in none (0).
        q.respace(|key| if key == b"a" { 2 } else { 0 });
        assert_eq!((count(&q, 0), count(&q, 1), count(&q, 2)), (1, 0, 2));
        assert_eq!(q.in_space(2).1, q.ages.get(&a1.id).map(|age| age.0));
        // Leaving, by any way, leaves the space.
        assert!(q.remove(&a1).is_some());
        assert_eq!(q.take_watchers(0, b"a", None).len(), 1);
        assert_eq!((count(&q, 0), count(&q, 2)), (1, 0));
        assert_eq!(q.in_space(2).1, None);
        assert!(q.remove(&b1).is_some());
        assert_eq!(count(&q, 0), 0);
    }

    #[test]
    fn watchers_of_the_current_grant_stay_and_others_wake() {
        let mut q = Queues::default();
        let old = tag(&mut q, "k", Some(7));
        let current = tag(&mut q, "k", Some(9));
        q.enqueue(&old, waiter(&old, 1), 0);
        q.enqueue(&current, waiter(&current, 2), 0);
        let woken: Vec<u32> = q
            .take_watchers(0, b"k", Some(9))
            .iter()
            .map(|w| w.handle)
            .collect();
        assert_eq!(woken, vec![1]);
        assert_eq!(q.waiting_on(0, b"k"), 1);
        let woken: Vec<u32> = q
            .take_watchers(0, b"k", None)
            .iter()
            .map(|w| w.handle)
            .collect();
        assert_eq!(woken, vec![2]);
        assert_eq!(q.waiting_on(0, b"k"), 0);
        assert!(q.remove(&current).is_none());
    }

    #[test]
    fn keys_are_listed_per_database() {
        let mut q = Queues::default();
        for (db, key) in [(0, "a"), (1, "b"), (1, "c")] {
            let t = Tag {
                id: q.next_id(),
                key: (db, key.as_bytes().into()),
                watch: None,
                also: Vec::new(),
            };
            q.enqueue(&t, waiter(&t, 0), 0);
        }
        let mut in_one = q.keys_in(Some(1));
        in_one.sort();
        assert_eq!(
            in_one,
            vec![(1, b"b".as_slice().into()), (1, b"c".as_slice().into())]
        );
        assert_eq!(q.keys_in(None).len(), 3);
        assert!(q.keys_in(Some(2)).is_empty());
    }
}
