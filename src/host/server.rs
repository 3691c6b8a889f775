//! The server around a call: the clock, the selected database, the calling client and the
//! context's flags.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use redis_module::{raw, Context, ContextFlags, RedisString, RedisValue};

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

/// The running command's context (0: none), and its flags once read (see [`flags`]; above
/// `u32::MAX`: not read yet). Statics rather than thread-locals, which cost a call each in a
/// shared library: commands run on the main thread only, and any other thread's context is
/// another pointer.
static COMMAND_CTX: AtomicUsize = AtomicUsize::new(0);
static COMMAND_FLAGS: AtomicU64 = AtomicU64::new(UNREAD);
const UNREAD: u64 = u64::MAX;

/// A command's context flags are read at most once: every question about them during the
/// command (is it a replica, a script, MULTI, loading?) is answered from that read, where each
/// used to cost a call into the server. Nothing a command does changes them. Returns what to
/// hand to [`end_command`].
pub fn begin_command(ctx: &Context) -> (usize, u64) {
    (
        COMMAND_CTX.swap(ctx.ctx as usize, Ordering::Relaxed),
        COMMAND_FLAGS.swap(UNREAD, Ordering::Relaxed),
    )
}

/// The command [`begin_command`] began has returned: the one around it, if any, is current
/// again.
pub fn end_command((ctx, flags): (usize, u64)) {
    COMMAND_CTX.store(ctx, Ordering::Relaxed);
    COMMAND_FLAGS.store(flags, Ordering::Relaxed);
}

/// The running command's flags are read again the next time they are asked for (after it ran
/// another command).
pub fn forget_flags() {
    COMMAND_FLAGS.store(UNREAD, Ordering::Relaxed);
}

/// The flags of `ctx`: for the running command's context, read the first time they are asked
/// for; for any other (a callback's, a timer's), read now.
fn flags(ctx: &Context) -> ContextFlags {
    let current = COMMAND_CTX.load(Ordering::Relaxed) == ctx.ctx as usize;
    if current {
        if let Ok(bits) = u32::try_from(COMMAND_FLAGS.load(Ordering::Relaxed)) {
            return ContextFlags::from_bits_truncate(bits as i32);
        }
    }
    // SAFETY: a valid context; the call only reads the server's and the client's state.
    let bits = unsafe { raw::RedisModule_GetContextFlags.map_or(0, |f| f(ctx.ctx)) };
    if current {
        COMMAND_FLAGS.store(u64::from(bits as u32), Ordering::Relaxed);
    }
    ContextFlags::from_bits_truncate(bits)
}

/// The id of the client running the command (0 for none).
pub fn client_id(ctx: &Context) -> u64 {
    // SAFETY: a valid context.
    unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)) }
}

/// The id of the connection running the command, when it is one: 0 inside a script (Valkey 9
/// runs scripts through a client of its own that it lists as connected but that has no
/// connection, and asking the server for such a client's address crashes it) and for no client.
pub fn caller_id(ctx: &Context) -> u64 {
    if flags(ctx).contains(ContextFlags::LUA) {
        return 0;
    }
    client_id(ctx)
}

/// True on a primary (not a replica).
pub fn is_primary(ctx: &Context) -> bool {
    flags(ctx).contains(ContextFlags::MASTER)
}

/// True on a Redis Cluster node.
pub fn is_cluster(ctx: &Context) -> bool {
    flags(ctx).contains(ContextFlags::CLUSTER)
}

/// True while the server loads an RDB file or the AOF (also a replica's full sync).
pub fn is_loading(ctx: &Context) -> bool {
    flags(ctx).contains(ContextFlags::LOADING)
}

/// True when the command comes from the primary or the AOF: limits meant for clients do not
/// apply to it.
pub fn is_replayed(ctx: &Context) -> bool {
    flags(ctx).intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
}

