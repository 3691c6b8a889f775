//! Server-side waiting: blocking `LOCK.ACQUIRE ... WAIT`, `LOCK.MACQUIRE ... WAIT` and
//! `LOCK.WAIT`, granting the lock to the head of its queue right after the command or timer
//! callback that freed it (`serve_ready`), granting every lock of a multi-lock waiter at the head
//! of all its queues from the reply callback Redis runs right after a release, and answering
//! waits that time out or end.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis_module::{Context, RedisString, RedisValue};

use crate::error::LockError;
use crate::host::blocking::{self, BlockedClient, OnKey};
use crate::host::command::CommandResult;
use crate::host::server::{
    avoid_replica_traffic, in_multi_or_script, is_loading, is_primary, key_string, now_ms,
    select_db, selected_db,
};
use crate::host::timer;
use crate::host::{guarded, keys};
use crate::lock::core::{self, Acquire, Admit, Mode};
use crate::lock::locked;
use crate::lock::queues::{Ending, Kind, Request, SyncRequest, Tag, Waiter};
use crate::lock::sessions;
use crate::lock::slots;
use crate::metrics;
use crate::service::acks::{self, Confirms};
use crate::service::change::{expire_overdue, grant_key, grant_stored};
use crate::service::policy::{self, Judging, Stat};
use crate::service::value::{in_key, in_key_mut, Stored};
use crate::service::waiters;

/// Blocks the calling client on `key` until it is served or `timeout` ms pass (0: no limit).
pub fn block(ctx: &Context, key: &RedisString, timeout: u64, kind: Kind) -> CommandResult {
    let id = waiters::queues().next_id();
    let tag = Tag {
        id,
        key: waiters::key_ref(ctx, key),
        watch: match kind {
            Kind::Watch { fence } => Some(fence),
            Kind::Acquire(_) | Kind::AcquireAll { .. } => None,
        },
        also: Vec::new(),
    };
    block_queued(ctx, &[key], timeout, tag, kind)
}

/// Blocks the calling client on `keys` with `tag`, and queues it as `kind`.
fn block_queued(
    ctx: &Context,
    keys: &[&RedisString],
    timeout: u64,
    tag: Tag,
    kind: Kind,
) -> CommandResult {
    let queued = tag.clone();
    let parked = match (&kind, keys) {
        (Kind::Acquire(_), [key]) => parking_name(ctx, key),
        _ => None,
    };
    let blocked = match &parked {
        Some(name) => blocking::block_on_key::<Handoff>(ctx, name, timeout, tag),
        None => blocking::block_on_keys::<Handoff>(ctx, keys, timeout, tag),
    };
    let handle = blocked.ok_or(LockError::internal(
        "the server refused to block the client",
    ))?;
    let since = Instant::now();
    let waiter = Waiter {
        id: queued.id,
        handle,
        since,
        until: (timeout > 0)
            .then(|| since.checked_add(Duration::from_millis(timeout)))
            .flatten(),
        kind,
    };
    let space = policy::space_of(&queued.key.1);
    waiters::queues().enqueue(&queued, waiter, space);
    Ok(RedisValue::NoReply)
}

/// Where a single-key acquirer of `key` is blocked: a name in the same hash slot (so Redis
/// Cluster treats the client as it would one blocked on `key`) that nothing signals. Redis offers
/// a signalled key to every client blocked on it, which made each handoff cost O(waiters); the
/// module serves these acquirers itself instead (see `serve_ready`), in O(log waiters). `None`
/// for the rare keys whose braces allow no such name: their acquirers block on the key itself
/// and are served by either path.
fn parking_name(ctx: &Context, key: &RedisString) -> Option<RedisString> {
    slots::name_in_slot_of(key.as_slice(), PARKING_SUFFIX).map(|name| key_string(ctx, &name))
}

/// What follows the hash tag in a parking name (see `parking_name`).
const PARKING_SUFFIX: &[u8] = b"\0lock:waiting";

