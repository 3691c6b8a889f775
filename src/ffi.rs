//! Every `unsafe extern "C"` entry point Redis calls, and the raw registration calls.
//!
//! Each callback converts its pointers, then delegates to safe code inside `catch_unwind`: a
//! panic must never cross into Redis (it would abort the server and drop every client). A caught
//! panic becomes an `ERR` reply (commands) or a refusal (loading), plus a line in the server log
//! written by the panic hook.

use std::ffi::{c_char, c_int, c_longlong, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use redis_module::{logging, raw, Context, RedisString};

use crate::commands::{self, CommandResult};
use crate::config::NumericConfig;
use crate::datatype::{self, DecodeError, RdbReader, RdbWriter, Stored, LOCK_TYPE};
use crate::error::LockError;
use crate::waiting::{self, Handle, Tag};
use crate::{deferred, expiry, metrics, sessions};

const OK: c_int = raw::REDISMODULE_OK as c_int;
const ERR: c_int = raw::REDISMODULE_ERR as c_int;

/// Runs `f`, turning a panic into `fallback` (the panic hook has logged it).
fn guarded<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        logging::log_warning(format!(
            "lock module bug (caught, server kept running): {info}"
        ));
    }));
}

// ---------------------------------------------------------------------------------------------
// Module entry point

/// # Safety
/// Called by Redis with a valid context and argument vector.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // No allocation may happen before Init: the allocator is Redis'.
    let init = raw::Export_RedisModule_Init(
        ctx,
        crate::MODULE_NAME.as_ptr(),
        crate::MODULE_VERSION,
        raw::REDISMODULE_APIVER_1 as c_int,
    );
    if init == ERR {
        return ERR;
    }
    guarded(ERR, || {
        let context = Context::new(ctx);
        let args: Vec<Vec<u8>> = redis_module::decode_args(ctx, argv, argc)
            .iter()
            .map(|a| a.as_slice().to_vec())
            .collect();
        match crate::register(&context, &args) {
            Ok(()) => OK,
            Err(message) => {
                context.log_warning(&format!("lock module not loaded: {message}"));
                ERR
            }
        }
    })
}

pub fn set_module_options(ctx: &Context) {
    let options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
        | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
    // SAFETY: valid context.
    unsafe {
        if let Some(set) = raw::RedisModule_SetModuleOptions {
            set(ctx.ctx, options as c_int);
        }
    }
}

pub fn create_data_type(ctx: &Context) -> Result<(), String> {
    LOCK_TYPE.create_data_type(ctx.ctx).map_err(str::to_owned)
}

// ---------------------------------------------------------------------------------------------
// Commands

/// How a command touches its key (first argument), for key specs and ACL checks.
#[derive(Clone, Copy)]
pub enum KeyAccess {
    Read,
    ReadWrite,
    Update,
    Overwrite,
}

impl KeyAccess {
    fn flags(self) -> u64 {
        let f = |v: u32| u64::from(v);
        match self {
            KeyAccess::Read => f(raw::REDISMODULE_CMD_KEY_RO) | f(raw::REDISMODULE_CMD_KEY_ACCESS),
            KeyAccess::ReadWrite => {
                f(raw::REDISMODULE_CMD_KEY_RW)
                    | f(raw::REDISMODULE_CMD_KEY_ACCESS)
                    | f(raw::REDISMODULE_CMD_KEY_UPDATE)
            }
            KeyAccess::Update => {
                f(raw::REDISMODULE_CMD_KEY_RW) | f(raw::REDISMODULE_CMD_KEY_UPDATE)
            }
            KeyAccess::Overwrite => {
                f(raw::REDISMODULE_CMD_KEY_OW) | f(raw::REDISMODULE_CMD_KEY_UPDATE)
            }
        }
    }
}

#[derive(Clone, Copy)]
pub enum ArgKind {
    Key,
    String,
    Integer,
    PureToken,
}

/// One argument as COMMAND DOCS shows it.
#[derive(Clone, Copy)]
pub struct ArgDef {
    name: &'static CStr,
    kind: ArgKind,
    token: Option<&'static CStr>,
    flags: u32,
}

impl ArgDef {
    pub const fn new(name: &'static CStr, kind: ArgKind) -> Self {
        ArgDef {
            name,
            kind,
            token: None,
            flags: 0,
        }
    }
    pub const fn token(mut self, token: &'static CStr) -> Self {
        self.token = Some(token);
        self
    }
    pub const fn optional(mut self) -> Self {
        self.flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
        self
    }