/// True when the running command may block its client (not in MULTI, Lua, AOF loading or
/// replication).
pub fn may_block(ctx: &Context) -> bool {
    !flags(ctx).intersects(
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
    let flags = flags(ctx);
    (
        flags.contains(ContextFlags::AOF),
        flags.contains(ContextFlags::RDB),
    )
}

/// One INFO section, read without running INFO (nothing shows in SLOWLOG, MONITOR or
/// commandstats); freed when dropped.
struct InfoSection<'a> {
    ctx: &'a Context,
    data: std::ptr::NonNull<raw::RedisModuleServerInfoData>,
}

impl<'a> InfoSection<'a> {
    fn read(ctx: &'a Context, section: &CStr) -> Option<Self> {
        // SAFETY: reading the API table Redis filled in at load; a valid context and a
        // NUL-terminated name. The data is freed once, by Drop (which needs the free call:
        // without it nothing is read).
        unsafe {
            raw::RedisModule_FreeServerInfo?;
            let get = raw::RedisModule_GetServerInfo?;
            let data = std::ptr::NonNull::new(get(ctx.ctx, section.as_ptr()))?;
            Some(InfoSection { ctx, data })
        }
    }

    /// A field as a signed integer (`None`: missing or not a number).
    fn signed(&self, field: &CStr) -> Option<i64> {
        // SAFETY: reading the API table; live data and a NUL-terminated name.
        unsafe {
            let get = raw::RedisModule_ServerInfoGetFieldSigned?;
            let mut err: std::ffi::c_int = 0;
            let value = get(self.data.as_ptr(), field.as_ptr(), &mut err);
            (err == 0).then_some(value)
        }
    }

    /// A field's text, copied (`None`: missing).
    fn text(&self, field: &CStr) -> Option<String> {
        // SAFETY: reading the API table; live data and a NUL-terminated name; the text is
        // copied while the data lives.
        unsafe {
            let get = raw::RedisModule_ServerInfoGetFieldC?;
            let value = get(self.data.as_ptr(), field.as_ptr());
            (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
        }
    }
}

impl Drop for InfoSection<'_> {
    fn drop(&mut self) {
        // SAFETY: the data came from RedisModule_GetServerInfo and is freed exactly once;
        // `read` made sure the free call exists.
        unsafe {
            if let Some(free) = raw::RedisModule_FreeServerInfo {
                free(self.ctx.ctx, self.data.as_ptr());
            }
        }
    }
}

/// One field of an INFO section, as the server would print it (read without running INFO).
pub fn info_field(ctx: &Context, section: &CStr, field: &CStr) -> Option<String> {
    InfoSection::read(ctx, section)?.text(field)
}

/// What INFO persistence says of the AOF (read without running INFO).
#[derive(Clone, Copy, Debug)]
pub struct AofState {
    /// `appendonly yes` (or being switched on).
    pub enabled: bool,
    /// Nothing waits in the AOF buffer to be written.
    pub buffer_empty: bool,
    /// The last write succeeded.
    pub write_ok: bool,
}

/// The AOF's state (`None`: the server does not say).
pub fn aof_written(ctx: &Context) -> Option<AofState> {
    let info = InfoSection::read(ctx, c"persistence")?;
    Some(AofState {
        enabled: info.signed(c"aof_enabled") == Some(1),
        buffer_empty: info.signed(c"aof_buffer_length") == Some(0),
        write_ok: info.text(c"aof_last_write_status").as_deref() == Some("ok"),
    })
}

/// A configuration parameter's value, by `CONFIG GET` (`None` when there is no such parameter).
pub fn config_text(ctx: &Context, name: &str) -> Option<String> {
    match ctx.call("CONFIG", &["GET", name]) {
        Ok(RedisValue::Array(pair)) => match pair.get(1) {
            Some(RedisValue::SimpleString(value)) => Some(value.clone()),
            Some(RedisValue::BulkString(value)) => Some(value.clone()),
            Some(RedisValue::BulkRedisString(value)) => Some(value.to_string_lossy()),
            Some(RedisValue::StringBuffer(value)) => {
                Some(String::from_utf8_lossy(value).into_owned())
            }
            _ => None,
        },
        _ => None,
    }
}

