//! Server events and keyspace notifications, decoded into [`ServerEvent`] and plain byte
//! strings for a [`Listener`].

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use redis_module::{raw, Context, RedisString};

use crate::host::{guarded, ERR, OK};

/// The server events the module listens to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// An RDB file, the AOF or a full sync finished loading.
    LoadingEnded,
    /// A replica with `repl-diskless-load swapdb` loads a full sync into databases aside while
    /// the old ones serve: the load started, was given up (the data aside is dropped), or
    /// completed (the loaded databases took the old ones' place, all at once, with no flush
    /// event; `LoadingEnded` follows).
    AsyncLoad(AsyncLoad),
    /// FLUSHDB (`Some(db)`) or FLUSHALL (`None`) is done.
    Flushed(Option<i32>),
    /// SWAPDB of these two databases is done.
    SwappedDbs(i32, i32),
    /// A child process was just forked (RDB save or AOF rewrite).
    ForkChildBorn,
    /// `CONFIG SET` changed something.
    ConfigChanged,
    /// The client with this id disconnected.
    ClientDisconnected(u64),
    /// Valkey's atomic slot migration: an import into this node started, completed or was
    /// aborted (job name, inclusive slot ranges).
    SlotImport(SlotImport, Vec<u8>, Vec<(u16, u16)>),
}

/// Where a replica's background load of a full sync stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncLoad {
    Started,
    Aborted,
    Completed,
}

/// Where an import of slots stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotImport {
    Started,
    Completed,
    Aborted,
}

/// Valkey 9's atomic slot migration event and its import subevents (valkeymodule.h). Redis gives
/// the same id another meaning: subscribe only on Valkey
/// ([`crate::host::api::ServerName::is_valkey`]).
pub const VALKEY_EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;
const VALKEY_SUBEVENT_IMPORT_STARTED: u64 = 0;
const VALKEY_SUBEVENT_IMPORT_ABORTED: u64 = 2;
const VALKEY_SUBEVENT_IMPORT_COMPLETED: u64 = 4;

/// What the module does on events. Keyspace notification callbacks must not write: defer
/// writes to a timer.
pub trait Listener {
    fn server_event(ctx: &Context, event: ServerEvent);
    /// `event` (e.g. `del`, `rename_to`) happened to `key` in the selected database.
    fn keyspace_event(ctx: &Context, event: &[u8], key: &RedisString);
}

#[repr(C)]
struct FlushInfo {
    version: u64,
    sync: i32,
    dbnum: i32,
}

#[repr(C)]
struct SwapDbInfo {
    version: u64,
    first: i32,
    second: i32,
}

/// ValkeyModuleSlotRange: one inclusive range of slots.
#[repr(C)]
struct SlotRange {
    start: c_int,
    end: c_int,
}