/// Blocks the calling client until the replicas acknowledged the change just made to `key`, then
/// answers `reply` (see `acks`).
pub fn block_for_acks(
    ctx: &Context,
    key: &RedisString,
    confirms: Confirms,
    reply: i64,
    sync: SyncRequest,
) -> CommandResult {
    let id = waiters::queues().next_id();
    let place = waiters::key_ref(ctx, key);
    let tag = Tag {
        id,
        key: place.clone(),
        watch: None,
        also: Vec::new(),
    };
    // Blocked on the key like a waiter, but in no queue: signals of the key leave it waiting.
    let client = blocking::block_on_key::<Handoff>(ctx, key, 0, tag).ok_or(LockError::internal(
        "the server refused to block the client",
    ))?;
    acks::track(ctx, id, client, place, confirms, reply, sync);
    Ok(RedisValue::NoReply)
}

/// Fence replies are RESP integers: signed.
pub fn fence_reply(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

/// The blocked clients of `LOCK.ACQUIRE ... WAIT` and `LOCK.WAIT`.
pub struct Handoff;

impl OnKey for Handoff {
    type Tag = Tag;

    /// The head acquirer of a free lock gets it (and its fence as reply); a watcher whose wait is
    /// over gets 1. `None` keeps the client waiting.
    fn ready(ctx: &Context, tag: &Tag) -> Option<CommandResult> {
        if avoid_replica_traffic() {
            // Paused clients: no grant may be replicated now. Its keys are signalled again
            // once the pause is over (see `serve_ready`).
            for key in tag.keys() {
                waiters::signal_later(ctx, (tag.key.0, key.into()));
            }
            return None;
        }
        serve(ctx, tag)
    }

    /// A watcher the module woke (see `waiters::wake_watchers`), or a wait that timed out or
    /// was cancelled by `CLIENT UNBLOCK`.
    fn ended(ctx: &Context, tag: &Tag) -> CommandResult {
        let was_head = heads_a_queue(tag);
        let answer = end(ctx, tag);
        settle_others(ctx, tag, was_head);
        answer
    }

    fn disconnected(ctx: &Context, tag: &Tag) {
        let was_head = heads_a_queue(tag);
        waiters::remove(tag);
        acks::abandon(tag.id);
        settle_others(ctx, tag, was_head);
    }

    fn freed(tag: Tag) {
        waiters::remove(&tag);
        waiters::queues().take_woken(tag.id);
        acks::abandon(tag.id);
    }
}

/// The answer to a wait that ended without a grant: a watcher woken, a waiter displaced or
/// answered by the module, or a timeout (or CLIENT UNBLOCK).
fn end(ctx: &Context, tag: &Tag) -> CommandResult {
    match waiters::queues().take_woken(tag.id) {
        Some(Ending::Watched) => return Ok(RedisValue::Integer(1)),
        Some(Ending::Displaced) => return Err(LockError::Displaced),
        Some(Ending::Answered(answer)) => return answer.map(RedisValue::Integer),
        Some(Ending::TimedOut) => return Ok(timed_out(tag)),
        None => {}
    }
    // The wait ended (its WAIT timeout, CLIENT UNBLOCK) while replicas had not yet
    // acknowledged the grant: it is taken back (unless its token made it firm).
    if let Some(error) = acks::abandon_answer(ctx, tag.id) {
        return Err(error);
    }
    waiters::remove(tag);
    Ok(timed_out(tag))
}

/// The answer to a wait that ran out: 0 for a watcher, nil (counted) for an acquirer.
fn timed_out(tag: &Tag) -> RedisValue {
    if tag.watch.is_some() {
        RedisValue::Integer(0)
    } else {
        metrics::ACQUIRE_TIMEOUTS.incr();
        policy::tally(&tag.key.1, Stat::Timeouts, 1);
        RedisValue::Null
    }
}

/// Takes off its queues every acquirer at the head of `name`'s queue (in `db`) whose wait ran
/// out, and answers each as timed out: Redis 7.0 looks at blocked clients' timeouts only when
/// its event loop wakes, so a lock freed meanwhile (a release, a lease's end, DEL, a session's
/// disconnect) must not be handed to them. Every hand-over looks here first.
fn drop_lapsed_heads(db: i32, name: &[u8]) {
    let now = Instant::now();
    loop {
        let lapsed = waiters::queues().lapsed_head(db, name, now);
        let Some(tag) = lapsed else {
            return;
        };
        match waiters::remove(&tag) {
            Some(waiter) => waiters::end_wait(waiter.id, waiter.handle, Ending::TimedOut),
            None => return,
        }
    }
}

/// True when acquirer `tag` is at the head of one of its queues.
fn heads_a_queue(tag: &Tag) -> bool {
    let queues = waiters::queues();
    tag.watch.is_none() && tag.keys().any(|key| queues.is_head(tag.key.0, key, tag.id))
}

/// An acquirer left its queues without a grant. A multi-lock waiter's keys are all looked at
/// again: those behind it may have waited only for it. A single waiter that headed its queue
/// may have kept out the waiters behind it (readers behind a writer, while the lock is held
/// shared): they get their turn when the lock has room. Redis serves them after this callback.
fn settle_others(ctx: &Context, tag: &Tag, was_head: bool) {
    if !tag.also.is_empty() {
        signal_keys(ctx, tag);
        return;
    }
    if !was_head {
        return;
    }
    let name = key_string(ctx, &tag.key.1);
    if !waiters::queued(ctx, &name) {
        return;
    }
    let key = ctx.open_key(&name);
    if let Ok(Some(stored)) = in_key(&key) {
        if stored.lock().has_room(now_ms()) {
            waiters::signal_ready(ctx, &name);
        }
    }
}

/// Every key of multi-lock waiter `tag` has room for the waiters behind it (it left them).
fn signal_keys(ctx: &Context, tag: &Tag) {
    for key in tag.keys() {
        waiters::signal_ready(ctx, &key_string(ctx, key));
    }
}

/// Blocks the calling client on every key of `keys` until it is at the head of all their queues
/// while every lock is free, then grants them all at once (see `serve_all`), or `timeout` ms
/// pass (0: no limit).
pub fn block_all(
    ctx: &Context,
    keys: &[RedisString],
    timeout: u64,
    request: Request,
) -> CommandResult {
    let [first, others @ ..] = keys else {
        return Err(LockError::WrongArity);
    };
    let id = waiters::queues().next_id();
    let tag = Tag {
        id,
        key: waiters::key_ref(ctx, first),
        watch: None,
        also: others.iter().map(|k| k.as_slice().into()).collect(),
    };
    let refs: Vec<&RedisString> = keys.iter().collect();
    let kind = Kind::AcquireAll {
        request,
        keys: keys.iter().map(|k| k.as_slice().into()).collect(),
        stopped_at: 0,
    };
    block_queued(ctx, &refs, timeout, tag, kind)
}

/// A multi-lock waiter's turn: granted every key at once when it heads all their queues and
/// each lock is free (or already its own); otherwise it keeps waiting, holding nothing.
///
/// Redis calls this once for every key of the waiter that is signalled, and a grant to the
/// waiter ahead of it signals each of its keys: looking at every key each time would cost K x K
/// for K keys. The look starts at the key that kept the waiter out the last time, which most
/// often still does: such a call costs O(1), and a full look O(K).
fn serve_all(ctx: &Context, tag: &Tag) -> Option<CommandResult> {
    let db = tag.key.0;
    let count = 1 + tag.also.len();
    let key_at = |i: usize| -> &[u8] {
        match i.checked_sub(1) {
            None => &tag.key.1,
            Some(other) => tag.also.get(other).map_or(&tag.key.1, |k| &**k),
        }
    };
    let start = waiters::queues().stopped_at(tag) % count;
    let token = waiters::queues().token_of(tag)?;
    let now = now_ms();
    let mut opened = Vec::with_capacity(count);
    for step in 0..count {
        let i = (start + step) % count;
        let key = key_at(i);
        if !waiters::queues().is_head(db, key, tag.id) {
            drop_lapsed_heads(db, key);
            if !waiters::queues().is_head(db, key, tag.id) {
                waiters::queues().set_stopped_at(tag, i);
                return None;
            }
        }
        let name = key_string(ctx, key);
        let handle = ctx.open_key_writable(&name);
        match in_key_mut(&handle) {
            Ok(Some(stored)) => {
                expire_overdue(ctx, &name, stored, now);
                let lock = stored.lock();
                let own = lock.live_holder(now).is_some_and(|h| *h.token() == token);
                if !own && !lock.is_available(now) {
                    waiters::queues().set_stopped_at(tag, i);
                    return None;
                }
                // A key that became a semaphore meanwhile: the error is the answer, and the
                // waiters behind it on every key get their turn.
                if let Err(refused) = lock.admit(&exclusive(token), now) {
                    waiters::remove(tag)?;
                    signal_keys(ctx, tag);
                    return Some(Err(refused.into()));
                }
            }
            Ok(None) => {}
            // Another type took a name: keep waiting for it to become a lock again.
            Err(_) => {
                waiters::queues().set_stopped_at(tag, i);
                return None;
            }
        }
        opened.push((i, name, handle));
    }
    // Granted in the order the call named the keys: its reply lists their fences so.
    opened.sort_unstable_by_key(|(i, _, _)| *i);
    let waiter = waiters::remove(tag)?;
    let Kind::AcquireAll { request, .. } = &waiter.kind else {
        return None;
    };
    let grant = request.grant();
    let waited = u64::try_from(waiter.since.elapsed().as_micros()).unwrap_or(u64::MAX);
    metrics::ACQUIRE_WAIT.record(waited);
    let mut fences = Vec::with_capacity(count);
    for (_, name, key) in &opened {
        match grant_key(ctx, key, name, &grant, now) {
            Ok((fence, lock_id, _)) => {
                if request.session {
                    sessions::claim(
                        (db, name.as_slice().into()),
                        request.client,
                        request.token,
                        lock_id,
                    );
                }
                metrics::ACQUIRED.incr();
                policy::tally(name.as_slice(), Stat::Acquired, 1);
                fences.push(RedisValue::Integer(fence_reply(fence)));
            }
            Err(error) => return Some(Err(error)),
        }
    }
    Some(Ok(RedisValue::Array(fences)))
}

/// Serves the queues whose locks had room (see `waiters::signal_ready`): each single-key acquirer
/// at the head of a queue that can be granted now is granted and unblocked with its fence, in
/// queue order, until the head has to wait. Runs at the end of every command and timer callback
/// (see `host::set_after_call`), where grants may be written and replicated.
pub fn serve_ready(ctx: &Context) {
    if !waiters::any_ready() {
        return;
    }
    if in_multi_or_script(ctx) {
        // Not in the middle of a transaction or script: on the next event-loop turn.
        waiters::serve_later(ctx, 0);
        return;
    }
    if avoid_replica_traffic() || is_loading(ctx) {
        // Paused clients (no grant may be replicated now), or a load under way: shortly.
        waiters::serve_later(ctx, 10);
        return;
    }
    if !is_primary(ctx) {
        // A replica grants nothing (a demoted primary's waiters were answered already).
        while waiters::next_ready().is_some() {}
        return;
    }
    let original = selected_db(ctx);
    guarded((), || {
        while let Some((db, name)) = waiters::next_ready() {
            if select_db(ctx, db) {
                serve_queue(ctx, db, &name);
            }
        }
    });
    select_db(ctx, original);
}

/// Grants the head of `name`'s queue (in the selected database `db`) and those after it, while
/// they are single-key acquirers the lock has room for.
fn serve_queue(ctx: &Context, db: i32, name: &[u8]) {
    loop {
        drop_lapsed_heads(db, name);
        let head = waiters::queues()
            .single_head(db, name)
            .map(|(id, handle)| (id, *handle));
        let Some((id, handle)) = head else {
            // A multi-lock waiter at the head (or nobody): Redis serves the clients blocked on
            // the key, right after this command or timer callback.
            if waiters::queues().acquirers_on(db, name) > 0 {
                keys::signal_ready(ctx, &key_string(ctx, name));
            }
            return;
        };
        let tag = Tag {
            id,
            key: (db, name.into()),
            watch: None,
            also: Vec::new(),
        };
        // `None`: the head waits on (the lock is busy, or its grant waits for a timer).
        let Some(outcome) = serve_head(ctx, &tag) else {
            return;
        };
        waiters::end_wait(id, handle, Ending::Answered(outcome.map(fence_reply)));
    }
}

fn serve(ctx: &Context, tag: &Tag) -> Option<CommandResult> {
    if waiters::queues().has_lapsed(tag, Instant::now()) {
        // Its wait ran out before the server answered it: a timeout, never a grant.
        let was_head = heads_a_queue(tag);
        waiters::remove(tag);
        settle_others(ctx, tag, was_head);
        return Some(Ok(timed_out(tag)));
    }
    if !tag.also.is_empty() {
        return serve_all(ctx, tag);
    }
    if let Some(waited_on) = tag.watch {
        return serve_watcher(ctx, tag, waited_on);
    }
    let (db, name) = &tag.key;
    // An acquirer that is not the head of its queue waits on, before anything else (no key
    // opened): Redis offers a signalled key to every multi-lock waiter blocked on it.
    if !waiters::queues().is_head(*db, name, tag.id) {
        return None;
    }
    // LOCK.MACQUIRE of a single key: a multi-lock waiter all the same.
    if waiters::queues().is_multi(tag) {
        return serve_all(ctx, tag);
    }
    serve_head(ctx, tag).map(|outcome| outcome.map(|fence| RedisValue::Integer(fence_reply(fence))))
}

/// A `LOCK.WAIT` watcher of the grant with fence `waited_on`: answered 1 when every holder up to
/// that fence has gone.
fn serve_watcher(ctx: &Context, tag: &Tag, waited_on: u64) -> Option<CommandResult> {
    let key = ctx.open_key_writable(&key_string(ctx, &tag.key.1));
    let Ok(Some(stored)) = in_key_mut(&key) else {
        // Another type took the name: keep waiting for it to become a lock again.
        return None;
    };
    let over = stored
        .lock()
        .live_holders(now_ms())
        .all(|(fence, _)| fence > waited_on);
    (over && waiters::remove(tag).is_some()).then_some(Ok(RedisValue::Integer(1)))
}

/// The single-key acquirer `tag` at the head of its queue: granted what it asked for when the
/// lock has room (its fence, or why it can never have one); `None` keeps it waiting.
fn serve_head(ctx: &Context, tag: &Tag) -> Option<Result<u64, LockError>> {
    let (db, name) = &tag.key;
    let now = now_ms();
    let key_name = key_string(ctx, name);
    let key = ctx.open_key_writable(&key_name);
    let stored = match in_key_mut(&key) {
        Ok(Some(stored)) => stored,
        // Another type took the name: keep waiting for it to become a lock again.
        _ => return None,
    };
    expire_overdue(ctx, &key_name, stored, now);
    // Held in a way that excludes the head, or in a lock-delay (the lease timer hands it over
    // when that ends). A request that can never be granted gets its error.
    match head_admitted(stored, tag, now) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(error) => {
            waiters::remove(tag)?;
            return Some(Err(error));
        }
    }
    if waiters::queues().head_syncs(*db, name) {
        // A reply callback that writes must answer (Redis 7.0 propagates its writes only then),
        // and this answer has to wait for replicas: grant from a timer instead. The waiter stays
        // at the head meanwhile, so nobody overtakes it.
        grant_later(ctx, tag);
        return None;
    }
    let granted = grant_head(ctx, &key_name, stored, tag, now)?;
    // A shared grant may leave room for the next waiter too: the run of shared requests at the
    // head of the queue is granted together.
    if stored.lock().has_room(now) && waiters::queued(ctx, &key_name) {
        waiters::signal_ready(ctx, &key_name);
    }
    Some(granted.outcome)
}