    fn to_raw(self) -> raw::RedisModuleCommandArg {
        let type_ = match self.kind {
            ArgKind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
            ArgKind::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
            ArgKind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
            ArgKind::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
        };
        raw::RedisModuleCommandArg {
            name: self.name.as_ptr(),
            type_,
            key_spec_index: if matches!(self.kind, ArgKind::Key) {
                0
            } else {
                -1
            },
            token: self.token.map_or(ptr::null(), CStr::as_ptr),
            summary: ptr::null(),
            since: ptr::null(),
            flags: self.flags as c_int,
            deprecated_since: ptr::null(),
            subargs: ptr::null_mut(),
            display_text: ptr::null(),
        }
    }
}

/// One row of the module's command table.
pub struct CommandDef {
    pub name: &'static CStr,
    pub callback: unsafe extern "C" fn(
        *mut raw::RedisModuleCtx,
        *mut *mut raw::RedisModuleString,
        c_int,
    ) -> c_int,
    pub flags: &'static CStr,
    pub arity: c_int,
    /// How the command touches its key (always the first argument), if it has one.
    pub key: Option<KeyAccess>,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub args: &'static [ArgDef],
    /// ACL categories set where the server supports it (Redis 7.2+).
    pub acl: &'static CStr,
}

fn zeroed_arg() -> raw::RedisModuleCommandArg {
    // SAFETY: an all-zero argument (null pointers, zero ints) is the documented terminator.
    unsafe { std::mem::zeroed() }
}

fn zeroed_key_spec() -> raw::RedisModuleCommandKeySpec {
    // SAFETY: an all-zero key spec is the documented terminator.
    unsafe { std::mem::zeroed() }
}

/// Adds the module's ACL category where the server supports it (Redis 7.4+). Returns the
/// category when it was added.
pub fn add_acl_category(ctx: &Context, name: &'static CStr) -> Option<&'static CStr> {
    // SAFETY: valid context, NUL-terminated name; only allowed during OnLoad, which this is.
    let added = unsafe { raw::RedisModule_AddACLCategory.map(|add| add(ctx.ctx, name.as_ptr())) };
    (added == Some(OK)).then_some(name)
}

/// Registers one command with its documentation, key spec and ACL categories (the module's
/// `category` plus the command's own, where the server supports command categories: 7.2+).
pub fn create_command(
    ctx: &Context,
    def: &CommandDef,
    category: Option<&'static CStr>,
) -> Result<(), String> {
    let name = def.name.to_string_lossy();
    // SAFETY: valid context and NUL-terminated static strings; Redis copies what it keeps.
    unsafe {
        let create = raw::RedisModule_CreateCommand.ok_or("no CreateCommand")?;
        let first_key = c_int::from(def.key.is_some());
        if create(
            ctx.ctx,
            def.name.as_ptr(),
            Some(def.callback),
            def.flags.as_ptr(),
            first_key,
            first_key,
            first_key,
        ) == ERR
        {
            return Err(format!("cannot create command {name}"));
        }
        let get = raw::RedisModule_GetCommand.ok_or("no GetCommand")?;
        let command = get(ctx.ctx, def.name.as_ptr());
        if command.is_null() {
            return Err(format!("cannot find command {name}"));
        }
        let mut key_specs = [
            raw::RedisModuleCommandKeySpec {
                notes: ptr::null(),
                flags: def.key.map_or(0, KeyAccess::flags),
                begin_search_type:
                    raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
                bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
                    index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
                },
                find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
                fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
                    range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                        lastkey: 0,
                        keystep: 1,
                        limit: 0,
                    },
                },
            },
            zeroed_key_spec(),
        ];
        if def.key.is_none() {
            key_specs[0] = zeroed_key_spec();
        }
        let mut args: Vec<raw::RedisModuleCommandArg> =
            def.args.iter().map(|a| a.to_raw()).collect();
        args.push(zeroed_arg());
        let version = raw::RedisModuleCommandInfoVersion {
            version: 1,
            sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
            sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
            sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
        };
        let info = raw::RedisModuleCommandInfo {
            version: &version,
            summary: def.summary.as_ptr(),
            complexity: def.complexity.as_ptr(),
            since: crate::SINCE.as_ptr(),
            history: ptr::null_mut(),
            tips: ptr::null(),
            arity: def.arity,
            key_specs: key_specs.as_mut_ptr(),
            args: args.as_mut_ptr(),
        };
        let set_info = raw::RedisModule_SetCommandInfo.ok_or("no SetCommandInfo")?;
        if set_info(command, &info) == ERR {
            return Err(format!("cannot set command info of {name}"));
        }
        // Redis 7.2+; on 7.0 the README's ACL recipe names the command instead.
        if let Some(set_acl) = raw::RedisModule_SetCommandACLCategories {
            let categories: Vec<&str> = [category, Some(def.acl)]
                .into_iter()
                .flatten()
                .filter_map(|c| c.to_str().ok())
                .filter(|c| !c.is_empty())
                .collect();
            if !categories.is_empty() {
                let joined = CString::new(categories.join(" ")).map_err(|e| e.to_string())?;
                if set_acl(command, joined.as_ptr()) == ERR {
                    return Err(format!("cannot set ACL categories of {name}"));
                }
            }
        }
    }
    Ok(())
}

