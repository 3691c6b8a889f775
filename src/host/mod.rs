//! The host layer: every `unsafe` line of the module, as thin typed wrappers over Redis' module
//! API. Nothing here knows what a lock is: callbacks Redis makes are turned into calls of safe
//! trait methods or function pointers that the layers above provide, and every such call runs
//! inside [`guarded`], so a panic never crosses into Redis (it would abort the server and drop
//! every client).
//!
//! - [`aof`]: the server's AOF files: its manifest, and the file it appends to now;
//! - [`api`]: which parts of the module API this server has (required and optional);
//! - [`command`]: command registration (flags, key specs, docs, ACL) and the command entry point;
//! - [`call`]: running another command from a command (RM_Call), and key position requests;
//! - [`blocking`]: clients blocked on keys, with their reply, timeout, disconnect and free calls;
//! - [`timer`], [`events`]: timers, server events and keyspace notifications;
//! - [`value`]: the data type's callbacks (RDB, AOF rewrite, digest, copy, memory, aux data);
//! - [`keys`]: what a command does to keys beside its reply (notify, replicate, signal, redact);
//! - [`server`]: time, databases, clients, context flags;
//! - [`config`], [`info`]: `CONFIG` and `INFO` registration.

pub mod aof;
pub mod api;
pub mod audit;
pub mod blocking;
pub mod call;
pub mod command;
pub mod config;
pub mod events;
pub mod info;
pub mod keys;
pub mod server;
pub mod timer;
pub mod value;

use std::cell::Cell;
use std::ffi::{c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Once, OnceLock};

use redis_module::raw;

pub const OK: c_int = raw::REDISMODULE_OK as c_int;
pub const ERR: c_int = raw::REDISMODULE_ERR as c_int;

thread_local! {
    /// How many guarded calls of this module are running on this thread: the panic hook handles
    /// panics inside them and leaves every other panic to the hook that was there before.
    static GUARDED: Cell<u32> = const { Cell::new(0) };
}

thread_local! {
    /// How many commands and timer callbacks of this module are running on this thread (a
    /// command may run another through RM_Call or a script).
    static CALLS: Cell<u32> = const { Cell::new(0) };
}

/// What runs at the end of the outermost command or timer callback (see [`in_call`]).
static AFTER_CALL: OnceLock<fn(&redis_module::Context)> = OnceLock::new();

/// Installs what runs at the end of every outermost command and timer callback, while its
/// context can still write and replicate (once, at load).
pub fn set_after_call(handler: fn(&redis_module::Context)) {
    let _ = AFTER_CALL.set(handler);
}

/// True inside a command or timer callback of this module: the handler of [`set_after_call`]
/// runs before Redis gets control back.
pub fn in_call() -> bool {
    CALLS.with(Cell::get) > 0
}

/// Runs `f` as a command or timer callback: when it is the outermost one, the after-call
/// handler runs next, still counted as inside the call.
fn as_call<R>(ctx: &redis_module::Context, f: impl FnOnce() -> R) -> R {
    CALLS.with(|depth| depth.set(depth.get() + 1));
    let outcome = f();
    if CALLS.with(Cell::get) == 1 {
        if let Some(handler) = AFTER_CALL.get() {
            guarded((), || handler(ctx));
        }
    }
    CALLS.with(|depth| depth.set(depth.get().saturating_sub(1)));
    outcome
}

/// Runs `f`, turning a panic into `fallback` (the panic hook has logged it).
pub fn guarded<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    GUARDED.with(|depth| depth.set(depth.get() + 1));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|depth| depth.set(depth.get().saturating_sub(1)));
    outcome.unwrap_or(fallback)
}

/// Logs panics of the module's guarded calls to the server log. Other panics (of another Rust
/// module sharing the process' standard library, say) go to the hook that was installed before.
pub fn install_panic_hook() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) > 0 {
                log_warning(&format!(
                    "lock module bug (caught, server kept running): {info}"
                ));
            } else {
                previous(info);
            }
        }));
    });
}

/// Writes a warning to the server log. The message is passed as an argument of a constant
/// format, so `%` in it is printed as it is; NUL bytes become spaces.
pub fn log_warning(message: &str) {
    log(c"warning", message);
}

/// Writes a notice to the server log.
pub fn log_notice(message: &str) {
    log(c"notice", message);
}