/// An exclusive request of `token` (what a multi-lock waiter asks of each key).
fn exclusive(token: core::TokenDigest) -> core::Request<'static> {
    core::Request {
        token,
        ttl: 0,
        reentrant: false,
        session: false,
        delay: 0,
        mode: Mode::Exclusive,
        provisional: false,
        client: 0,
        connection: b"",
        label: b"",
    }
}

/// True when the queued acquirer `tag` may be granted what it asked for now, an error when it
/// never can be.
fn head_admitted(stored: &Stored, tag: &Tag, now: u64) -> Result<bool, LockError> {
    let (db, name) = &tag.key;
    let queues = waiters::queues();
    let Some(request) = queues.request_of(*db, name, tag.id) else {
        return Ok(false);
    };
    match stored.lock().admit(&request.grant(), now)? {
        Admit::Busy => Ok(false),
        Admit::New | Admit::Refresh | Admit::Downgrade => Ok(true),
    }
}

/// A grant to the head of a queue.
struct HeadGrant {
    waiter: Waiter<BlockedClient>,
    /// The fence, or why there is none.
    outcome: Result<u64, LockError>,
    /// A new grant (not a refresh of the waiter's own).
    new: bool,
}

/// Takes waiter `tag`, the head of the queue of the free lock `stored`, off its queue and grants
/// it what it asked for (announced, replicated, its session claimed).
fn grant_head(
    ctx: &Context,
    key_name: &RedisString,
    stored: &mut Stored,
    tag: &Tag,
    now: u64,
) -> Option<HeadGrant> {
    let head = waiters::remove(tag)?;
    let Kind::Acquire(request) = &head.kind else {
        return None;
    };
    let lock_id = stored.id();
    if request.reentrant {
        // A REENTRANT acquire that queued before its token held the lock is held to the
        // namespace's max-reentrancy when it is served (in enforce mode: the client here is
        // not the waiter, so warn mode has no one to name).
        let holds = stored.lock().hold_count(&request.token, now);
        if holds > 0 {
            if let Err(refused) =
                policy::admit_reentrant(ctx, key_name, Judging::EnforceOnly, holds)
            {
                return Some(HeadGrant {
                    waiter: head,
                    outcome: Err(refused),
                    new: false,
                });
            }
        }
    }
    let outcome = grant_stored(ctx, key_name, stored, &request.grant(), now);
    let (outcome, new) = match outcome {
        Ok(
            grant @ (Acquire::Granted { fence }
            | Acquire::Refreshed { fence }
            | Acquire::Downgraded { fence }),
        ) => {
            if request.session {
                sessions::claim(tag.key.clone(), request.client, request.token, lock_id);
            }
            let waited = u64::try_from(head.since.elapsed().as_micros()).unwrap_or(u64::MAX);
            metrics::ACQUIRE_WAIT.record(waited);
            metrics::ACQUIRED.incr();
            policy::tally(key_name.as_slice(), Stat::Acquired, 1);
            (Ok(fence), matches!(grant, Acquire::Granted { .. }))
        }
        Ok(Acquire::Busy) => return None,
        Err(refused) => (Err(refused.into()), false),
    };
    Some(HeadGrant {
        waiter: head,
        outcome,
        new,
    })
}

