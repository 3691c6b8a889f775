//! Numeric module configs: `CONFIG GET/SET lock.<name>`, also given as module arguments.

use std::ffi::{c_char, c_int, c_longlong, c_void, CString};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use redis_module::{raw, Context};

use crate::config::NumericConfig;
use crate::host::{ERR, OK};

/// Registers `config` with its load-time value `default`.
pub fn register_numeric(
    ctx: &Context,
    config: &'static NumericConfig,
    default: i64,
) -> Result<(), String> {
    let name = CString::new(config.name).map_err(|e| e.to_string())?;
    // SAFETY: reading the API table Redis filled in at load.
    let register =
        unsafe { raw::RedisModule_RegisterNumericConfig }.ok_or("no RegisterNumericConfig")?;
    // SAFETY: a valid context and name; privdata is a 'static config that outlives the module.
    let status = unsafe {
        register(
            ctx.ctx,
            name.as_ptr(),
            default,
            raw::REDISMODULE_CONFIG_DEFAULT,
            config.min,
            config.max,
            Some(get),
            Some(set),
            None,
            ptr::from_ref(config).cast_mut().cast(),
        )
    };
    if status == ERR {
        return Err(format!("cannot register config lock.{}", config.name));
    }
    Ok(())
}

/// What a config change (after load) calls: the config, its old value, its new one.
pub type OnChange = fn(&'static NumericConfig, i64, i64);

static ON_CHANGE: OnceLock<OnChange> = OnceLock::new();
/// Set once the load-time values are applied: later sets are changes.
static LOADED: AtomicBool = AtomicBool::new(false);

/// Installs what a config change calls (once, at load).
pub fn on_change(hook: OnChange) {
    let _ = ON_CHANGE.set(hook);
}

/// Applies the values given as module arguments, after every config is registered.
pub fn load(ctx: &Context) -> Result<(), String> {
    // SAFETY: a valid context, during OnLoad.
    let status = unsafe { raw::RedisModule_LoadConfigs.map_or(OK, |load| load(ctx.ctx)) };
    if status == ERR {
        return Err("cannot load configs".into());
    }
    LOADED.store(true, Ordering::Relaxed);
    Ok(())
}

extern "C" fn get(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    // SAFETY: privdata is the &'static NumericConfig given at registration.
    let config = unsafe { &*privdata.cast::<NumericConfig>() };
    config.get()
}

extern "C" fn set(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in `get`. Redis has already checked the bounds.
    let config: &'static NumericConfig = unsafe { &*privdata.cast::<NumericConfig>() };
    let old = config.get();
    config.set(value);
    if LOADED.load(Ordering::Relaxed) {
        if let Some(hook) = ON_CHANGE.get() {
            crate::host::guarded((), || hook(config, old, value));
        }
    }
    OK
}

/// A string config: `set` takes a new text, or refuses it (the error is CONFIG SET's reply, or
/// the reason a load is refused); `apply` runs once the server applies a CONFIG SET (never when
/// another of its parameters failed, and not at load); `text` is what CONFIG GET shows.
pub struct StringConfig {
    pub name: &'static str,
    pub set: fn(&[u8]) -> Result<(), String>,
    pub apply: fn() -> Result<(), String>,
    pub text: fn() -> String,
}

/// Registers `config` with its `default` (the server sets it, or the value given, at load).
pub fn register_string(
    ctx: &Context,
    config: &'static StringConfig,
    default: &str,
) -> Result<(), String> {
    let name = CString::new(config.name).map_err(|e| e.to_string())?;
    let default = CString::new(default).map_err(|e| e.to_string())?;
    // SAFETY: reading the API table Redis filled in at load.
    let register =
        unsafe { raw::RedisModule_RegisterStringConfig }.ok_or("no RegisterStringConfig")?;
    // SAFETY: a valid context, name and default; privdata is a 'static config.
    let status = unsafe {
        register(
            ctx.ctx,
            name.as_ptr(),
            default.as_ptr(),
            raw::REDISMODULE_CONFIG_DEFAULT,
            Some(get_string),
            Some(set_string),
            Some(apply_string),
            ptr::from_ref(config).cast_mut().cast(),
        )
    };
    if status == ERR {
        return Err(format!("cannot register config lock.{}", config.name));
    }
    Ok(())
}

thread_local! {
    /// The string the last CONFIG GET of a string config was given: Redis copies it at once,
    /// and it is freed by the next one.
    static SHOWN: std::cell::RefCell<Option<redis_module::RedisString>> =
        const { std::cell::RefCell::new(None) };
}

extern "C" fn get_string(
    _name: *const c_char,
    privdata: *mut c_void,
) -> *mut raw::RedisModuleString {
    // SAFETY: privdata is the &'static StringConfig given at registration.
    let config = unsafe { &*privdata.cast::<StringConfig>() };
    let text = crate::host::guarded(String::new(), || (config.text)());
    let shown = redis_module::RedisString::create_from_slice(ptr::null_mut(), text.as_bytes());
    let inner = shown.inner;
    SHOWN.with(|cell| *cell.borrow_mut() = Some(shown));
    inner
}

extern "C" fn set_string(
    _name: *const c_char,
    value: *mut raw::RedisModuleString,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in `get_string`; `value` is a live string for the call.
    let config = unsafe { &*privdata.cast::<StringConfig>() };
    let bytes = redis_module::RedisString::string_as_slice(value).to_vec();
    let outcome = crate::host::guarded(Err("internal error".to_string()), || (config.set)(&bytes));
    answer(outcome, err)
}

extern "C" fn apply_string(
    _ctx: *mut raw::RedisModuleCtx,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in `get_string`.
    let config = unsafe { &*privdata.cast::<StringConfig>() };
    let outcome = crate::host::guarded(Err("internal error".to_string()), || (config.apply)());
    answer(outcome, err)
}

/// A config callback's answer: OK, or ERR with the message handed to the server in `err`.
fn answer(outcome: Result<(), String>, err: *mut *mut raw::RedisModuleString) -> c_int {
    match outcome {
        Ok(()) => OK,
        Err(message) => {
            if !err.is_null() {
                let error = redis_module::RedisString::create_from_slice(
                    ptr::null_mut(),
                    message.as_bytes(),
                );
                // SAFETY: `err` is the server's out-parameter; it takes the string and frees it.
                unsafe { *err = error.inner };
                std::mem::forget(error);
            }
            ERR
        }
    }
}
