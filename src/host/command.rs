//! Commands: their registration (flags, key spec, COMMAND DOCS, ACL categories) and the entry
//! point Redis calls, which hands borrowed arguments to a safe handler and sends its reply.

use std::ffi::{c_int, c_long, CStr, CString};
use std::mem::ManuallyDrop;
use std::ptr;

use redis_module::{raw, Context, RedisString, RedisValue};

use crate::error::LockError;
use crate::host::{as_call, guarded, log_warning, ERR, OK};
use crate::host::{call, keys, server};

/// What a command handler answers: a reply, or an error whose text the client sees.
pub type CommandResult = Result<RedisValue, LockError>;

/// A command: `run` gets the context and the arguments (the command name first).
pub trait Command {
    fn run(ctx: &Context, args: &[RedisString]) -> CommandResult;

    /// The positions of the arguments that may hold a token when the call fails, whatever the
    /// error: a misplaced argument (a forgotten key, swapped arguments, a wrong count of keys)
    /// puts the token where no check expects it. They are redacted from SLOWLOG, MONITOR and
    /// the command log; a call that succeeds redacts its token itself.
    fn secret_on_error(_args: &[RedisString]) -> Vec<usize> {
        Vec::new()
    }
}

/// The C signature of a command callback.
pub type CommandFn = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    *mut *mut raw::RedisModuleString,
    c_int,
) -> c_int;

/// The entry point Redis calls for command `C`.
pub extern "C" fn entry<C: Command>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let outer = server::begin_command(&context);
    as_call(&context, || {
        let args = BorrowedArgs::of(ctx, argv, argc);
        let args = args.as_strings();
        let outcome = guarded(Err(LockError::internal("a command panicked")), || {
            C::run(&context, args)
        });
        if outcome.is_err() {
            for position in guarded(Vec::new(), || C::secret_on_error(args)) {
                keys::redact(&context, i32::try_from(position).unwrap_or(i32::MAX));
            }
        }
        reply(&context, outcome);
    });
    server::end_command(outer);
    OK
}

/// A command whose keys depend on its arguments (flag `getkeys-api`): the server also calls it
/// only to ask where its keys are, for cluster routing, ACL key patterns and COMMAND GETKEYS.
pub trait DeclaresKeys: Command {
    /// The positions of the keys in `args` (the command name is 0), each with its
    /// `REDISMODULE_CMD_KEY_*` flags.
    fn keys(ctx: &Context, args: &[RedisString]) -> Vec<(usize, u32)>;
}

/// The entry point of a `getkeys-api` command `C`: answers key position requests, and runs the
/// command otherwise.
pub extern "C" fn entry_declaring_keys<C: DeclaresKeys>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    if call::is_keys_position_request(&context) {
        guarded((), || {
            let args = BorrowedArgs::of(ctx, argv, argc);
            for (position, flags) in C::keys(&context, args.as_strings()) {
                call::declare_key(&context, position, flags);
            }
        });
        return OK;
    }
    entry::<C>(ctx, argv, argc)
}

/// How many arguments a command's strings are kept for on the stack: every LOCK.* command but
/// a long MACQUIRE or MRELEASE, which take a vector.
const FEW_ARGS: usize = 12;

/// The command's arguments as strings borrowed from Redis for the call: no retain, no free
/// (`ManuallyDrop` keeps `RedisString`'s Drop from freeing what Redis owns). A few of them stay
/// on the stack: no allocation for a command's arguments.
enum BorrowedArgs {
    Few([ManuallyDrop<RedisString>; FEW_ARGS], usize),
    Many(Vec<ManuallyDrop<RedisString>>),
}

