//! A module data type: Redis' value callbacks turned into the methods of [`ValueType`].

use std::ffi::{c_int, c_longlong, c_void, CStr};
use std::ptr;

use redis_module::{raw, Context, RedisString};

use crate::host::{guarded, ERR, OK};

/// An RDB stream (also DUMP/RESTORE/MIGRATE payloads) being read or written.
pub struct Rdb(*mut raw::RedisModuleIO);

impl Rdb {
    pub fn load_unsigned(&mut self) -> Option<u64> {
        raw::load_unsigned(self.0).ok()
    }
    pub fn load_bytes(&mut self) -> Option<Vec<u8>> {
        raw::load_string_buffer(self.0)
            .ok()
            .map(|b| b.as_ref().to_vec())
    }
    pub fn save_unsigned(&mut self, value: u64) {
        raw::save_unsigned(self.0, value);
    }
    pub fn save_bytes(&mut self, value: &[u8]) {
        raw::save_slice(self.0, value);
    }

    /// True when this stream is a whole dataset being loaded (an RDB file, `DEBUG RELOAD`, a
    /// replica's full sync), false for a single value (`RESTORE`, `MIGRATE`).
    pub fn is_dataset_load(&self) -> bool {
        // SAFETY: a valid IO handle; the context it gives lives as long as the IO.
        let flags = unsafe {
            let Some(ctx) = raw::RedisModule_GetContextFromIO.map(|f| f(self.0)) else {
                return true;
            };
            raw::RedisModule_GetContextFlags.map_or(0, |f| f(ctx))
        };
        let loading = raw::REDISMODULE_CTX_FLAGS_LOADING | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING;
        flags & loading as c_int != 0
    }
}

/// `DEBUG DIGEST` input for one value.
pub struct Digest(*mut raw::RedisModuleDigest);

impl Digest {
    pub fn add_unsigned(&mut self, value: u64) {
        // SAFETY: a valid digest handle for the duration of the callback.
        unsafe {
            if let Some(add) = raw::RedisModule_DigestAddLongLong {
                add(self.0, value as c_longlong);
            }
        }
    }
    pub fn add_bytes(&mut self, value: &[u8]) {
        // SAFETY: a valid digest handle; Redis reads `len` bytes from the pointer.
        unsafe {
            if let Some(add) = raw::RedisModule_DigestAddStringBuffer {
                add(self.0, value.as_ptr().cast_mut().cast(), value.len());
            }
        }
    }
    pub fn end_sequence(&mut self) {
        // SAFETY: a valid digest handle.
        unsafe {
            if let Some(end) = raw::RedisModule_DigestEndSequence {
                end(self.0);
            }
        }
    }
}

/// The behaviour of a module data type whose values are `Self`.
pub trait ValueType: Sized + 'static {
    /// Decodes a value; `None` refuses it (the reason is logged by the implementation).
    fn rdb_load(version: i32, rdb: &mut Rdb) -> Option<Self>;
    fn rdb_save(&self, rdb: &mut Rdb);
    /// The command (and its arguments after the key) that recreates the value from the AOF.
    fn aof_command(&self) -> (&'static CStr, Vec<Vec<u8>>);
    /// Bytes used, for MEMORY USAGE.
    fn memory(&self) -> usize;
    fn digest(&self, digest: &mut Digest);
    /// The value COPY puts under the new name.
    fn copy(&self) -> Self;
    /// Module-wide data saved before the keys of every RDB file.
    fn aux_save(rdb: &mut Rdb);
    /// Reads what `aux_save` wrote; false refuses the file.
    fn aux_load(version: i32, rdb: &mut Rdb) -> bool;
}

