//! Server-side waiting: `LOCK.ACQUIRE ... WAIT` queues and `LOCK.WAIT` watchers.
//!
//! Each lock key with waiters has a FIFO of acquirers and a list of watchers; waiting clients
//! are blocked with `RedisModule_BlockClientOnKeys`, so Redis keeps them in the same arrival
//! order. When a lock becomes free the module signals its key as ready; right after the
//! command (or timer) that freed it, Redis calls our reply callback for the key's blocked
//! clients in order, and the one at the head of the queue is granted the lock and answered in
//! that same call: the lock never goes to a connection that is already gone. Watchers are
//! answered through `RedisModule_UnblockClient` with the outcome recorded here. A waiter that
//! times out, disconnects or is unblocked by `CLIENT UNBLOCK` is removed from its queue before
//! anything else can happen to it.
//!
//! All of this runs on the main thread; the mutex only satisfies `static`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Instant;

use redis_module::raw;

use crate::metrics;

/// A key in a database.
pub type KeyRef = (i32, Box<[u8]>);

/// The blocked-client handle Redis gave us. Only touched on the main thread.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Handle(pub *mut raw::RedisModuleBlockedClient);

// SAFETY: handles are created, used and dropped on Redis' main thread only; the queue lives in
// a static and so must be Send.
unsafe impl Send for Handle {}

/// What a queued acquirer asked for.
#[derive(Clone, Debug)]
pub struct Request {
    pub token: Box<[u8]>,
    pub ttl: u64,
    pub reentrant: bool,
    pub session: bool,
    pub client: u64,
}

#[derive(Debug)]
pub struct Waiter {
    pub id: u64,
    pub handle: Handle,
    pub since: Instant,
    pub kind: Kind,
}

#[derive(Debug)]
pub enum Kind {
    Acquire(Request),
    /// `LOCK.WAIT`: the fence of the grant it waits to see end.
    Watch {
        fence: u64,
    },
}

#[derive(Default)]
struct Queue {
    acquirers: VecDeque<Waiter>,
    watchers: Vec<Waiter>,
}

impl Queue {
    fn len(&self) -> usize {
        self.acquirers.len() + self.watchers.len()
    }
}

/// The private data of a blocked client: enough to find its queue entry.
#[derive(Debug)]
pub struct Tag {
    pub id: u64,
    pub key: KeyRef,
    pub watch: bool,
}

struct State {
    queues: HashMap<KeyRef, Queue>,
    /// Watchers taken off their queue and unblocked, until their timeout callback answers them
    /// (at once on Redis 7.0, before the next event-loop sleep on 7.2 and later).
    woken: HashSet<u64>,
    next_id: u64,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| {
    Mutex::new(State {
        queues: HashMap::new(),
        woken: HashSet::new(),
        next_id: 1,
    })
});

fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn next_id() -> u64 {
    let mut st = state();
    let id = st.next_id;
    st.next_id += 1;
    id
}

/// True when any client waits on any key (a check that needs no key).
pub fn anyone_waiting() -> bool {
    metrics::WAITERS.get() > 0
}

/// Number of clients waiting on `key` (acquirers and watchers).
pub fn waiting_on(key: &KeyRef) -> usize {
    state().queues.get(key).map_or(0, Queue::len)
}

/// True when acquirers are queued on `key`: a new, non-waiting acquire must not overtake them.
pub fn has_acquirers(key: &KeyRef) -> bool {
    state()
        .queues
        .get(key)
        .is_some_and(|q| !q.acquirers.is_empty())
}

pub fn acquirers_on(key: &KeyRef) -> usize {
    state().queues.get(key).map_or(0, |q| q.acquirers.len())
}

/// Queues a blocked client.
pub fn enqueue(key: KeyRef, waiter: Waiter) {
    let mut st = state();
    let queue = st.queues.entry(key).or_default();
    match waiter.kind {
        Kind::Acquire(_) => queue.acquirers.push_back(waiter),
        Kind::Watch { .. } => queue.watchers.push(waiter),
    }
    metrics::WAITERS.add(1);
}

