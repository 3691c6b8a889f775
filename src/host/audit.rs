//! What the audit log needs from the server: who changed a `lock.*` config. A config's set
//! callback is told nothing of the client, so a command filter notes the client of each CONFIG
//! call just before it runs (on servers that tell a filter the client: Redis 7.2+, Valkey), and
//! a detached context looks that client up.

use std::ffi::c_int;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use redis_module::{raw, Context};

use crate::host::guarded;
use crate::host::server::{live_connection_of, user_of};

/// The client of the CONFIG command running now (0: none, or unknown).
static CONFIG_CLIENT: AtomicU64 = AtomicU64::new(0);
/// A context for lookups outside commands (the config set callback); null until load.
static DETACHED: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// At load: the command filter, where the server names a filtered command's client, and the
/// detached context. False when CONFIG changes cannot be attributed to a client here.
pub fn watch_config_calls(ctx: &Context) -> bool {
    // SAFETY: reading the API table Redis filled in at load.
    let (detach, register, client_of) = unsafe {
        (
            raw::RedisModule_GetDetachedThreadSafeContext,
            raw::RedisModule_RegisterCommandFilter,
            raw::RedisModule_CommandFilterGetClientId,
        )
    };
    let (Some(detach), Some(register), Some(_)) = (detach, register, client_of) else {
        return false;
    };
    // SAFETY: a valid context during OnLoad; the detached context lives as long as the module
    // (it is never freed: the module cannot be unloaded while it has a data type).
    let detached = unsafe { detach(ctx.ctx) };
    DETACHED.store(detached, Ordering::Relaxed);
    // SAFETY: a valid context and a plain callback function.
    let filter = unsafe { register(ctx.ctx, Some(on_command), 0) };
    !detached.is_null() && !filter.is_null()
}

/// The command filter: notes the client of a CONFIG command; every other command passes
/// untouched.
extern "C" fn on_command(filter: *mut raw::RedisModuleCommandFilterCtx) {
    guarded((), || {
        // SAFETY: reading the API table; a valid filter context for the duration of the call,
        // and the argument string is only read while it lives.
        unsafe {
            let (Some(count), Some(arg), Some(ptr_len), Some(client)) = (
                raw::RedisModule_CommandFilterArgsCount,
                raw::RedisModule_CommandFilterArgGet,
                raw::RedisModule_StringPtrLen,
                raw::RedisModule_CommandFilterGetClientId,
            ) else {
                return;
            };
            if count(filter) < 2 {
                return;
            }
            let name = arg(filter, 0 as c_int);
            if name.is_null() {
                return;
            }
            let mut len = 0;
            let bytes = ptr_len(name, &mut len);
            if bytes.is_null() || len != 6 {
                return;
            }
            let name = std::slice::from_raw_parts(bytes.cast::<u8>(), len);
            if name.eq_ignore_ascii_case(b"config") {
                CONFIG_CLIENT.store(client(filter), Ordering::Relaxed);
            }
        }
    });
}

/// `id=.. name=.. addr=.. user=..` of the client running the current CONFIG command, taken
/// (each call names one command); `None` when the server does not say.
pub fn config_caller() -> Option<String> {
    let client = CONFIG_CLIENT.swap(0, Ordering::Relaxed);
    let detached = DETACHED.load(Ordering::Relaxed);
    if client == 0 || detached.is_null() {
        return None;
    }
    let ctx = Context::new(detached);
    Some(describe_client(&ctx, client))
}

/// `id=.. name=.. addr=.. user=..` of a connected client, for the audit log.
pub fn describe_client(ctx: &Context, client: u64) -> String {
    let connection = live_connection_of(ctx, client);
    let mut parts = connection.splitn(2, |b| *b == b' ');
    let addr = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let name = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let user = String::from_utf8_lossy(&user_of(ctx, client)).into_owned();
    format!("id={client} name={name} addr={addr} user={user}")
}