/// What a primary knows of its replicas, read from INFO replication without running INFO: its
/// replication offset, and the offset each online replica has acknowledged.
pub fn replication_acks(ctx: &Context) -> Option<(i64, Vec<i64>)> {
    let info = InfoSection::read(ctx, c"replication")?;
    let offset = info.signed(c"master_repl_offset")?;
    let replicas = info.signed(c"connected_slaves").unwrap_or(0).max(0);
    let mut acked = Vec::new();
    for n in 0..replicas {
        let Ok(name) = std::ffi::CString::new(format!("slave{n}")) else {
            continue;
        };
        let Some(line) = info.text(&name) else {
            continue;
        };
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
    Some((offset, acked))
}

/// True inside a script or function (run by a client of the server's own, not a connection).
pub fn in_script(ctx: &Context) -> bool {
    flags(ctx).contains(ContextFlags::LUA)
}

/// True inside MULTI/EXEC or a script (or function): Redis serves the clients blocked on keys
/// only after the whole transaction or script, and so does the module.
pub fn in_multi_or_script(ctx: &Context) -> bool {
    flags(ctx).intersects(ContextFlags::MULTI | ContextFlags::LUA)
}

/// True while the server must not send anything of its own to replicas (CLIENT PAUSE, a
/// failover in progress): replicating then would break the failover or abort the server.
pub fn avoid_replica_traffic() -> bool {
    // SAFETY: the call only reads server state; its presence is checked.
    unsafe { raw::RedisModule_AvoidReplicaTraffic.is_some_and(|f| f() != 0) }
}

/// Appends the bytes of a string the server handed over to `out` (those `keep` accepts), and
/// frees the string (once; null: nothing).
///
/// # Safety
/// `string` is null or a live string created for `ctx` that nothing else frees.
unsafe fn append_string(
    ctx: &Context,
    string: *mut raw::RedisModuleString,
    out: &mut Vec<u8>,
    keep: impl Fn(u8) -> bool,
) {
    if string.is_null() {
        return;
    }
    let mut len = 0;
    // SAFETY: `string` is live (the caller's promise); its bytes are copied before it is freed,
    // exactly once, here.
    unsafe {
        if let Some(ptr_len) = raw::RedisModule_StringPtrLen {
            let data = ptr_len(string, &mut len);
            if !data.is_null() {
                let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len);
                out.extend(bytes.iter().copied().filter(|b| keep(*b)));
            }
        }
        if let Some(free) = raw::RedisModule_FreeString {
            free(ctx.ctx, string);
        }
    }
}

/// The address of a connected client as operators see it (`ip:port`, or the unix socket's
/// path; a space becomes `_`), asked of the server (a system call); `None` when no such client
/// is connected (or it is a fake one: AOF loading, the primary's link sees its own).
fn client_addr(client: u64) -> Option<Box<[u8]>> {
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
        return None;
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
    Some(text.into())
}

/// Addresses of connected clients already asked for (a client's address never changes): a
/// grant records its client's address without a system call each time. Entries leave when
/// their client disconnects ([`forget_client`]); the map is emptied should it ever grow past
/// [`ADDRS_MAX`] (a missed disconnect).
static ADDRS: Mutex<Option<ByClient<Box<[u8]>>>> = Mutex::new(None);
const ADDRS_MAX: usize = 100_000;

/// A map keyed by client id. The server hands out ids in sequence and no client picks its own,
/// so a multiply-and-shift hash spreads them well and no input can aim at one bucket: SipHash
/// cost more than the rest of the address lookup on every grant.
pub type ByClient<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// The hasher of [`ByClient`]: Fibonacci hashing of the one u64 it is given.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed here; anything else is folded in byte by byte all the same.
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(26);
    }
}