/// The callback table of a data type whose values are `V`.
pub const fn methods<V: ValueType>() -> raw::RedisModuleTypeMethods {
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load::<V>),
        rdb_save: Some(rdb_save::<V>),
        aof_rewrite: Some(aof_rewrite::<V>),
        mem_usage: Some(mem_usage::<V>),
        digest: Some(digest::<V>),
        free: Some(free::<V>),
        aux_load: Some(aux_load::<V>),
        aux_save: Some(aux_save::<V>),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as i32,
        free_effort: None,
        unlink: None,
        copy: Some(copy::<V>),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    }
}

/// The value behind a pointer Redis hands to a callback of this type.
///
/// # Safety
/// `value` points to a live `V` created by this module for this type.
unsafe fn value_ref<'a, V>(value: *const c_void) -> &'a V {
    // SAFETY: as the caller guarantees.
    unsafe { &*value.cast::<V>() }
}

fn boxed<V>(value: V) -> *mut c_void {
    Box::into_raw(Box::new(value)).cast()
}

extern "C" fn rdb_load<V: ValueType>(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guarded(ptr::null_mut(), || {
        V::rdb_load(encver, &mut Rdb(rdb)).map_or(ptr::null_mut(), boxed)
    })
}

extern "C" fn rdb_save<V: ValueType>(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guarded((), || {
        // SAFETY: Redis passes a value of this type.
        unsafe { value_ref::<V>(value) }.rdb_save(&mut Rdb(rdb))
    });
}

extern "C" fn aof_rewrite<V: ValueType>(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guarded((), || {
        // SAFETY: Redis passes a value of this type.
        let (command, args) = unsafe { value_ref::<V>(value) }.aof_command();
        // Owned strings, freed when `strings` drops (after EmitAOF copied them).
        let strings: Vec<RedisString> = args
            .iter()
            .map(|a| RedisString::create_from_slice(ptr::null_mut(), a))
            .collect();
        let mut argv: Vec<*mut raw::RedisModuleString> = strings.iter().map(|s| s.inner).collect();
        // SAFETY: a valid IO handle and key; "sv" = the key string, then a vector of `len`
        // strings, all alive for the call.
        unsafe {
            if let Some(emit) = raw::RedisModule_EmitAOF {
                emit(
                    aof,
                    command.as_ptr(),
                    c"sv".as_ptr(),
                    key,
                    argv.as_mut_ptr(),
                    argv.len(),
                );
            }
        }
    });
}

extern "C" fn mem_usage<V: ValueType>(value: *const c_void) -> usize {
    // SAFETY: Redis passes a value of this type.
    guarded(0, || unsafe { value_ref::<V>(value) }.memory())
}

extern "C" fn digest<V: ValueType>(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guarded((), || {
        // SAFETY: Redis passes a value of this type.
        unsafe { value_ref::<V>(value) }.digest(&mut Digest(md))
    });
}

/// May run on a lazyfree background thread: only drops the value, no Redis API.
extern "C" fn free<V: ValueType>(value: *mut c_void) {
    // SAFETY: Redis passes a value of this type that nobody uses any more; it came from
    // `boxed`, so it is a Box.
    guarded((), || drop(unsafe { Box::from_raw(value.cast::<V>()) }));
}

extern "C" fn copy<V: ValueType>(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guarded(ptr::null_mut(), || {
        // SAFETY: Redis passes a value of this type.
        boxed(unsafe { value_ref::<V>(value) }.copy())
    })
}

extern "C" fn aux_save<V: ValueType>(rdb: *mut raw::RedisModuleIO, _when: c_int) {
    guarded((), || V::aux_save(&mut Rdb(rdb)));
}

extern "C" fn aux_load<V: ValueType>(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
    _when: c_int,
) -> c_int {
    guarded(ERR, || {
        if V::aux_load(encver, &mut Rdb(rdb)) {
            OK
        } else {
            ERR
        }
    })
}

/// Registers the data type during OnLoad.
pub fn create_type(
    ctx: &Context,
    ty: &redis_module::native_types::RedisType,
) -> Result<(), String> {
    ty.create_data_type(ctx.ctx).map_err(str::to_owned)
}