impl BorrowedArgs {
    fn of(
        ctx: *mut raw::RedisModuleCtx,
        argv: *mut *mut raw::RedisModuleString,
        argc: c_int,
    ) -> BorrowedArgs {
        let count = usize::try_from(argc).unwrap_or(0);
        if argv.is_null() || count == 0 {
            return BorrowedArgs::Many(Vec::new());
        }
        // SAFETY: Redis passes argc valid strings that live until the command returns.
        let raw_args = unsafe { std::slice::from_raw_parts(argv, count) };
        let borrow = |arg: *mut raw::RedisModuleString| {
            ManuallyDrop::new(RedisString::from_redis_module_string(ctx, arg))
        };
        if count <= FEW_ARGS {
            // The slots past `count` hold null strings that are never read (see `as_strings`)
            // and never dropped.
            let few = std::array::from_fn(|at| {
                borrow(raw_args.get(at).copied().unwrap_or(std::ptr::null_mut()))
            });
            BorrowedArgs::Few(few, count)
        } else {
            BorrowedArgs::Many(raw_args.iter().map(|&arg| borrow(arg)).collect())
        }
    }

    fn as_strings(&self) -> &[RedisString] {
        let args: &[ManuallyDrop<RedisString>] = match self {
            BorrowedArgs::Few(few, count) => few.get(..*count).unwrap_or_default(),
            BorrowedArgs::Many(many) => many,
        };
        // SAFETY: ManuallyDrop<T> is repr(transparent) over T, so the slices have the same layout.
        unsafe { std::slice::from_raw_parts(args.as_ptr().cast(), args.len()) }
    }
}

/// Sends a command's reply. If building it fails (a bug), still answers with an error so the
/// client never waits for a reply that will not come.
pub fn reply(ctx: &Context, outcome: CommandResult) {
    // The common reply, a fence or a 0/1, goes straight out: the general path builds nothing for
    // it but costs as much as the rest of a FENCE.
    if let Ok(RedisValue::Integer(value)) = outcome {
        // SAFETY: a valid context; the call only appends to its client's reply.
        unsafe {
            if let Some(reply_integer) = raw::RedisModule_ReplyWithLongLong {
                reply_integer(ctx.ctx, value);
            }
        }
        return;
    }
    if let Err(LockError::Internal(what)) = &outcome {
        log_warning(&format!("lock module internal error: {what}"));
    }
    let replied = guarded(false, || {
        ctx.reply(outcome.map_err(Into::into));
        true
    });
    if !replied {
        let text = CString::new(LockError::internal("a reply could not be built").reply())
            .unwrap_or_default();
        // SAFETY: a valid context and a NUL-terminated message.
        unsafe {
            if let Some(reply_error) = raw::RedisModule_ReplyWithError {
                reply_error(ctx.ctx, text.as_ptr());
            }
        }
    }
}