/// Heads of queues that asked for SYNC, to be granted from a timer (see `serve`).
static LATER: Mutex<Vec<Tag>> = Mutex::new(Vec::new());
static LATER_TIMER: timer::Single = timer::Single::new();

fn later() -> MutexGuard<'static, Vec<Tag>> {
    locked(&LATER)
}

fn grant_later(ctx: &Context, tag: &Tag) {
    let mut later = later();
    if !later.contains(tag) {
        later.push(tag.clone());
    }
    LATER_TIMER.arm(ctx, 0, grant_deferred);
}

/// The timer: grants each SYNC head still at the head of a free lock, then waits for replicas
/// before answering it.
fn grant_deferred(ctx: &Context) {
    LATER_TIMER.fired();
    if avoid_replica_traffic() {
        // Paused clients: no grant may be replicated now; try again shortly.
        LATER_TIMER.arm(ctx, 10, grant_deferred);
        return;
    }
    let tags = std::mem::take(&mut *later());
    let original = selected_db(ctx);
    let now = now_ms();
    for tag in tags {
        let (db, name) = &tag.key;
        if !select_db(ctx, *db) {
            continue;
        }
        let key_name = key_string(ctx, name);
        let key = ctx.open_key_writable(&key_name);
        let Ok(Some(stored)) = in_key_mut(&key) else {
            continue;
        };
        expire_overdue(ctx, &key_name, stored, now);
        drop_lapsed_heads(*db, name);
        if !waiters::queues().is_head(*db, name, tag.id)
            || !head_admitted(stored, &tag, now).unwrap_or(true)
        {
            continue;
        }
        let Some(granted) = grant_head(ctx, &key_name, stored, &tag, now) else {
            continue;
        };
        // Room left (readers, permits): the next waiters' turn.
        if stored.lock().has_room(now) && waiters::queued(ctx, &key_name) {
            waiters::signal_ready(ctx, &key_name);
        }
        let Kind::Acquire(request) = &granted.waiter.kind else {
            continue;
        };
        match (granted.outcome, request.sync) {
            (Ok(fence), Some(sync)) => {
                let confirms = if granted.new {
                    Confirms::Grant {
                        token: request.token,
                        fence,
                    }
                } else {
                    Confirms::Change
                };
                let reply = fence_reply(fence);
                acks::track(
                    ctx,
                    tag.id,
                    granted.waiter.handle,
                    tag.key.clone(),
                    confirms,
                    reply,
                    sync,
                );
            }
            (outcome, _) => {
                let answer = outcome.map(fence_reply);
                waiters::end_wait(tag.id, granted.waiter.handle, Ending::Answered(answer));
            }
        }
    }
    select_db(ctx, original);
}