/// The command's arguments as strings borrowed from Redis for the call: no retain, no free
/// (`ManuallyDrop` keeps `RedisString`'s Drop from freeing what Redis owns).
fn borrowed_args(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> Vec<std::mem::ManuallyDrop<RedisString>> {
    let count = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() || count == 0 {
        return Vec::new();
    }
    // SAFETY: Redis passes argc valid strings that live until the command returns.
    let raw_args = unsafe { std::slice::from_raw_parts(argv, count) };
    raw_args
        .iter()
        .map(|&arg| std::mem::ManuallyDrop::new(RedisString::from_redis_module_string(ctx, arg)))
        .collect()
}

fn run_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: fn(&Context, &[RedisString]) -> CommandResult,
) -> c_int {
    let context = Context::new(ctx);
    let outcome = guarded(Err(LockError::Internal), || {
        let args = borrowed_args(ctx, argv, argc);
        // SAFETY: ManuallyDrop<RedisString> is repr(transparent) over RedisString.
        let args: &[RedisString] =
            unsafe { std::slice::from_raw_parts(args.as_ptr().cast(), args.len()) };
        handler(&context, args)
    });
    reply_or_fallback(&context, outcome);
    OK
}

/// Sends the reply; if building it fails (a bug), still answers the client with an error so it
/// never waits for a reply that will not come.
fn reply_or_fallback(context: &Context, outcome: CommandResult) {
    let replied = guarded(false, || {
        context.reply(outcome.map_err(Into::into));
        true
    });
    if !replied {
        // SAFETY: valid context; static NUL-terminated message.
        unsafe {
            if let Some(reply_error) = raw::RedisModule_ReplyWithError {
                reply_error(
                    context.ctx,
                    c"ERR internal error in the lock module; details are in the server log"
                        .as_ptr(),
                );
            }
        }
    }
}

macro_rules! command_entry {
    ($name:ident, $handler:path) => {
        /// # Safety
        /// Called by Redis with a valid context and argument vector.
        pub unsafe extern "C" fn $name(
            ctx: *mut raw::RedisModuleCtx,
            argv: *mut *mut raw::RedisModuleString,
            argc: c_int,
        ) -> c_int {
            run_command(ctx, argv, argc, $handler)
        }
    };
}

command_entry!(cmd_acquire, commands::acquire);
command_entry!(cmd_release, commands::release);
command_entry!(cmd_renew, commands::renew);
command_entry!(cmd_fence, commands::fence);
command_entry!(cmd_info, commands::info);
command_entry!(cmd_force_release, commands::force_release);
command_entry!(cmd_apply, commands::apply);
command_entry!(cmd_wait, commands::wait);
command_entry!(cmd_floor, commands::floor);

// ---------------------------------------------------------------------------------------------
// Blocked clients

