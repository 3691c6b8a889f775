//! What the audit log needs from the server: who changed a `lock.*` config. A config's set
//! callback is told nothing of the client, so a command filter notes, per `lock.*` name, the
//! client of each CONFIG SET naming it, before it runs (on servers that tell a filter the
//! client: Redis 7.2+, Valkey), and a detached context looks that client up. A CONFIG SET queued
//! in MULTI is noted when queued, so a later CONFIG SET of the same name by another client
//! before the EXEC takes its place.

use std::ffi::c_int;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use redis_module::{raw, Context};

use crate::host::guarded;
use crate::host::server::{connection_of, user_of};

/// Per `lock.*` config named by a CONFIG SET about to run (lowercase), the client that sent it.
/// The set callback takes its entry. A handful at most: only `lock.*` names are kept.
static CONFIG_CLIENTS: Mutex<Vec<(Vec<u8>, u64)>> = Mutex::new(Vec::new());
const CONFIG_CLIENTS_MAX: usize = 64;

fn config_clients() -> MutexGuard<'static, Vec<(Vec<u8>, u64)>> {
    CONFIG_CLIENTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

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

/// The command filter: notes the client of a CONFIG SET of `lock.*` names; every command passes
/// untouched.
extern "C" fn on_command(filter: *mut raw::RedisModuleCommandFilterCtx) {
    guarded((), || {
        // SAFETY: reading the API table; a valid filter context for the duration of the call,
        // and each argument string is only read while it lives.
        unsafe {
            let (Some(count), Some(arg), Some(ptr_len), Some(client)) = (
                raw::RedisModule_CommandFilterArgsCount,
                raw::RedisModule_CommandFilterArgGet,
                raw::RedisModule_StringPtrLen,
                raw::RedisModule_CommandFilterGetClientId,
            ) else {
                return;
            };
            let argument = |at: c_int| -> &[u8] {
                let string = arg(filter, at);
                if string.is_null() {
                    return &[];
                }
                let mut len = 0;
                let bytes = ptr_len(string, &mut len);
                if bytes.is_null() {
                    return &[];
                }
                std::slice::from_raw_parts(bytes.cast::<u8>(), len)
            };
            let argc = count(filter);
            if argc < 4
                || !argument(0).eq_ignore_ascii_case(b"config")
                || !argument(1).eq_ignore_ascii_case(b"set")
            {
                return;
            }
            let id = client(filter);
            let mut clients = config_clients();
            for at in (2..argc).step_by(2) {
                let name = argument(at).to_ascii_lowercase();
                if !name.starts_with(b"lock.") {
                    continue;
                }
                clients.retain(|(known, _)| *known != name);
                if clients.len() >= CONFIG_CLIENTS_MAX {
                    clients.remove(0);
                }
                clients.push((name, id));
            }
        }
    });
}

/// `id=.. name=.. addr=.. user=..` of the client whose CONFIG SET names `lock.<name>` (its
/// entry is taken); `None` when the server does not say.
pub fn config_caller(name: &str) -> Option<String> {
    let wanted = format!("lock.{name}").into_bytes();
    let client = {
        let mut clients = config_clients();
        let at = clients.iter().position(|(known, _)| *known == wanted)?;
        clients.remove(at).1
    };
    let detached = DETACHED.load(Ordering::Relaxed);
    if client == 0 || detached.is_null() {
        return None;
    }
    let ctx = Context::new(detached);
    Some(describe_client(&ctx, client))
}

/// `id=.. name=.. addr=.. user=..` of a connected client, for the audit log.
pub fn describe_client(ctx: &Context, client: u64) -> String {
    let connection = connection_of(ctx, client);
    let mut parts = connection.splitn(2, |b| *b == b' ');
    let addr = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let name = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let user = String::from_utf8_lossy(&user_of(ctx, client)).into_owned();
    format!("id={client} name={name} addr={addr} user={user}")
}