/// ValkeyModuleAtomicSlotMigrationInfoV1.
#[repr(C)]
struct SlotMigrationInfo {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

/// The head of RedisModuleClientInfoV1: enough to read the client id.
#[repr(C)]
struct ClientInfoHead {
    version: u64,
    flags: u64,
    id: u64,
}

/// Subscribes `L` to the server events above and to generic, expired and evicted keyspace
/// notifications; on Valkey (`valkey`) also to slot imports, where the server has them. Returns
/// whether it subscribed to slot imports.
pub fn subscribe<L: Listener>(ctx: &Context, valkey: bool) -> Result<bool, String> {
    // SAFETY: reading the API table Redis filled in at load.
    let (subscribe, keyspace) = unsafe {
        (
            raw::RedisModule_SubscribeToServerEvent.ok_or("no server events")?,
            raw::RedisModule_SubscribeToKeyspaceEvents.ok_or("no keyspace events")?,
        )
    };
    for id in [
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_REPL_ASYNC_LOAD,
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_CLIENT_CHANGE,
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_CONFIG,
    ] {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: a valid context and a plain callback function.
        if unsafe { subscribe(ctx.ctx, event, Some(server_event::<L>)) } == ERR {
            return Err(format!("cannot subscribe to server event {id}"));
        }
    }
    // A server without the event refuses the subscription (Valkey 8).
    let slot_imports = valkey && {
        let event = raw::RedisModuleEvent {
            id: VALKEY_EVENT_ATOMIC_SLOT_MIGRATION,
            dataver: 1,
        };
        // SAFETY: a valid context and a plain callback function.
        unsafe { subscribe(ctx.ctx, event, Some(server_event::<L>)) == OK }
    };
    let classes = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED;
    // SAFETY: a valid context and a plain callback function.
    if unsafe { keyspace(ctx.ctx, classes as c_int, Some(keyspace_event::<L>)) } == ERR {
        return Err("cannot subscribe to keyspace events".into());
    }
    Ok(slot_imports)
}

/// Decodes an event Redis reports; `None` for the ones the module ignores.
///
/// # Safety
/// `data` is null or points to the struct Redis documents for `event` and `subevent`.
unsafe fn decode(event: u64, subevent: u64, data: *mut c_void) -> Option<ServerEvent> {
    Some(match event {
        raw::REDISMODULE_EVENT_LOADING if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED => {
            ServerEvent::LoadingEnded
        }
        raw::REDISMODULE_EVENT_REPL_ASYNC_LOAD => ServerEvent::AsyncLoad(match subevent {
            raw::REDISMODULE_SUBEVENT_REPL_ASYNC_LOAD_STARTED => AsyncLoad::Started,
            raw::REDISMODULE_SUBEVENT_REPL_ASYNC_LOAD_ABORTED => AsyncLoad::Aborted,
            raw::REDISMODULE_SUBEVENT_REPL_ASYNC_LOAD_COMPLETED => AsyncLoad::Completed,
            _ => return None,
        }),
        raw::REDISMODULE_EVENT_FLUSHDB if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END => {
            // SAFETY: for FLUSHDB the data is a RedisModuleFlushInfo (or null), per the caller.
            let dbnum = unsafe { data.cast::<FlushInfo>().as_ref() }.map_or(-1, |i| i.dbnum);
            ServerEvent::Flushed((dbnum >= 0).then_some(dbnum))
        }
        raw::REDISMODULE_EVENT_SWAPDB => {
            // SAFETY: for SWAPDB the data is a RedisModuleSwapDbInfo, per the caller.
            let info = unsafe { data.cast::<SwapDbInfo>().as_ref() }?;
            ServerEvent::SwappedDbs(info.first, info.second)
        }
        raw::REDISMODULE_EVENT_FORK_CHILD
            if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN =>
        {
            ServerEvent::ForkChildBorn
        }
        raw::REDISMODULE_EVENT_CONFIG => ServerEvent::ConfigChanged,
        raw::REDISMODULE_EVENT_CLIENT_CHANGE
            if subevent == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED =>
        {
            // SAFETY: for client changes the data is a RedisModuleClientInfo, per the caller.
            let info = unsafe { data.cast::<ClientInfoHead>().as_ref() }?;
            ServerEvent::ClientDisconnected(info.id)
        }
        VALKEY_EVENT_ATOMIC_SLOT_MIGRATION => {
            let phase = match subevent {
                VALKEY_SUBEVENT_IMPORT_STARTED => SlotImport::Started,
                VALKEY_SUBEVENT_IMPORT_COMPLETED => SlotImport::Completed,
                VALKEY_SUBEVENT_IMPORT_ABORTED => SlotImport::Aborted,
                _ => return None,
            };
            // SAFETY: for this event the data is a ValkeyModuleAtomicSlotMigrationInfoV1 (or
            // null), per the caller; its array holds `num_slot_ranges` ranges.
            let info = unsafe { data.cast::<SlotMigrationInfo>().as_ref() }?;
            let job = info
                .job_name
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            let ranges = if info.slot_ranges.is_null() {
                Vec::new()
            } else {
                // SAFETY: non-null, with `num_slot_ranges` elements, valid during the callback.
                unsafe {
                    std::slice::from_raw_parts(info.slot_ranges, info.num_slot_ranges as usize)
                }
                .iter()
                .filter_map(|r| Some((u16::try_from(r.start).ok()?, u16::try_from(r.end).ok()?)))
                .collect()
            };
            ServerEvent::SlotImport(phase, job, ranges)
        }
        _ => return None,
    })
}

extern "C" fn server_event<L: Listener>(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guarded((), || {
        // SAFETY: Redis passes the data documented for this event.
        if let Some(event) = unsafe { decode(event.id, subevent, data) } {
            L::server_event(&Context::new(ctx), event);
        }
    });
}

/// What runs just before each event-loop sleep (see [`on_before_sleep`]).
static BEFORE_SLEEP: OnceLock<fn(&Context)> = OnceLock::new();

/// Runs `hook` on every turn of the event loop, just before it sleeps: after the turn's
/// commands (and what they replicated) and before Redis serves unblocked clients and writes
/// replies and the replication stream out. The hook must return at once when it has nothing to
/// do. False when the server refuses the subscription.
pub fn on_before_sleep(ctx: &Context, hook: fn(&Context)) -> bool {
    let _ = BEFORE_SLEEP.set(hook);
    // SAFETY: reading the API table Redis filled in at load.
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToServerEvent }) else {
        return false;
    };
    let event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_EVENTLOOP,
        dataver: 1,
    };
    // SAFETY: a valid context and a plain callback function.
    unsafe { subscribe(ctx.ctx, event, Some(event_loop)) == OK }
}