/// Blocks the client of `ctx` on `key` for at most `timeout_ms` (0: no limit).
pub fn block_on_key(ctx: &Context, key: &RedisString, timeout_ms: u64, tag: Tag) -> Option<Handle> {
    let timeout = c_longlong::try_from(timeout_ms).unwrap_or(c_longlong::MAX);
    let privdata = Box::into_raw(Box::new(tag));
    let mut keys = [key.inner];
    // SAFETY: valid context and key; privdata is freed by `wait_free` (or below on failure).
    unsafe {
        let (Some(block), Some(on_disconnect)) = (
            raw::RedisModule_BlockClientOnKeys,
            raw::RedisModule_SetDisconnectCallback,
        ) else {
            drop(Box::from_raw(privdata));
            return None;
        };
        let handle = block(
            ctx.ctx,
            Some(wait_ready),
            Some(wait_ended),
            Some(wait_free),
            timeout,
            keys.as_mut_ptr(),
            1,
            privdata.cast(),
        );
        if handle.is_null() {
            drop(Box::from_raw(privdata));
            return None;
        }
        on_disconnect(handle, Some(wait_disconnected));
        Some(Handle(handle))
    }
}

unsafe fn tag_of<'a>(ctx: *mut raw::RedisModuleCtx) -> Option<&'a Tag> {
    let privdata = raw::RedisModule_GetBlockedClientPrivateData?(ctx);
    privdata.cast::<Tag>().as_ref()
}

/// Redis runs this for each client blocked on a key signalled as ready, in arrival order:
/// the head acquirer of a free lock is granted it here and answered at once.
unsafe extern "C" fn wait_ready(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let served = guarded(None, || {
        tag_of(ctx).and_then(|tag| commands::serve_waiter(&context, tag))
    });
    match served {
        Some(reply) => {
            reply_or_fallback(&context, reply);
            OK
        }
        None => ERR,
    }
}

/// Timeout, CLIENT UNBLOCK, or a watcher woken by the module (see `waiting::wake_watcher`).
unsafe extern "C" fn wait_ended(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let reply = guarded(Err(LockError::Internal), || match tag_of(ctx) {
        Some(tag) => commands::on_wait_ended(tag),
        None => Err(LockError::Internal),
    });
    reply_or_fallback(&context, reply);
    OK
}

unsafe extern "C" fn wait_free(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    guarded((), || {
        if !privdata.is_null() {
            let tag = Box::from_raw(privdata.cast::<Tag>());
            waiting::remove(&tag);
            waiting::take_woken(tag.id);
        }
    });
}

unsafe extern "C" fn wait_disconnected(
    _ctx: *mut raw::RedisModuleCtx,
    handle: *mut raw::RedisModuleBlockedClient,
) {
    guarded((), || {
        waiting::remove_handle(Handle(handle));
    });
}

/// # Safety
/// Called by Redis with a valid context.
pub unsafe extern "C" fn deferred_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guarded((), || deferred::run(&Context::new(ctx)));
}

// ---------------------------------------------------------------------------------------------
// Configs

pub fn register_config(
    ctx: &Context,
    config: &'static NumericConfig,
    default: i64,
) -> Result<(), String> {
    let name = CString::new(config.name).map_err(|e| e.to_string())?;
    // SAFETY: valid context; privdata is a 'static config that outlives the module.
    let status = unsafe {
        let register = raw::RedisModule_RegisterNumericConfig.ok_or("no RegisterNumericConfig")?;
        register(
            ctx.ctx,
            name.as_ptr(),
            default,
            raw::REDISMODULE_CONFIG_DEFAULT,
            config.min,
            config.max,
            Some(config_get),
            Some(config_set),
            None,
            ptr::from_ref(config).cast_mut().cast(),
        )
    };
    if status == ERR {
        return Err(format!("cannot register config lock.{}", config.name));
    }
    Ok(())
}

pub fn load_configs(ctx: &Context) -> Result<(), String> {
    // SAFETY: valid context.
    let status = unsafe { raw::RedisModule_LoadConfigs.map_or(OK, |load| load(ctx.ctx)) };
    if status == ERR {
        return Err("cannot load configs".into());
    }
    Ok(())
}

extern "C" fn config_get(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    // SAFETY: privdata is the &'static NumericConfig given at registration.
    let config = unsafe { &*privdata.cast::<NumericConfig>() };
    config.get()
}

extern "C" fn config_set(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in config_get. Redis has already checked the bounds.
    let config = unsafe { &*privdata.cast::<NumericConfig>() };
    config
        .value
        .store(value, std::sync::atomic::Ordering::Relaxed);
    OK
}

// ---------------------------------------------------------------------------------------------
// INFO

pub fn register_info(ctx: &Context) -> Result<(), String> {
    // SAFETY: valid context.
    let status = unsafe {
        raw::RedisModule_RegisterInfoFunc.ok_or("no RegisterInfoFunc")?(ctx.ctx, Some(info))
    };
    if status == ERR {
        return Err("cannot register INFO section".into());
    }
    Ok(())
}

extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guarded((), || {
        // SAFETY: valid info context; names are NUL-terminated.
        unsafe {
            let (Some(section), Some(field)) = (
                raw::RedisModule_InfoAddSection,
                raw::RedisModule_InfoAddFieldLongLong,
            ) else {
                return;
            };
            section(ctx, c"".as_ptr());
            let warnings = [
                (
                    "warning_eviction_policy",
                    i64::from(crate::safety::eviction_risk()),
                ),
                (
                    "warning_no_persistence",
                    i64::from(crate::safety::no_persistence()),
                ),
            ];
            for (name, value) in metrics::fields().into_iter().chain(warnings) {
                if let Ok(name) = CString::new(name) {
                    field(ctx, name.as_ptr(), value);
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The data type

struct Io(*mut raw::RedisModuleIO);

impl RdbReader for Io {
    fn unsigned(&mut self) -> Option<u64> {
        raw::load_unsigned(self.0).ok()
    }
    fn buffer(&mut self) -> Option<Vec<u8>> {
        raw::load_string_buffer(self.0)
            .ok()
            .map(|b| b.as_ref().to_vec())
    }
}

impl RdbWriter for Io {
    fn unsigned(&mut self, value: u64) {
        raw::save_unsigned(self.0, value);
    }
    fn buffer(&mut self, value: &[u8]) {
        raw::save_slice(self.0, value);
    }
}

/// # Safety
/// Called by Redis with a valid IO handle.
pub unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guarded(ptr::null_mut(), || {
        match datatype::load(encver, &mut Io(rdb)) {
            Ok(lock) => Box::into_raw(Box::new(Stored::new(lock))).cast(),
            Err(error) => {
                let why = match error {
                    DecodeError::NewerVersion(v) => {
                        format!(
                            "encoding version {v} is newer than this module's {}",
                            datatype::ENCODING_VERSION
                        )
                    }
                    DecodeError::ShortRead => "the input ended early".into(),
                    DecodeError::Invalid(what) => format!("invalid value: {what}"),
                };
                logging::log_warning(format!("lock module cannot load a lock: {why}"));
                ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `value` is a `Stored` this module created.
pub unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guarded((), || {
        let stored = &*value.cast::<Stored>();
        datatype::save(stored.lock(), &mut Io(rdb));
    });
}

/// # Safety
/// `value` is a `Stored` this module created.
pub unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guarded((), || {
        let stored = &*value.cast::<Stored>();
        let Some(emit) = raw::RedisModule_EmitAOF else {
            return;
        };
        let args = crate::replication::effect_args(crate::replication::Event::Sync, stored.lock());
        // Owned strings, freed when `strings` drops (after the emit copied them).
        let strings: Vec<RedisString> = args
            .iter()
            .map(|a| RedisString::create_from_slice(ptr::null_mut(), a))
            .collect();
        let mut argv: Vec<*mut raw::RedisModuleString> = strings.iter().map(|s| s.inner).collect();
        let cmd = c"LOCK.APPLY".as_ptr();
        emit(aof, cmd, c"sv".as_ptr(), key, argv.as_mut_ptr(), argv.len());
    });
}

/// # Safety
/// `value` is a `Stored` this module created.
pub unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    guarded(0, || {
        std::mem::size_of::<Stored>() + (*value.cast::<Stored>()).lock().heap_bytes()
    })
}

/// # Safety
/// `value` is a `Stored` this module created.
pub unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guarded((), || {
        let lock = (*value.cast::<Stored>()).lock();
        let (Some(add_buf), Some(add_ll), Some(end)) = (
            raw::RedisModule_DigestAddStringBuffer,
            raw::RedisModule_DigestAddLongLong,
            raw::RedisModule_DigestEndSequence,
        ) else {
            return;
        };
        add_ll(md, lock.fence as c_longlong);
        if let Some(holder) = &lock.holder {
            add_buf(md, holder.token.as_ptr().cast(), holder.token.len());
            add_ll(md, holder.deadline as c_longlong);
            add_ll(md, c_longlong::from(holder.holds));
            add_ll(md, c_longlong::from(holder.session));
        }
        end(md);
    });
}

/// # Safety
/// `value` is a `Stored` this module created (possibly freed on a lazyfree thread: no Redis
/// API here).
pub unsafe extern "C" fn free(value: *mut c_void) {
    guarded((), || drop(Box::from_raw(value.cast::<Stored>())));
}

/// # Safety
/// `value` is a `Stored` this module created.
pub unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guarded(ptr::null_mut(), || {
        let mut lock = (*value.cast::<Stored>()).lock().clone();
        // The session belongs to the connection that holds the original key.
        if let Some(holder) = lock.holder.as_mut() {
            holder.session = false;
        }
        Box::into_raw(Box::new(Stored::new(lock))).cast()
    })
}

/// # Safety
/// Called by Redis with a valid IO handle.
pub unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, _when: c_int) {
    guarded((), || raw::save_unsigned(rdb, datatype::fence_floor()));
}

/// # Safety
/// Called by Redis with a valid IO handle.
pub unsafe extern "C" fn aux_load(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
    _when: c_int,
) -> c_int {
    guarded(ERR, || {
        if encver > datatype::AUX_VERSION {
            logging::log_warning(format!(
                "lock module cannot load fence floor of encoding version {encver}"
            ));
            return ERR;
        }
        match raw::load_unsigned(rdb) {
            Ok(floor) => {
                datatype::raise_fence_floor(floor.min(crate::core::MAX_FENCE));
                OK
            }
            Err(_) => ERR,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Expiry timer and keyspace scan

/// The module's timers: each fires its callback once.
#[derive(Clone, Copy)]
pub enum Timer {
    Expiry,
    Deferred,
}

/// Arms `timer` to fire after `delay_ms`; its id, or `None` when the server has no timers.
pub fn create_timer(ctx: &Context, timer: Timer, delay_ms: u64) -> Option<raw::RedisModuleTimerID> {
    let callback = match timer {
        Timer::Expiry => expiry_timer,
        Timer::Deferred => deferred_timer,
    };
    let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
    // SAFETY: valid context; the callback is a plain function and takes no data.
    unsafe {
        raw::RedisModule_CreateTimer
            .map(|create| create(ctx.ctx, delay, Some(callback), ptr::null_mut()))
    }
}

/// # Safety
/// Called by Redis with a valid context.
pub unsafe extern "C" fn expiry_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guarded((), || expiry::on_timer(&Context::new(ctx)));
}

struct ScanState<'a> {
    found: &'a mut dyn FnMut(&[u8], u64, u64),
}

unsafe extern "C" fn scan_one(
    _ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    privdata: *mut c_void,
) {
    guarded((), || {
        if key.is_null() {
            return;
        }
        let (Some(get_type), Some(get_value)) = (
            raw::RedisModule_ModuleTypeGetType,
            raw::RedisModule_ModuleTypeGetValue,
        ) else {
            return;
        };
        if raw::RedisModule_KeyType.map(|f| f(key))
            != Some(raw::REDISMODULE_KEYTYPE_MODULE as c_int)
        {
            return;
        }
        if get_type(key) != *LOCK_TYPE.raw_type.borrow() {
            return;
        }
        let stored = &*get_value(key).cast::<Stored>();
        if let Some(holder) = &stored.lock().holder {
            let state = &mut *privdata.cast::<ScanState>();
            (state.found)(
                RedisString::string_as_slice(name),
                stored.id(),
                holder.deadline,
            );
        }
    });
}

/// Calls `found` with the name, lock id and deadline of every held lock in the selected db.
pub fn scan_locks(ctx: &Context, mut found: impl FnMut(&[u8], u64, u64)) {
    let mut state = ScanState { found: &mut found };
    // SAFETY: valid context; the cursor is freed below; privdata outlives the scan.
    unsafe {
        let (Some(create), Some(scan), Some(destroy)) = (
            raw::RedisModule_ScanCursorCreate,
            raw::RedisModule_Scan,
            raw::RedisModule_ScanCursorDestroy,
        ) else {
            return;
        };
        let cursor = create();
        let privdata = ptr::from_mut(&mut state).cast::<c_void>();
        while scan(ctx.ctx, cursor, Some(scan_one), privdata) != 0 {}
        destroy(cursor);
    }
}

// ---------------------------------------------------------------------------------------------
// Server and keyspace events

#[repr(C)]
struct FlushInfo {
    version: u64,
    sync: i32,
    dbnum: i32,
}

/// The head of RedisModuleClientInfoV1: enough to read the client id.
#[repr(C)]
struct ClientInfoHead {
    version: u64,
    flags: u64,
    id: u64,
}

/// Asks for the waiters of every key in `db` (all dbs for `None`) to be settled.
fn settle_waiters_in(ctx: &Context, db: Option<i32>) {
    for key in waiting::keys_in(db) {
        deferred::defer(ctx, deferred::Job::SettleKey(key));
    }
}

pub fn subscribe_events(ctx: &Context) -> Result<(), String> {
    // SAFETY: valid context; callbacks are plain functions.
    unsafe {
        let subscribe = raw::RedisModule_SubscribeToServerEvent.ok_or("no server events")?;
        for id in [
            raw::REDISMODULE_EVENT_LOADING,
            raw::REDISMODULE_EVENT_FLUSHDB,
            raw::REDISMODULE_EVENT_SWAPDB,
            raw::REDISMODULE_EVENT_CLIENT_CHANGE,
            raw::REDISMODULE_EVENT_FORK_CHILD,
            raw::REDISMODULE_EVENT_CONFIG,
        ] {
            let event = raw::RedisModuleEvent { id, dataver: 1 };
            if subscribe(ctx.ctx, event, Some(server_event)) == ERR {
                return Err(format!("cannot subscribe to server event {id}"));
            }
        }
        let keyspace = raw::RedisModule_SubscribeToKeyspaceEvents.ok_or("no keyspace events")?;
        let classes = raw::REDISMODULE_NOTIFY_GENERIC
            | raw::REDISMODULE_NOTIFY_EXPIRED
            | raw::REDISMODULE_NOTIFY_EVICTED;
        if keyspace(ctx.ctx, classes as c_int, Some(keyspace_event)) == ERR {
            return Err("cannot subscribe to keyspace events".into());
        }
    }
    Ok(())
}

unsafe extern "C" fn server_event(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guarded((), || {
        let context = Context::new(ctx);
        match event.id {
            raw::REDISMODULE_EVENT_LOADING
                if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED =>
            {
                expiry::rebuild(&context);
            }
            raw::REDISMODULE_EVENT_FLUSHDB if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END => {
                let dbnum = if data.is_null() {
                    -1
                } else {
                    (*data.cast::<FlushInfo>()).dbnum
                };
                let db = (dbnum >= 0).then_some(dbnum);
                expiry::forget_db(db);
                settle_waiters_in(&context, db);
            }
            raw::REDISMODULE_EVENT_SWAPDB => {
                expiry::rebuild(&context);
                settle_waiters_in(&context, None);
            }
            // A child was just forked; when it rewrites the AOF, the parent's writes from now on
            // go to the new incremental file, which will sit beside the rewritten base: record
            // the fence floor there (a base without RDB preamble has nowhere to keep it).
            raw::REDISMODULE_EVENT_FORK_CHILD
                if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN =>
            {
                crate::replication::record_floor(&context);
            }
            raw::REDISMODULE_EVENT_CONFIG => {
                deferred::defer(&context, deferred::Job::CheckConfig);
            }
            raw::REDISMODULE_EVENT_CLIENT_CHANGE
                if subevent == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED
                    && !data.is_null() =>
            {
                let client = (*data.cast::<ClientInfoHead>()).id;
                if sessions::owns_any(client) {
                    deferred::defer(&context, deferred::Job::SessionLost(client));
                }
            }
            _ => {}
        }
    });
}

unsafe extern "C" fn keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    guarded(OK, || {
        if event.is_null() || key.is_null() {
            return OK;
        }
        let event = CStr::from_ptr(event).to_bytes();
        let context = Context::new(ctx);
        let name = RedisString::string_as_slice(key);
        if matches!(event, b"rename_to" | b"move_to" | b"copy_to" | b"restore") {
            expiry::index_key(&context, name);
        }
        // The key left (or another value took its name): its waiters may proceed.
        if matches!(
            event,
            b"del"
                | b"expired"
                | b"evicted"
                | b"rename_from"
                | b"move_from"
                | b"rename_to"
                | b"move_to"
                | b"copy_to"
                | b"restore"
        ) && waiting::anyone_waiting()
        {
            let place = (crate::replication::selected_db(&context), name.into());
            if waiting::waiting_on(&place) > 0 {
                deferred::defer(&context, deferred::Job::SettleKey(place));
            }
        }
        OK
    })
}
