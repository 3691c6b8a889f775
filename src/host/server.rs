//! The server around a call: the clock, the selected database, the calling client and the
//! context's flags.

use std::ffi::CStr;

use redis_module::{raw, Context, ContextFlags, RedisString};

use crate::host::OK;

/// Wall-clock time in ms since the Unix epoch, as Redis sees it (0 before the module loaded).
pub fn now_ms() -> u64 {
    // SAFETY: Milliseconds takes no arguments and only reads the clock; its presence is checked.
    let ms = unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) };
    u64::try_from(ms).unwrap_or(0)
}

/// The database the context works on.
pub fn selected_db(ctx: &Context) -> i32 {
    // SAFETY: a valid context; the call only reads the client's db id.
    unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx.ctx)) }
}

/// Selects database `db` on the context; false when it does not exist.
pub fn select_db(ctx: &Context, db: i32) -> bool {
    // SAFETY: a valid context; Redis refuses ids out of range.
    unsafe { raw::RedisModule_SelectDb.is_some_and(|f| f(ctx.ctx, db) == OK) }
}

/// The id of the client running the command (0 for none).
pub fn client_id(ctx: &Context) -> u64 {
    // SAFETY: a valid context.
    unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)) }
}

/// True on a primary (not a replica).
pub fn is_primary(ctx: &Context) -> bool {
    ctx.get_flags().contains(ContextFlags::MASTER)
}

/// True on a Redis Cluster node.
pub fn is_cluster(ctx: &Context) -> bool {
    ctx.get_flags().contains(ContextFlags::CLUSTER)
}

/// True while the server loads an RDB file or the AOF (also a replica's full sync).
pub fn is_loading(ctx: &Context) -> bool {
    ctx.get_flags().contains(ContextFlags::LOADING)
}

/// True when the command comes from the primary or the AOF: limits meant for clients do not
/// apply to it.
pub fn is_replayed(ctx: &Context) -> bool {
    ctx.get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
}

/// True when the running command may block its client (not in MULTI, Lua, AOF loading or
/// replication).
pub fn may_block(ctx: &Context) -> bool {
    !ctx.get_flags().intersects(
        ContextFlags::DENY_BLOCKING
            | ContextFlags::MULTI
            | ContextFlags::LUA
            | ContextFlags::LOADING
            | ContextFlags::REPLICATED,
    )
}

/// Parses a strictly formatted integer (Redis' own rules: no sign but `-`, no spaces).
pub fn parse_integer(arg: &RedisString) -> Option<i64> {
    let mut value: i64 = 0;
    // SAFETY: a valid string and an out-pointer to a local.
    let status = unsafe { raw::RedisModule_StringToLongLong.map(|f| f(arg.inner, &mut value)) }?;
    (status == OK).then_some(value)
}

/// A key name as a Redis string, binary-safe (`Context::create_string` refuses NUL bytes).
pub fn key_string(ctx: &Context, key: &[u8]) -> RedisString {
    RedisString::create_from_slice(ctx.ctx, key)
}

/// Whether the server persists anything: the AOF is on (or being turned on), or RDB save points
/// are configured. Read from the context flags: no command runs, so nothing shows up in SLOWLOG,
/// MONITOR or INFO commandstats.
pub fn persistence(ctx: &Context) -> (bool, bool) {
    let flags = ctx.get_flags();
    (
        flags.contains(ContextFlags::AOF),
        flags.contains(ContextFlags::RDB),
    )
}

/// One field of an INFO section, as the server would print it (read without running INFO).
pub fn info_field(ctx: &Context, section: &CStr, field: &CStr) -> Option<String> {
    // SAFETY: reading the API table Redis filled in at load.
    let (get, field_of, free) = unsafe {
        (
            raw::RedisModule_GetServerInfo?,
            raw::RedisModule_ServerInfoGetFieldC?,
            raw::RedisModule_FreeServerInfo?,
        )
    };
    // SAFETY: a valid context and NUL-terminated names; the field's text is copied before the
    // info data is freed, and the data is freed exactly once.
    unsafe {
        let info = get(ctx.ctx, section.as_ptr());
        if info.is_null() {
            return None;
        }
        let value = field_of(info, field.as_ptr());
        let text = (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned());
        free(ctx.ctx, info);
        text
    }
}

/// What a primary knows of its replicas, read from INFO replication without running INFO: its
/// replication offset, and the offset each online replica has acknowledged.
pub fn replication_acks(ctx: &Context) -> Option<(i64, Vec<i64>)> {
    // SAFETY: reading the API table Redis filled in at load.
    let (get, signed, text, free) = unsafe {
        (
            raw::RedisModule_GetServerInfo?,
            raw::RedisModule_ServerInfoGetFieldSigned?,
            raw::RedisModule_ServerInfoGetFieldC?,
            raw::RedisModule_FreeServerInfo?,
        )
    };
    // SAFETY: a valid context and NUL-terminated names; every field is read (and its text
    // copied) before the info data is freed, exactly once.
    unsafe {
        let info = get(ctx.ctx, c"replication".as_ptr());
        if info.is_null() {
            return None;
        }
        let mut err: std::ffi::c_int = 0;
        let offset = signed(info, c"master_repl_offset".as_ptr(), &mut err);
        let ok = err == 0;
        let replicas = signed(info, c"connected_slaves".as_ptr(), &mut err).max(0);
        let mut acked = Vec::new();
        for n in 0..replicas {
            let Ok(name) = std::ffi::CString::new(format!("slave{n}")) else {
                continue;
            };
            let line = text(info, name.as_ptr());
            if line.is_null() {
                continue;
            }
            let line = CStr::from_ptr(line).to_string_lossy();
            if line.split(',').any(|f| f == "state=online") {
                if let Some(ack) = line
                    .split(',')
                    .find_map(|f| f.strip_prefix("offset="))
                    .and_then(|v| v.parse().ok())
                {
                    acked.push(ack);
                }
            }
        }
        free(ctx.ctx, info);
        ok.then_some((offset, acked))
    }
}