fn addrs() -> MutexGuard<'static, Option<ByClient<Box<[u8]>>>> {
    ADDRS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Client `client` disconnected: its address leaves the cache.
pub fn forget_client(client: u64) {
    if let Some(addrs) = addrs().as_mut() {
        addrs.remove(&client);
    }
}

/// Appends `addr name` to `out`: the address, a space, the client's current name (empty when
/// it has none) without spaces.
fn append_connection(ctx: &Context, client: u64, addr: &[u8], out: &mut Vec<u8>) {
    out.reserve(addr.len() + 1 + 16);
    out.extend_from_slice(addr);
    out.push(b' ');
    // SAFETY: a valid context; the name (null when the client has none, or the server lacks the
    // call) is copied and freed once.
    unsafe {
        if let Some(get) = raw::RedisModule_GetClientNameById {
            append_string(ctx, get(ctx.ctx, client), out, |b| b != b' ');
        }
    }
}

/// What a grant records of the client it is made to: `addr name`, its address (cached, see
/// [`ADDRS`]) and its current name; empty when no such client is connected. Only for the client
/// running the current command (see [`caller_id`]): a connection, never a script's client.
pub fn connection_of(ctx: &Context, client: u64) -> Vec<u8> {
    if client == 0 {
        return Vec::new();
    }
    let mut text = Vec::new();
    write_connection(ctx, client, &mut text);
    text
}

/// [`connection_of`], written into `out` (emptied first).
fn write_connection(ctx: &Context, client: u64, out: &mut Vec<u8>) {
    out.clear();
    if client == 0 {
        return;
    }
    let mut addrs = addrs();
    let addrs = addrs.get_or_insert_with(ByClient::default);
    if !addrs.contains_key(&client) {
        let Some(addr) = client_addr(client) else {
            return;
        };
        if addrs.len() >= ADDRS_MAX {
            addrs.clear();
        }
        addrs.insert(client, addr);
    }
    if let Some(addr) = addrs.get(&client) {
        append_connection(ctx, client, addr, out);
    }
}

thread_local! {
    /// The buffer a [`Connection`] is written into, handed back when it is dropped: recording
    /// a grant's connection allocates nothing once the first grant warmed it up.
    static SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// [`connection_of`] in a buffer reused from command to command (a nested one, should there
/// ever be, gets a buffer of its own).
pub struct Connection(Vec<u8>);

impl Connection {
    // Never inlined, so that `make bench-budget` can show what it costs a grant.
    #[inline(never)]
    pub fn of(ctx: &Context, client: u64) -> Connection {
        let mut text = SCRATCH.take();
        write_connection(ctx, client, &mut text);
        Connection(text)
    }

    /// The text, to change in place (a name cut to what a grant keeps).
    pub fn text_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

impl Deref for Connection {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let text = std::mem::take(&mut self.0);
        // An unusually long name leaves its buffer to the allocator.
        if text.capacity() <= 1024 {
            SCRATCH.set(text);
        }
    }
}

/// True when client `client` is connected now from `addr`, as far as grants have seen it: its
/// address is cached (see [`ADDRS`]) and the client has not disconnected since. Never asks the
/// server about an id (a client without a connection crashes that question on Valkey 9).
pub fn is_connected_at(client: u64, addr: &[u8]) -> bool {
    addrs()
        .as_ref()
        .and_then(|addrs| addrs.get(&client))
        .is_some_and(|cached| **cached == *addr)
}

/// The ACL user of a connected client (empty when unknown), for the audit log.
pub fn user_of(ctx: &Context, client: u64) -> Vec<u8> {
    let mut user = Vec::new();
    // SAFETY: a valid context; the name is copied and freed once.
    unsafe {
        if let Some(get) = raw::RedisModule_GetClientUserNameById {
            append_string(ctx, get(ctx.ctx, client), &mut user, |_| true);
        }
    }
    user
}
