//! The lock module for Redis: `LOCK.*` commands on a persistent, replicated lock type with
//! strictly increasing fences.
//!
//! This file is the module table: the commands with their flags, key specs and documentation,
//! the data type, configs, INFO and the server events the module listens to. The layers below
//! import only downwards:
//!
//! - `service`: the commands, waiting and hand-off, expiry, replicated effects, deferred work;
//! - `lock`: the lock itself and its bookkeeping, pure and unit-tested without a server;
//! - `host`: every `unsafe` line, thin typed wrappers over Redis' module API;
//! - `config`, `metrics`, `error`: settings, counters and the error replies, used by all.

// A panic inside Redis aborts the server: the module's own code may not unwrap, expect or panic
// (tests may; see clippy.toml). Every unsafe block says why it is sound.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod error;
pub mod host;
pub mod lock;
pub mod metrics;
pub mod policy;
pub mod service;

use std::ffi::CStr;

use host::command::{entry, entry_declaring_keys, ArgDef, ArgKind, CommandDef, KeyAccess, Keys};
use service::commands::{
    LockAcquire, LockApply, LockFence, LockFloor, LockForceRelease, LockGuard, LockInfo, LockList,
    LockLongholds, LockMacquire, LockMrelease, LockPolicy, LockRelease, LockRenew, LockWait,
    LockWho,
};

/// Rust allocations go through Redis' allocator, so INFO memory, MEMORY USAGE and maxmemory
/// see them. (Unit tests run without a server and keep the system allocator.)
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: redis_module::alloc::RedisAlloc = redis_module::alloc::RedisAlloc;

pub const MODULE_NAME: &CStr = c"lock";
/// The crate's version as `MODULE LIST` shows it: major * 10000 + minor * 100 + patch (0.2.0 is
/// 200), as other modules encode theirs.
pub const MODULE_VERSION: i32 = version_number(
    env!("CARGO_PKG_VERSION_MAJOR"),
    env!("CARGO_PKG_VERSION_MINOR"),
    env!("CARGO_PKG_VERSION_PATCH"),
);
/// The crate's version, e.g. `0.2.0` (INFO `lock_version`, the load log line).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `major * 10000 + minor * 100 + patch` from the three decimal numbers.
const fn version_number(major: &str, minor: &str, patch: &str) -> i32 {
    const fn number(digits: &str) -> i32 {
        let digits = digits.as_bytes();
        let mut value = 0;
        let mut i = 0;
        while i < digits.len() {
            value = value * 10 + (digits[i] - b'0') as i32;
            i += 1;
        }
        value
    }
    number(major) * 10_000 + number(minor) * 100 + number(patch)
}
/// The module's own ACL category (Redis 7.4+), holding every LOCK.* command.
const ACL_CATEGORY: &CStr = c"lock";
/// The version that brought the first commands; later ones name their own.
const SINCE: &CStr = c"0.1.0";

const KEY: ArgDef = ArgDef::new(c"key", ArgKind::Key);
const TOKEN: ArgDef = ArgDef::new(c"token", ArgKind::String);
const TTL: ArgDef = ArgDef::new(c"ttl-ms", ArgKind::Integer);
const SYNC: ArgDef = ArgDef::new(
    c"sync",
    ArgKind::Block(&[
        ArgDef::new(c"numreplicas", ArgKind::Integer),
        ArgDef::new(c"timeout-ms", ArgKind::Integer),
    ]),
)
.token(c"SYNC")
.optional();
const FSYNC: ArgDef = ArgDef::new(c"fsync-timeout-ms", ArgKind::Integer)
    .token(c"FSYNC")
    .optional();
const LABEL: ArgDef = ArgDef::new(c"label", ArgKind::String)
    .token(c"LABEL")
    .optional();

/// The complexity of a command on one key: a shared lock or a semaphore is looked through.
const PER_HOLDER: &CStr = c"O(1), or O(N) for a key with N shared or permit holders";