/// Replies with field/value pairs: a map in RESP3, a flat array in RESP2.
pub fn reply_map(ctx: &Context, fields: Vec<(&'static str, RedisValue)>) -> CommandResult {
    let fields = fields
        .into_iter()
        .map(|(name, value)| (name, Nested::Value(value)));
    reply_nested(ctx, Nested::Map(fields.collect()))
}

/// A reply with maps inside arrays: each map is a map in RESP3, a flat field/value array in
/// RESP2.
pub enum Nested {
    Value(RedisValue),
    Map(Vec<(&'static str, Nested)>),
    List(Vec<Nested>),
}

impl Nested {
    /// An integer (saturating at `i64::MAX`).
    pub fn int(value: impl TryInto<i64>) -> Nested {
        Nested::Value(RedisValue::Integer(value.try_into().unwrap_or(i64::MAX)))
    }

    /// A bulk string.
    pub fn bulk(value: &[u8]) -> Nested {
        Nested::Value(RedisValue::StringBuffer(value.to_vec()))
    }

    /// A status word (`held`, `exclusive`).
    pub fn word(value: &'static str) -> Nested {
        Nested::Value(RedisValue::SimpleStringStatic(value))
    }
}

/// Sends `reply` (the command then returns `NoReply`).
pub fn reply_nested(ctx: &Context, reply: Nested) -> CommandResult {
    send_nested(ctx, reply);
    Ok(RedisValue::NoReply)
}

fn send_nested(ctx: &Context, reply: Nested) {
    match reply {
        Nested::Value(value) => {
            ctx.reply(Ok(value));
        }
        Nested::Map(fields) => {
            raw::reply_with_map(ctx.ctx, c_long::try_from(fields.len()).unwrap_or(0));
            // The map header is followed by exactly 2 * len replies.
            for (name, value) in fields {
                ctx.reply(Ok(RedisValue::SimpleStringStatic(name)));
                send_nested(ctx, value);
            }
        }
        Nested::List(items) => {
            raw::reply_with_array(ctx.ctx, c_long::try_from(items.len()).unwrap_or(0));
            for item in items {
                send_nested(ctx, item);
            }
        }
    }
}

/// Where a command's keys are (key specs, for cluster routing, ACL key patterns and COMMAND
/// GETKEYS).
#[derive(Clone, Copy)]
pub enum Keys {
    None,
    /// The first argument.
    First(KeyAccess),
    /// The first argument, then keys only the command itself finds (`getkeys-api`): a second
    /// key spec says so (unknown place, flags vary by call).
    FirstAndMore(KeyAccess),
    /// `numkeys key [key ...]` from the first argument on.
    Counted(KeyAccess),
}

/// How a command touches its keys, for key specs and ACL checks.
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
    /// Several arguments after one token, e.g. `SYNC numreplicas timeout-ms`.
    Block(&'static [ArgDef]),
    /// One of several arguments, e.g. `SHARED | LIMIT n`.
    OneOf(&'static [ArgDef]),
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

    pub const fn multiple(mut self) -> Self {
        self.flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
        self
    }

    /// The argument as COMMAND DOCS takes it; a block's arguments go into `storage`, which
    /// must live until Redis has copied them.
    fn to_raw(
        self,
        storage: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
    ) -> raw::RedisModuleCommandArg {
        let (type_, subargs) = match self.kind {
            ArgKind::Key => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                None,
            ),
            ArgKind::String => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                None,
            ),
            ArgKind::Integer => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                None,
            ),
            ArgKind::PureToken => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                None,
            ),
            ArgKind::Block(args) => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
                Some(raw_args(args, storage)),
            ),
            ArgKind::OneOf(args) => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                Some(raw_args(args, storage)),
            ),
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
            subargs: subargs.unwrap_or(ptr::null_mut()),
            display_text: ptr::null(),
        }
    }
}

/// `args` as a zero-terminated array in `storage`; the pointer stays valid while `storage` lives
/// (moving a Vec into it does not move its elements).
fn raw_args(
    args: &[ArgDef],
    storage: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    let mut list: Vec<raw::RedisModuleCommandArg> =
        args.iter().map(|a| a.to_raw(storage)).collect();
    list.push(zeroed_arg());
    let pointer = list.as_mut_ptr();
    storage.push(list);
    pointer
}

/// One row of the module's command table.
pub struct CommandDef {
    pub name: &'static CStr,
    pub callback: CommandFn,
    pub flags: &'static CStr,
    pub arity: c_int,
    /// Where the command's keys are, and how it touches them.
    pub keys: Keys,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub args: &'static [ArgDef],
    /// ACL categories set where the server supports it (Redis 7.2+).
    pub acl: &'static CStr,
    /// The module version that added the command (COMMAND DOCS `since`).
    pub since: &'static CStr,
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
    // SAFETY: a valid context and a NUL-terminated name; only called during OnLoad, the one
    // place the call is allowed.
    let added = unsafe { raw::RedisModule_AddACLCategory.map(|add| add(ctx.ctx, name.as_ptr())) };
    (added == Some(OK)).then_some(name)
}

/// The key spec of a command whose only key is its first argument.
fn first_key_spec(access: KeyAccess) -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: access.flags(),
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
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
    }
}

/// The key spec of `numkeys key [key ...]` starting at the first argument. Marked as having
/// variable flags, so that the server asks the command's `getkeys-api` where its keys are
/// (cluster routing, ACL key checks) instead of reading them off numkeys: the command checks
/// the call's shape first, and a miscounted numkeys declares no key rather than the token.
fn counted_keys_spec(access: KeyAccess) -> raw::RedisModuleCommandKeySpec {
    let mut spec = first_key_spec(access);
    spec.flags |= u64::from(raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS);
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
    spec.fk = raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
        keynum: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
            keynumidx: 0,
            firstkey: 1,
            keystep: 1,
        },
    };
    spec
}

