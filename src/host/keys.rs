//! What a command does to keys beside its reply: WATCH invalidation, keyspace notifications,
//! replication, redaction of arguments, waking clients blocked on a key, and walking the
//! values of one type in a database.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;

use redis_module::key::{KeyFlags, RedisKeyWritable};
use redis_module::native_types::RedisType;
use redis_module::{raw, Context, NotifyEvent, RedisString};

use crate::host::guarded;

/// Opens `key` only to look at its value, leaving no trace: its LRU/LFU is not touched, no
/// keyspace hit or miss is counted (write mode does not count them on Redis 7.0; NOEFFECTS
/// covers them on 7.2+, where it also keeps an expired key from being deleted by the lookup).
/// Closing it does not count as a modification (the module sets NO_IMPLICIT_SIGNAL_MODIFIED).
pub fn open_quietly(ctx: &Context, key: &RedisString) -> RedisKeyWritable {
    ctx.open_key_writable_with_flags(key, KeyFlags::NOTOUCH | KeyFlags::NOEFFECTS)
}

/// Counts the key as modified: WATCH fails, client-side caches are invalidated.
pub fn signal_modified(ctx: &Context, key: &RedisString) {
    // SAFETY: a valid context and key string for the duration of the call.
    unsafe {
        if let Some(signal) = raw::RedisModule_SignalModifiedKey {
            signal(ctx.ctx, key.inner);
        }
    }
}

/// Publishes keyspace event `event` of `class` on `key`: the module class (`d`) for the
/// `lock.*` events, the generic class (`g`) for what core commands publish too (`del`).
pub fn notify(ctx: &Context, class: NotifyEvent, event: &CStr, key: &RedisString) {
    // SAFETY: a valid context, a NUL-terminated event name and a live key string.
    unsafe {
        if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
            notify(ctx.ctx, class.bits(), event.as_ptr(), key.inner);
        }
    }
}

/// Replicates `command key state [token [who]]` (`holder`: none, the token, or the token and
/// who holds) to replicas and the AOF (inside the MULTI/EXEC Redis
/// wraps around everything one call replicates). Redis builds the argument strings itself.
pub fn replicate_key_state(
    ctx: &Context,
    command: &CStr,
    key: &RedisString,
    state: &[u8],
    holder: &[&[u8]],
) {
    // SAFETY: reading the API table Redis filled in at load.
    let Some(replicate) = (unsafe { raw::RedisModule_Replicate }) else {
        return;
    };
    // SAFETY: a valid context; the format ("s" = a RedisModuleString, "b" = pointer and length)
    // matches the arguments, and every pointer outlives the call (Redis copies them).
    unsafe {
        match *holder {
            [] => replicate(
                ctx.ctx,
                command.as_ptr(),
                c"sb".as_ptr(),
                key.inner,
                state.as_ptr(),
                state.len(),
            ),
            [token] => replicate(
                ctx.ctx,
                command.as_ptr(),
                c"sbb".as_ptr(),
                key.inner,
                state.as_ptr(),
                state.len(),
                token.as_ptr(),
                token.len(),
            ),
            [token, who, ..] => replicate(
                ctx.ctx,
                command.as_ptr(),
                c"sbbb".as_ptr(),
                key.inner,
                state.as_ptr(),
                state.len(),
                token.as_ptr(),
                token.len(),
                who.as_ptr(),
                who.len(),
            ),
        };
    }
}

/// Asks every replica to acknowledge its replication offset now (`REPLCONF GETACK *`, what WAIT
/// sends), instead of within the second it would anyway. Call it outside commands (a timer), so
/// that it travels on its own, and not while `server::avoid_replica_traffic()`.
pub fn request_replica_acks(ctx: &Context) {
    // SAFETY: reading the API table Redis filled in at load.
    let Some(replicate) = (unsafe { raw::RedisModule_Replicate }) else {
        return;
    };
    // SAFETY: a valid context; "A" keeps the command out of the AOF, "c" are C strings.
    unsafe {
        replicate(
            ctx.ctx,
            c"REPLCONF".as_ptr(),
            c"Acc".as_ptr(),
            c"GETACK".as_ptr(),
            c"*".as_ptr(),
        );
    }
}

/// Hides the argument at `pos` (a token) from SLOWLOG, MONITOR and the command log.
pub fn redact(ctx: &Context, pos: i32) {
    // SAFETY: a valid context; Redis checks `pos` against the argument count.
    unsafe {
        if let Some(redact) = raw::RedisModule_RedactClientCommandArgument {
            redact(ctx.ctx, pos);
        }
    }
}