pub static COMMANDS: &[CommandDef] = &[
    CommandDef {
        name: c"lock.acquire",
        callback: entry::<LockAcquire>,
        flags: c"write deny-oom blocking",
        arity: -4,
        keys: Keys::First(KeyAccess::ReadWrite),
        summary: c"Takes the lock for a token and returns its fence, or nil when another token holds it.",
        complexity: PER_HOLDER,
        args: &[
            KEY,
            TOKEN,
            TTL,
            ArgDef::new(c"timeout-ms", ArgKind::Integer).token(c"WAIT").optional(),
            ArgDef::new(c"reentrant", ArgKind::PureToken).token(c"REENTRANT").optional(),
            ArgDef::new(c"session", ArgKind::PureToken).token(c"SESSION").optional(),
            SYNC,
            FSYNC,
            ArgDef::new(c"lock-delay", ArgKind::Integer).token(c"LOCKDELAY").optional(),
            ArgDef::new(
                c"mode",
                ArgKind::OneOf(&[
                    ArgDef::new(c"shared", ArgKind::PureToken).token(c"SHARED"),
                    ArgDef::new(c"limit", ArgKind::Integer).token(c"LIMIT"),
                ]),
            )
            .optional(),
            LABEL,
        ],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.release",
        callback: entry::<LockRelease>,
        flags: c"write fast",
        arity: 3,
        keys: Keys::First(KeyAccess::ReadWrite),
        summary: c"Drops one hold of the lock if the token holds it; at zero holds the lock is free.",
        complexity: PER_HOLDER,
        args: &[KEY, TOKEN],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.renew",
        callback: entry::<LockRenew>,
        flags: c"write blocking",
        arity: -4,
        keys: Keys::First(KeyAccess::ReadWrite),
        summary: c"Extends the lease to ttl-ms from now if the token holds the lock.",
        complexity: PER_HOLDER,
        args: &[KEY, TOKEN, TTL, SYNC, FSYNC],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.fence",
        callback: entry::<LockFence>,
        flags: c"readonly fast",
        arity: 3,
        keys: Keys::First(KeyAccess::Read),
        summary: c"Tells whether a fence belongs to the current, unexpired holder of the lock.",
        complexity: PER_HOLDER,
        args: &[KEY, ArgDef::new(c"fence", ArgKind::Integer)],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.wait",
        callback: entry::<LockWait>,
        flags: c"readonly blocking",
        arity: 3,
        keys: Keys::First(KeyAccess::Read),
        summary: c"Waits, without taking the lock, until the current grant ends; 1 when it did, 0 on timeout.",
        complexity: PER_HOLDER,
        args: &[KEY, ArgDef::new(c"timeout-ms", ArgKind::Integer)],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.info",
        callback: entry::<LockInfo>,
        flags: c"readonly fast",
        arity: 2,
        keys: Keys::First(KeyAccess::Read),
        summary: c"Shows a lock's state, last fence, remaining lease, holds, waiters and session flag; never the token.",
        complexity: PER_HOLDER,
        args: &[KEY],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.who",
        callback: entry::<LockWho>,
        flags: c"readonly",
        arity: -2,
        keys: Keys::First(KeyAccess::Read),
        summary: c"Lists who holds the lock and who waits for it, in queue order: client id, name, address, label, times; never the token.",
        complexity: c"O(N + M) where N is the number of holders and M the number of waiters listed",
        args: &[
            KEY,
            ArgDef::new(c"count", ArgKind::Integer).token(c"COUNT").optional(),
            ArgDef::new(c"client-id", ArgKind::Integer).token(c"CLIENT").optional(),
        ],
        acl: c"",
        since: c"0.2.0",
    },
    CommandDef {
        name: c"lock.longholds",
        callback: entry::<LockLongholds>,
        flags: c"admin allow-loading allow-stale",
        arity: -2,
        keys: Keys::None,
        summary: c"The long-hold log: holds that lasted longer than lock.long-hold, newest first, with who held them and how they ended (GET [count], LEN, RESET).",
        complexity: c"O(N) where N is the number of entries returned",
        args: &[ArgDef::new(
            c"subcommand",
            ArgKind::OneOf(&[
                ArgDef::new(
                    c"get",
                    ArgKind::Block(&[
                        ArgDef::new(c"get", ArgKind::PureToken).token(c"GET"),
                        ArgDef::new(c"count", ArgKind::Integer).optional(),
                    ]),
                ),
                ArgDef::new(c"len", ArgKind::PureToken).token(c"LEN"),
                ArgDef::new(c"reset", ArgKind::PureToken).token(c"RESET"),
            ]),
        )],
        // An operator's command, as SLOWLOG is: its entries name every application's keys and
        // RESET empties what the runbook reads. The `admin` flag puts a module command in no
        // category, so `-@admin` and `-@dangerous` deny it only through these.
        acl: c"admin dangerous",
        since: c"0.2.0",
    },
    CommandDef {
        name: c"lock.policy",
        callback: entry::<LockPolicy>,
        flags: c"readonly fast allow-loading allow-stale",
        arity: -2,
        keys: Keys::None,
        summary: c"The lock namespaces (lock.namespaces): LIST every namespace with its settings and what it refused and warned about; EXPLAIN key: which namespace a key is in and which rules apply to it, from where.",
        complexity: c"O(N) where N is the number of namespaces and their prefixes",
        args: &[ArgDef::new(
            c"subcommand",
            ArgKind::OneOf(&[
                ArgDef::new(c"list", ArgKind::PureToken).token(c"LIST"),
                ArgDef::new(
                    c"explain",
                    ArgKind::Block(&[
                        ArgDef::new(c"explain", ArgKind::PureToken).token(c"EXPLAIN"),
                        ArgDef::new(c"key", ArgKind::String),
                    ]),
                ),
            ]),
        )],
        acl: c"",
        since: c"0.2.0",
    },
    CommandDef {
        name: c"lock.list",
        callback: entry::<LockList>,
        flags: c"readonly",
        arity: -2,
        keys: Keys::None,
        summary: c"Lists the locks held or waited for, a page at a time with a cursor as SCAN: key, namespace, mode, holders, age of the oldest hold, labels, waiters; never a token; only keys the caller may read.",
        complexity: c"O(N) for each call, where N is COUNT; O(M) for a full iteration, where M is the number of keys",
        args: &[
            ArgDef::new(c"cursor", ArgKind::Integer),
            ArgDef::new(c"namespace", ArgKind::String)
                .token(c"NAMESPACE")
                .optional(),
            ArgDef::new(c"older-ms", ArgKind::Integer)
                .token(c"OLDER")
                .optional(),
            ArgDef::new(c"waiting", ArgKind::PureToken)
                .token(c"WAITING")
                .optional(),
            ArgDef::new(c"count", ArgKind::Integer).token(c"COUNT").optional(),
        ],
        acl: c"",
        since: c"0.2.0",
    },
    CommandDef {
        name: c"lock.forcerelease",
        callback: entry::<LockForceRelease>,
        flags: c"write fast",
        arity: 2,
        keys: Keys::First(KeyAccess::Update),
        summary: c"Frees the lock whoever holds it (operators only).",
        complexity: PER_HOLDER,
        args: &[KEY],
        acl: c"dangerous",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.macquire",
        callback: entry_declaring_keys::<LockMacquire>,
        flags: c"write deny-oom blocking getkeys-api",
        arity: -5,
        keys: Keys::Counted(KeyAccess::ReadWrite),
        summary: c"Takes several locks for one token, all or none, and returns their fences in key order, or nil.",
        complexity: c"O(N) where N is the number of keys",
        args: &[
            ArgDef::new(c"numkeys", ArgKind::Integer),
            ArgDef::new(c"key", ArgKind::Key).multiple(),
            TOKEN,
            TTL,
            ArgDef::new(c"timeout-ms", ArgKind::Integer).token(c"WAIT").optional(),
            ArgDef::new(c"session", ArgKind::PureToken).token(c"SESSION").optional(),
            ArgDef::new(c"lock-delay", ArgKind::Integer).token(c"LOCKDELAY").optional(),
            LABEL,
        ],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.mrelease",
        callback: entry_declaring_keys::<LockMrelease>,
        flags: c"write getkeys-api",
        arity: -4,
        keys: Keys::Counted(KeyAccess::ReadWrite),
        summary: c"Drops one hold of the token on each key, as LOCK.RELEASE does; replies how many it held.",
        complexity: c"O(N) where N is the number of keys",
        args: &[
            ArgDef::new(c"numkeys", ArgKind::Integer),
            ArgDef::new(c"key", ArgKind::Key).multiple(),
            TOKEN,
        ],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.guard",
        callback: entry_declaring_keys::<LockGuard>,
        flags: c"write getkeys-api",
        arity: -4,
        keys: Keys::FirstAndMore(KeyAccess::Read),
        summary: c"Runs a command only if the fence is the lock's current one, atomically; the command is replicated as itself.",
        complexity: c"O(1) plus the complexity of the command",
        args: &[
            KEY,
            ArgDef::new(c"fence", ArgKind::Integer),
            ArgDef::new(c"command", ArgKind::String),
            ArgDef::new(c"arg", ArgKind::String).optional().multiple(),
        ],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.apply",
        callback: entry::<LockApply>,
        flags: c"write no-monitor no-slowlog",
        arity: -3,
        keys: Keys::First(KeyAccess::Overwrite),
        summary: c"Internal: applies a lock state change sent by the primary or read from the AOF.",
        complexity: PER_HOLDER,
        args: &[
            KEY,
            ArgDef::new(c"state", ArgKind::String),
            ArgDef::new(c"token", ArgKind::String).optional(),
            ArgDef::new(c"who", ArgKind::String).optional(),
        ],
        acl: c"",
        since: SINCE,
    },
    CommandDef {
        name: c"lock.floor",
        callback: entry::<LockFloor>,
        flags: c"write no-monitor no-slowlog",
        arity: 2,
        keys: Keys::None,
        summary: c"Internal: raises the fence floor; written to the AOF and replication stream by the primary.",
        complexity: c"O(1)",
        args: &[ArgDef::new(c"floor", ArgKind::Integer)],
        acl: c"",
        since: SINCE,
    },
];