/// What runs just after each event-loop sleep (see [`on_after_sleep`]).
static AFTER_SLEEP: OnceLock<fn(&Context)> = OnceLock::new();

/// Runs `hook` on every turn of the event loop, just after it slept: before the turn's events
/// (commands, timers) run, after the previous turn's replies and AOF write. Needs the
/// subscription [`on_before_sleep`] made (it shares it); the hook must return at once when it
/// has nothing to do.
pub fn on_after_sleep(hook: fn(&Context)) {
    let _ = AFTER_SLEEP.set(hook);
}

extern "C" fn event_loop(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guarded((), || {
        let hook = match subevent {
            raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP => BEFORE_SLEEP.get(),
            raw::REDISMODULE_SUBEVENT_EVENTLOOP_AFTER_SLEEP => AFTER_SLEEP.get(),
            _ => None,
        };
        if let Some(hook) = hook {
            hook(&Context::new(ctx));
        }
    });
}

/// Wakes the event loop from any thread (its turn then runs the sleep hooks); nothing happens
/// when the server lacks the API (the module's timers look soon enough).
pub fn wake_event_loop() {
    extern "C" fn nothing(_data: *mut c_void) {}
    // SAFETY: reading the API table Redis filled in at load; the function may be called from
    // any thread, with a callback that touches nothing.
    unsafe {
        if let Some(add) = raw::RedisModule_EventLoopAddOneShot {
            add(Some(nothing), std::ptr::null_mut());
        }
    }
}

extern "C" fn keyspace_event<L: Listener>(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    guarded(OK, || {
        if event.is_null() || key.is_null() {
            return OK;
        }
        // SAFETY: Redis passes a NUL-terminated event name and a key string valid for the call;
        // `ManuallyDrop` keeps the borrowed key from being freed by `RedisString`'s Drop.
        let (event, key) = unsafe {
            (
                CStr::from_ptr(event).to_bytes(),
                std::mem::ManuallyDrop::new(RedisString::from_redis_module_string(ctx, key)),
            )
        };
        L::keyspace_event(&Context::new(ctx), event, &key);
        OK
    })
}