/// Asks Redis to run the reply callbacks of the clients blocked on `key`, right after the
/// current command or callback.
pub fn signal_ready(ctx: &Context, key: &RedisString) {
    // SAFETY: a valid context and key string.
    unsafe {
        if let Some(signal) = raw::RedisModule_SignalKeyAsReady {
            signal(ctx.ctx, key.inner);
        }
    }
}

struct Scan<'a, V> {
    found: &'a mut dyn FnMut(&[u8], &V),
    raw_type: *mut raw::RedisModuleType,
}

extern "C" fn scan_one<V>(
    _ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    privdata: *mut c_void,
) {
    guarded((), || {
        if key.is_null() || privdata.is_null() {
            return;
        }
        // SAFETY: `privdata` is the `Scan` that `scan_values` passed, alive for the whole scan;
        // `key` and `name` are valid for this call; a module value of the scanned type is a
        // `V` (the type's values are created only as `V`).
        unsafe {
            let scan = &mut *privdata.cast::<Scan<V>>();
            let (Some(key_type), Some(get_type), Some(get_value)) = (
                raw::RedisModule_KeyType,
                raw::RedisModule_ModuleTypeGetType,
                raw::RedisModule_ModuleTypeGetValue,
            ) else {
                return;
            };
            if key_type(key) != raw::REDISMODULE_KEYTYPE_MODULE as c_int
                || get_type(key) != scan.raw_type
            {
                return;
            }
            let Some(value) = get_value(key).cast::<V>().as_ref() else {
                return;
            };
            (scan.found)(RedisString::string_as_slice(name), value);
        }
    });
}

/// Calls `found` with the name and value of every key of type `ty` in the selected database.
/// `V` must be the Rust type of that data type's values.
pub fn scan_values<V>(ctx: &Context, ty: &RedisType, mut found: impl FnMut(&[u8], &V)) {
    let mut scan = Scan::<V> {
        found: &mut found,
        raw_type: *ty.raw_type.borrow(),
    };
    // SAFETY: a valid context; the cursor is destroyed below; `scan` outlives the scan, which
    // runs synchronously.
    unsafe {
        let (Some(create), Some(run), Some(destroy)) = (
            raw::RedisModule_ScanCursorCreate,
            raw::RedisModule_Scan,
            raw::RedisModule_ScanCursorDestroy,
        ) else {
            return;
        };
        let cursor = create();
        let privdata = ptr::from_mut(&mut scan).cast::<c_void>();
        while run(ctx.ctx, cursor, Some(scan_one::<V>), privdata) != 0 {}
        destroy(cursor);
    }
}

/// A scan of the selected database's values of one type that goes on where it stopped, for work
/// done in slices across event-loop turns (see `service::deferred`). The server's scan visits
/// every key present from its start to its end at least once (some twice), whatever changes
/// meanwhile.
pub struct ValueScan {
    cursor: *mut raw::RedisModuleScanCursor,
}

// SAFETY: the cursor is only ever used on the main thread (timer callbacks); the scan is kept in
// a static between them, which needs `Send`.
unsafe impl Send for ValueScan {}

impl ValueScan {
    /// A scan from the start; `None` when the server offers no scan.
    pub fn new() -> Option<Self> {
        // SAFETY: reading the API table, then a call that takes no arguments.
        let cursor = unsafe { raw::RedisModule_ScanCursorCreate.map(|create| create())? };
        (!cursor.is_null()).then_some(ValueScan { cursor })
    }

    /// From the start again (of whichever database is selected when it next steps).
    pub fn restart(&mut self) {
        // SAFETY: a cursor this scan created and has not destroyed.
        unsafe {
            if let Some(restart) = raw::RedisModule_ScanCursorRestart {
                restart(self.cursor);
            }
        }
    }

    /// Takes one step of the scan of the selected database, calling `found` with the name and
    /// value of each key of type `ty` it meets. False once the database has been scanned to its
    /// end. `V` must be the Rust type of that data type's values.
    pub fn step<V>(
        &mut self,
        ctx: &Context,
        ty: &RedisType,
        mut found: impl FnMut(&[u8], &V),
    ) -> bool {
        let mut scan = Scan::<V> {
            found: &mut found,
            raw_type: *ty.raw_type.borrow(),
        };
        // SAFETY: a valid context and a live cursor; `scan` outlives the call, which runs its
        // callback synchronously.
        unsafe {
            let Some(run) = raw::RedisModule_Scan else {
                return false;
            };
            let privdata = ptr::from_mut(&mut scan).cast::<c_void>();
            run(ctx.ctx, self.cursor, Some(scan_one::<V>), privdata) != 0
        }
    }
}

impl Drop for ValueScan {
    fn drop(&mut self) {
        // SAFETY: a cursor this scan created, destroyed once.
        unsafe {
            if let Some(destroy) = raw::RedisModule_ScanCursorDestroy {
                destroy(self.cursor);
            }
        }
    }
}
