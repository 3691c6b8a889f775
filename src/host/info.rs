//! The module's INFO section (`INFO lock`, also in `INFO modules` and `INFO everything`).

use std::ffi::{c_int, CString};

use redis_module::raw;
use redis_module::Context;

use crate::host::{guarded, ERR};

/// What the section shows, without the `lock_` prefix Redis adds: text fields first, then
/// integer fields, then dict fields (`name:a=1,b=2`, as INFO keyspace's `db0:keys=...`).
pub struct Fields {
    pub texts: Vec<(&'static str, String)>,
    pub numbers: Vec<(String, i64)>,
    pub dicts: Vec<(String, Vec<(String, i64)>)>,
}

pub trait Section {
    fn fields() -> Fields;
}

pub fn register<S: Section>(ctx: &Context) -> Result<(), String> {
    // SAFETY: reading the API table, then a valid context and a plain callback function.
    let status = unsafe {
        let register = raw::RedisModule_RegisterInfoFunc.ok_or("no RegisterInfoFunc")?;
        register(ctx.ctx, Some(info::<S>))
    };
    if status == ERR {
        return Err("cannot register INFO section".into());
    }
    Ok(())
}

extern "C" fn info<S: Section>(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guarded((), || {
        // SAFETY: reading the API table Redis filled in at load.
        let (Some(section), Some(field), Some(text_field)) = (unsafe {
            (
                raw::RedisModule_InfoAddSection,
                raw::RedisModule_InfoAddFieldLongLong,
                raw::RedisModule_InfoAddFieldCString,
            )
        }) else {
            return;
        };
        // SAFETY: a valid info context and a NUL-terminated (empty: the module's) section name.
        unsafe { section(ctx, c"".as_ptr()) };
        let fields = S::fields();
        for (name, value) in fields.texts {
            if let (Ok(name), Ok(value)) = (CString::new(name), CString::new(value)) {
                // SAFETY: a valid info context and NUL-terminated name and value.
                unsafe { text_field(ctx, name.as_ptr(), value.as_ptr()) };
            }
        }
        for (name, value) in fields.numbers {
            if let Ok(name) = CString::new(name) {
                // SAFETY: a valid info context and a NUL-terminated field name.
                unsafe { field(ctx, name.as_ptr(), value) };
            }
        }
        // SAFETY: reading the API table Redis filled in at load.
        let (Some(begin), Some(end)) = (unsafe {
            (
                raw::RedisModule_InfoBeginDictField,
                raw::RedisModule_InfoEndDictField,
            )
        }) else {
            return;
        };
        for (name, entries) in fields.dicts {
            let Ok(name) = CString::new(name) else {
                continue;
            };
            // SAFETY: a valid info context and a NUL-terminated field name; the dict is ended
            // below, before any other field.
            unsafe { begin(ctx, name.as_ptr()) };
            for (entry, value) in entries {
                if let Ok(entry) = CString::new(entry) {
                    // SAFETY: as above; inside a dict, a field is one of its entries.
                    unsafe { field(ctx, entry.as_ptr(), value) };
                }
            }
            // SAFETY: a valid info context, inside the dict begun above.
            unsafe { end(ctx) };
        }
    });
}