fn log(level: &std::ffi::CStr, message: &str) {
    let Ok(text) = CString::new(message.replace('\0', " ")) else {
        return;
    };
    // SAFETY: Log is filled in by RedisModule_Init before any code of ours runs (and checked for
    // presence here); a null context logs as the module from any thread; the format string
    // takes exactly the one string argument given, and every string is NUL-terminated.
    unsafe {
        if let Some(log) = raw::RedisModule_Log {
            log(
                std::ptr::null_mut(),
                level.as_ptr(),
                c"%s".as_ptr(),
                text.as_ptr(),
            );
        }
    }
}

/// What OnLoad does once the module API is initialised: registers everything, given the module
/// arguments; an error refuses the load and is logged.
pub type Register = fn(&redis_module::Context, &[Vec<u8>]) -> Result<(), String>;

/// The body of `RedisModule_OnLoad` (see [`export_module!`](crate::export_module)): initialises
/// the module API under `name`, then runs `register`.
///
/// # Safety
/// Only for `RedisModule_OnLoad`, with the arguments Redis passed to it.
pub unsafe fn load_module(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    name: &'static std::ffi::CStr,
    version: c_int,
    register: Register,
) -> c_int {
    // SAFETY: Redis calls OnLoad with a valid context; nothing may allocate before Init (the
    // allocator is Redis').
    let init = unsafe {
        raw::Export_RedisModule_Init(
            ctx,
            name.as_ptr(),
            version,
            raw::REDISMODULE_APIVER_1 as c_int,
        )
    };
    if init == ERR {
        return ERR;
    }
    install_panic_hook();
    guarded(ERR, || {
        let context = redis_module::Context::new(ctx);
        let args: Vec<Vec<u8>> = redis_module::decode_args(ctx, argv, argc)
            .iter()
            .map(|a| a.as_slice().to_vec())
            .collect();
        match register(&context, &args) {
            Ok(()) => OK,
            Err(message) => {
                log_warning(&format!("lock module not loaded: {message}"));
                ERR
            }
        }
    })
}

/// Exports `RedisModule_OnLoad`, the symbol Redis looks for, running [`load_module`].
#[macro_export]
macro_rules! export_module {
    ($name:expr, $version:expr, $register:path) => {
        /// The module's entry point: Redis calls it once, at `loadmodule` / `MODULE LOAD`.
        ///
        /// # Safety
        /// Called by Redis only, with a valid context and argument vector.
        #[no_mangle]
        pub unsafe extern "C" fn RedisModule_OnLoad(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::ffi::c_int,
        ) -> std::ffi::c_int {
            let (name, version, register): (
                &'static std::ffi::CStr,
                std::ffi::c_int,
                $crate::host::Register,
            ) = ($name, $version, $register);
            // SAFETY: these are the arguments Redis passed to OnLoad.
            unsafe { $crate::host::load_module(ctx, argv, argc, name, version, register) }
        }
    };
}

/// The module's options: a short read while loading is an error Redis handles (instead of an
/// abort), keys are counted as modified only where the module says so, a replica may load a
/// full sync in the background while its old data serves (the listener must follow
/// [`events::ServerEvent::AsyncLoad`]; without the option the server loads from a file on disk
/// and answers LOADING meanwhile), and `extra` (options the caller found the server has, see
/// [`api`]).
pub fn set_module_options(ctx: &redis_module::Context, extra: c_int) {
    let options = (raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
        | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED
        | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD) as c_int
        | extra;
    // SAFETY: a valid context, during OnLoad.
    unsafe {
        if let Some(set) = raw::RedisModule_SetModuleOptions {
            set(ctx.ctx, options);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static OTHER_HOOK_CALLS: AtomicUsize = AtomicUsize::new(0);

    /// The module's hook handles panics inside its guarded calls only; any other panic of the
    /// process still reaches the hook that was installed before (another Rust module's, say).
    #[test]
    fn the_panic_hook_leaves_other_panics_to_the_previous_hook() {
        std::panic::set_hook(Box::new(|_| {
            OTHER_HOOK_CALLS.fetch_add(1, Ordering::SeqCst);
        }));
        install_panic_hook();
        assert_eq!(guarded(7, || panic!("inside the module")), 7);
        assert_eq!(OTHER_HOOK_CALLS.load(Ordering::SeqCst), 0);
        let outside = std::panic::catch_unwind(|| panic!("elsewhere in the process"));
        assert!(outside.is_err());
        assert_eq!(OTHER_HOOK_CALLS.load(Ordering::SeqCst), 1);
        assert_eq!(GUARDED.with(Cell::get), 0);
    }
}