/// The key spec of keys only the command's `getkeys-api` finds: somewhere after the first
/// argument, each accessed as that call says (RW as the widest for tools that read specs only).
fn unknown_keys_spec() -> raw::RedisModuleCommandKeySpec {
    let mut spec = zeroed_key_spec();
    spec.flags = u64::from(
        raw::REDISMODULE_CMD_KEY_RW
            | raw::REDISMODULE_CMD_KEY_INCOMPLETE
            | raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS,
    );
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_UNKNOWN;
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_UNKNOWN;
    spec
}

/// Registers one command with its documentation, key spec and ACL categories (the module's
/// `category` plus the command's own, where the server supports command categories: 7.2+).
pub fn create_command(
    ctx: &Context,
    def: &CommandDef,
    category: Option<&'static CStr>,
) -> Result<(), String> {
    let name = def.name.to_string_lossy();
    // SAFETY: reading the API table Redis filled in at load.
    let (create, get, set_info) = unsafe {
        (
            raw::RedisModule_CreateCommand.ok_or("no CreateCommand")?,
            raw::RedisModule_GetCommand.ok_or("no GetCommand")?,
            raw::RedisModule_SetCommandInfo.ok_or("no SetCommandInfo")?,
        )
    };
    // The legacy (first, last, step) triple: only for a single first key; key specs say the rest.
    let first_key = c_int::from(matches!(def.keys, Keys::First(_) | Keys::FirstAndMore(_)));
    // SAFETY: a valid context, NUL-terminated static strings and a callback that stays loaded
    // as long as the module.
    let created = unsafe {
        create(
            ctx.ctx,
            def.name.as_ptr(),
            Some(def.callback),
            def.flags.as_ptr(),
            first_key,
            first_key,
            first_key,
        )
    };
    if created == ERR {
        return Err(format!("cannot create command {name}"));
    }
    // SAFETY: a valid context and the name just registered.
    let command = unsafe { get(ctx.ctx, def.name.as_ptr()) };
    if command.is_null() {
        return Err(format!("cannot find command {name}"));
    }
    let mut key_specs = [
        match def.keys {
            Keys::None => zeroed_key_spec(),
            Keys::First(access) | Keys::FirstAndMore(access) => first_key_spec(access),
            Keys::Counted(access) => counted_keys_spec(access),
        },
        if matches!(def.keys, Keys::FirstAndMore(_)) {
            unknown_keys_spec()
        } else {
            zeroed_key_spec()
        },
        zeroed_key_spec(),
    ];
    let mut storage = Vec::new();
    let args = raw_args(def.args, &mut storage);
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
        since: def.since.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: def.arity,
        key_specs: key_specs.as_mut_ptr(),
        args,
    };
    // SAFETY: `command` is the registered command; `info` and everything it points to (static
    // strings, the local key spec array and the argument arrays in `storage`, each with its
    // zeroed terminator) live until the call returns, and Redis copies what it keeps.
    if unsafe { set_info(command, &info) } == ERR {
        return Err(format!("cannot set command info of {name}"));
    }
    // SAFETY: reading the API table; Redis 7.2+ (on 7.0 the README's ACL recipe names the
    // command instead).
    if let Some(set_acl) = unsafe { raw::RedisModule_SetCommandACLCategories } {
        let categories: Vec<&str> = [category, Some(def.acl)]
            .into_iter()
            .flatten()
            .filter_map(|c| c.to_str().ok())
            .filter(|c| !c.is_empty())
            .collect();
        if !categories.is_empty() {
            let joined = CString::new(categories.join(" ")).map_err(|e| e.to_string())?;
            // SAFETY: the registered command and a NUL-terminated list of category names.
            if unsafe { set_acl(command, joined.as_ptr()) } == ERR {
                return Err(format!("cannot set ACL categories of {name}"));
            }
        }
    }
    Ok(())
}
