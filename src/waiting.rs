//! Server-side waiting: `LOCK.ACQUIRE ... WAIT` queues and `LOCK.WAIT` watchers.
//!
//! Each lock key with waiters has a FIFO of acquirers and a list of watchers. Waiting clients
//! are blocked with `RedisModule_BlockClientOnKeys`; when a lock becomes free the module itself
//! grants it to the head acquirer and unblocks that client with `RedisModule_UnblockClient`,
//! which for clients blocked on keys runs our timeout callback at once: the waiter's reply is
//! written in the same step as the release, so the lock never goes to a connection that is
//! already gone. A waiter that times out, disconnects or is unblocked by `CLIENT UNBLOCK` is
//! removed from its queue before anything else can happen to it.
//!
//! All of this runs on the main thread; the mutex only satisfies `static`.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
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

/// How a waiter is answered when the module wakes it (as opposed to a timeout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    Granted(u64),
    Freed,
    FenceExhausted,
}

struct State {
    queues: HashMap<KeyRef, Queue>,
    next_id: u64,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| {
    Mutex::new(State {
        queues: HashMap::new(),
        next_id: 1,
    })
});

fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

thread_local! {
    /// The wake being delivered: set just before `RedisModule_UnblockClient`, which calls the
    /// timeout callback synchronously, where it is taken.
    static DELIVERING: Cell<Option<(u64, Wake)>> = const { Cell::new(None) };
}

pub fn next_id() -> u64 {
    let mut st = state();
    let id = st.next_id;
    st.next_id += 1;
    id
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

/// Takes the head acquirer of `key`.
pub fn pop_head(key: &KeyRef) -> Option<Waiter> {
    let mut st = state();
    let queue = st.queues.get_mut(key)?;
    let head = queue.acquirers.pop_front()?;
    if queue.len() == 0 {
        st.queues.remove(key);
    }
    metrics::WAITERS.add(-1);
    Some(head)
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

/// Answers a waiter that was already taken off its queue, through its timeout callback.
pub fn deliver(waiter: &Waiter, wake: Wake) {
    DELIVERING.with(|d| d.set(Some((waiter.id, wake))));
    // SAFETY: the handle is live: it is freed only after free_privdata, which removes it from
    // the queue first, and we took it from the queue just now.
    unsafe {
        if let Some(unblock) = raw::RedisModule_UnblockClient {
            unblock(waiter.handle.0, std::ptr::null_mut());
        }
    }
    DELIVERING.with(|d| d.set(None));
}

/// In the timeout callback: the wake being delivered to waiter `id`, if any.
pub fn delivering(id: u64) -> Option<Wake> {
    DELIVERING
        .with(|d| d.get())
        .filter(|(for_id, _)| *for_id == id)
        .map(|(_, wake)| wake)
}