/// True inside MULTI/EXEC or a script (or function): Redis serves the clients blocked on keys
/// only after the whole transaction or script, and so does the module.
pub fn in_multi_or_script(ctx: &Context) -> bool {
    ctx.get_flags()
        .intersects(ContextFlags::MULTI | ContextFlags::LUA)
}

/// True while the server must not send anything of its own to replicas (CLIENT PAUSE, a
/// failover in progress): replicating then would break the failover or abort the server.
pub fn avoid_replica_traffic() -> bool {
    // SAFETY: the call only reads server state; its presence is checked.
    unsafe { raw::RedisModule_AvoidReplicaTraffic.is_some_and(|f| f() != 0) }
}

/// Copies a string the server handed over and frees it (once; null: empty).
///
/// # Safety
/// `string` is null or a live string created for `ctx` that nothing else frees.
unsafe fn take_string(ctx: &Context, string: *mut raw::RedisModuleString) -> Vec<u8> {
    if string.is_null() {
        return Vec::new();
    }
    let mut len = 0;
    // SAFETY: `string` is live (the caller's promise); its bytes are copied before it is freed,
    // exactly once, here.
    unsafe {
        let bytes = match raw::RedisModule_StringPtrLen {
            Some(ptr_len) => {
                let data = ptr_len(string, &mut len);
                if data.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(data.cast::<u8>(), len).to_vec()
                }
            }
            None => Vec::new(),
        };
        if let Some(free) = raw::RedisModule_FreeString {
            free(ctx.ctx, string);
        }
        bytes
    }
}

/// What operators see of a connected client: `addr name`, its address (`ip:port`, or the unix
/// socket's path) and its name (empty when none), separated by one space; empty when no such
/// client is connected (a fake client: AOF loading, the primary's link sees its own). A space
/// inside an address becomes `_`, so the two parts stay apart.
pub fn connection_of(ctx: &Context, client: u64) -> Vec<u8> {
    let mut info = raw::RedisModuleClientInfo {
        version: 1,
        flags: 0,
        id: 0,
        addr: [0; 46],
        port: 0,
        db: 0,
    };
    // SAFETY: a version-1 structure, which the server fills in; the pointer lives for the call.
    let found = unsafe {
        raw::RedisModule_GetClientInfoById.is_some_and(|get| {
            get(
                std::ptr::addr_of_mut!(info).cast::<std::ffi::c_void>(),
                client,
            ) == OK
        })
    };
    if client == 0 || !found {
        return Vec::new();
    }
    let addr_len = info
        .addr
        .iter()
        .position(|c| *c == 0)
        .unwrap_or(info.addr.len());
    let mut text: Vec<u8> = info.addr[..addr_len]
        .iter()
        .map(|c| match *c as u8 {
            b' ' => b'_',
            byte => byte,
        })
        .collect();
    if info.flags & u64::from(raw::REDISMODULE_CLIENTINFO_FLAG_UNIXSOCKET) == 0 {
        text.extend_from_slice(format!(":{}", info.port).as_bytes());
    }
    text.push(b' ');
    // SAFETY: a valid context; the name (null when the client has none, or the server lacks the
    // call) is copied and freed once.
    let name = unsafe {
        match raw::RedisModule_GetClientNameById {
            Some(get) => take_string(ctx, get(ctx.ctx, client)),
            None => Vec::new(),
        }
    };
    text.extend(name.into_iter().filter(|b| *b != b' '));
    text
}

/// The ACL user of a connected client (empty when unknown), for the audit log.
pub fn user_of(ctx: &Context, client: u64) -> Vec<u8> {
    // SAFETY: a valid context; the name is copied and freed once.
    unsafe {
        match raw::RedisModule_GetClientUserNameById {
            Some(get) => take_string(ctx, get(ctx.ctx, client)),
            None => Vec::new(),
        }
    }
}

/// True when a client with this id is connected now.
pub fn is_connected(client: u64) -> bool {
    let mut info = raw::RedisModuleClientInfo {
        version: 1,
        flags: 0,
        id: 0,
        addr: [0; 46],
        port: 0,
        db: 0,
    };
    // SAFETY: a version-1 structure, which the server fills in; the pointer lives for the call.
    client != 0
        && unsafe {
            raw::RedisModule_GetClientInfoById.is_some_and(|get| {
                get(
                    std::ptr::addr_of_mut!(info).cast::<std::ffi::c_void>(),
                    client,
                ) == OK
            })
        }
}