/// Removes a waiter (timeout, disconnect, CLIENT UNBLOCK, freed). Returns it when it was still
/// queued.
pub fn remove(tag: &Tag) -> Option<Waiter> {
    let mut st = state();
    let queue = st.queues.get_mut(&tag.key)?;
    let waiter = if tag.watch {
        let at = queue.watchers.iter().position(|w| w.id == tag.id)?;
        queue.watchers.swap_remove(at)
    } else {
        let at = queue.acquirers.iter().position(|w| w.id == tag.id)?;
        queue.acquirers.remove(at)?
    };
    if queue.len() == 0 {
        st.queues.remove(&tag.key);
    }
    metrics::WAITERS.add(-1);
    Some(waiter)
}

/// Removes the waiter whose client disconnected.
pub fn remove_handle(handle: Handle) -> Option<Waiter> {
    let tag = {
        let st = state();
        st.queues.iter().find_map(|(key, q)| {
            let acquirer = q
                .acquirers
                .iter()
                .find(|w| w.handle == handle)
                .map(|w| (w.id, false));
            let watcher = || {
                q.watchers
                    .iter()
                    .find(|w| w.handle == handle)
                    .map(|w| (w.id, true))
            };
            acquirer.or_else(watcher).map(|(id, watch)| Tag {
                id,
                key: key.clone(),
                watch,
            })
        })
    }?;
    remove(&tag)
}

/// The fence a queued watcher waits to see end.
pub fn watched_fence(tag: &Tag) -> Option<u64> {
    let st = state();
    let watcher = st
        .queues
        .get(&tag.key)?
        .watchers
        .iter()
        .find(|w| w.id == tag.id)?;
    match watcher.kind {
        Kind::Watch { fence } => Some(fence),
        Kind::Acquire(_) => None,
    }
}

/// True when waiter `id` is the first acquirer queued on `key`.
pub fn is_head(key: &KeyRef, id: u64) -> bool {
    state()
        .queues
        .get(key)
        .and_then(|q| q.acquirers.front())
        .is_some_and(|w| w.id == id)
}

/// Takes the watchers of `key` that should wake: all when the lock is free, else those that
/// waited on a grant other than the current one.
pub fn take_watchers(key: &KeyRef, current: Option<u64>) -> Vec<Waiter> {
    let mut st = state();
    let Some(queue) = st.queues.get_mut(key) else {
        return Vec::new();
    };
    let (wake, keep): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut queue.watchers)
        .into_iter()
        .partition(|w| match (&w.kind, current) {
            (Kind::Watch { fence }, Some(now_held)) => *fence != now_held,
            _ => true,
        });
    queue.watchers = keep;
    if queue.len() == 0 {
        st.queues.remove(key);
    }
    metrics::WAITERS.add(-(wake.len() as i64));
    wake
}

/// Keys with waiters in `db` (all dbs for `None`).
pub fn keys_in(db: Option<i32>) -> Vec<KeyRef> {
    state()
        .queues
        .keys()
        .filter(|(d, _)| db.is_none_or(|db| *d == db))
        .cloned()
        .collect()
}

/// Unblocks a watcher already taken off its queue; its timeout callback answers 1.
pub fn wake_watcher(waiter: &Waiter) {
    state().woken.insert(waiter.id);
    // SAFETY: the handle is live: Redis frees it only after our free_privdata callback, and a
    // waiter still queued (we took it from the queue just now) has not been freed.
    unsafe {
        if let Some(unblock) = raw::RedisModule_UnblockClient {
            unblock(waiter.handle.0, std::ptr::null_mut());
        }
    }
}

/// In the timeout callback: true when the module woke waiter `id` (rather than a timeout or
/// `CLIENT UNBLOCK`). Also called when the waiter is freed, to forget it.
pub fn take_woken(id: u64) -> bool {
    state().woken.remove(&id)
}

/// Asks Redis to run the reply callbacks of the clients blocked on `key` after the current
/// command or callback.
pub fn signal_ready(ctx: &redis_module::Context, key: &redis_module::RedisString) {
    // SAFETY: valid context and key string.
    unsafe {
        if let Some(signal) = raw::RedisModule_SignalKeyAsReady {
            signal(ctx.ctx, key.inner);
        }
    }
}