export_module!(MODULE_NAME, MODULE_VERSION, register);

/// Everything the module registers, in order. Called once, from `RedisModule_OnLoad`.
fn register(ctx: &redis_module::Context, args: &[Vec<u8>]) -> Result<(), String> {
    let missing = host::api::missing_required();
    if !missing.is_empty() {
        return Err(format!(
            "this server lacks module API functions the module needs ({}): Redis 7.0+ or \
             Valkey 8.0+ required",
            missing.join(", ")
        ));
    }
    // Arguments first: a refused load must not leave a registered data type behind (Redis
    // never frees it).
    config::check_arg_names(args)?;
    let defaults = config::ALL
        .iter()
        .map(|config| config::value_from_args(config, args))
        .collect::<Result<Vec<_>, _>>()?;
    host::set_module_options(ctx, 0);
    host::value::create_type(ctx, &service::value::LOCK_TYPE)?;
    for (config, default) in config::ALL.into_iter().zip(defaults) {
        host::config::register_numeric(ctx, config, default)?;
    }
    // Set from redis.conf, the command line or CONFIG SET: RM_LoadConfigs applies a given one.
    host::config::register_string(ctx, &service::policy::CONFIG, "")?;
    host::config::load(ctx)?;
    service::policy::loaded();
    host::config::on_change(service::audit::config_changed);
    let config_callers = host::audit::watch_config_calls(ctx);
    let category = host::command::add_acl_category(ctx, ACL_CATEGORY);
    for command in COMMANDS {
        host::command::create_command(ctx, command, category)?;
    }
    host::info::register::<service::Info>(ctx)?;
    let server = host::api::ServerName::read(ctx);
    let slot_imports = host::events::subscribe::<service::events::Events>(ctx, server.is_valkey())?;
    if slot_imports {
        // Valkey 9's atomic slot migration asks every module to declare it handles it: the
        // module keeps the locks of slots being imported inert until the import completes
        // (service::expiry).
        host::set_module_options(ctx, host::api::VALKEY_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION);
    }
    service::leases::set_due_handler(service::expiry::on_due);
    service::value::set_forget_entries(service::holds::forget);
    host::set_after_call(service::handoff::serve_ready);
    // SYNC replies are decided once per event-loop turn, as WAIT's are.
    service::acks::hooked(host::events::on_before_sleep(
        ctx,
        service::acks::before_sleep,
    ));
    // FSYNC: the previous turn's AOF write is looked at right after the sleep.
    host::events::on_after_sleep(service::fsync::after_sleep);
    service::safety::check(ctx);
    host::log_notice(&format!(
        "lock module {VERSION} (MODULE LIST ver {MODULE_VERSION}): on {}; {}",
        server,
        host::api::Optional::probe(slot_imports).describe()
    ));
    if !config_callers {
        host::log_notice(
            "lock audit: this server does not tell modules who runs CONFIG SET; changes of \
             lock.* configs are logged without the client",
        );
    }
    Ok(())
}
