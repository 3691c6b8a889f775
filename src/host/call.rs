//! Running another command from inside a module command (RM_Call), and answering the server's
//! "where are your keys" question for a command whose keys depend on its arguments (the
//! `getkeys-api` flag).

use std::ffi::{c_int, CString};
use std::ptr::NonNull;

use redis_module::{raw, Context, RedisString, RedisValue};

/// A reply RM_Call returned; freed on drop.
pub struct CallReply(NonNull<raw::RedisModuleCallReply>);

impl Drop for CallReply {
    fn drop(&mut self) {
        // SAFETY: the reply came from RM_Call and is freed exactly once, here.
        unsafe {
            if let Some(free) = raw::RedisModule_FreeCallReply {
                free(self.0.as_ptr());
            }
        }
    }
}

/// Why RM_Call returned no reply at all (with the `E` flag it answers errors as replies, so
/// only a malformed call gets here).
pub struct CallFailed;

/// Runs `argv[0]` with the arguments after it the way a script would for the calling client:
/// as the calling user (ACL rules for the command and its keys, `C`), refused under maxmemory
/// for `deny-oom` commands (`M`), in script mode (`S`: no command scripts may not run, and no
/// write on a read-only replica or without `min-replicas-to-write`), replicated and written to
/// the AOF as itself (`!`), errors returned as replies (`E`), in the caller's protocol (`0`).
pub fn call_as_caller(ctx: &Context, argv: &[RedisString]) -> Result<CallReply, CallFailed> {
    let [name, args @ ..] = argv else {
        return Err(CallFailed);
    };
    let name = CString::new(name.as_slice()).map_err(|_| CallFailed)?;
    let mut raw_args: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    // SAFETY: reading the API table. Then a valid context, a NUL-terminated name, a format
    // whose one `v` consumes exactly the (pointer, length) pair that follows, and strings that
    // stay alive for the call (RM_Call retains what it keeps).
    let reply = unsafe {
        let call = raw::RedisModule_Call.ok_or(CallFailed)?;
        call(
            ctx.ctx,
            name.as_ptr(),
            c"v!CSME0".as_ptr(),
            raw_args.as_mut_ptr(),
            raw_args.len(),
        )
    };
    NonNull::new(reply).map(CallReply).ok_or(CallFailed)
}

/// The text of an error reply (without the leading `-`), or None when `reply` is no error.
pub fn error_text(reply: &CallReply) -> Option<Vec<u8>> {
    // SAFETY: reading the API table, then a live reply; the string pointer is valid for `len`
    // bytes while the reply lives, and is copied at once.
    unsafe {
        let kind = raw::RedisModule_CallReplyType?(reply.0.as_ptr());
        if kind != raw::REDISMODULE_REPLY_ERROR as c_int {
            return None;
        }
        let mut len = 0usize;
        let text = raw::RedisModule_CallReplyStringPtr?(reply.0.as_ptr(), &mut len);
        if text.is_null() {
            return None;
        }
        Some(std::slice::from_raw_parts(text.cast::<u8>(), len).to_vec())
    }
}

/// Sends `reply` to the client as it is (type, protocol and error text unchanged).
pub fn reply_with(ctx: &Context, reply: &CallReply) -> RedisValue {
    // SAFETY: a valid context and a live reply; the function copies it.
    unsafe {
        if let Some(send) = raw::RedisModule_ReplyWithCallReply {
            send(ctx.ctx, reply.0.as_ptr());
        }
    }
    RedisValue::NoReply
}

/// The flags `COMMAND INFO` lists for command `name` (lowercase, e.g. `write`, `blocking`,
/// `noscript`), or None when the server has no such command.
pub fn command_flags(ctx: &Context, name: &str) -> Option<Vec<String>> {
    let reply = ctx.call("COMMAND", &["INFO", name]).ok()?;
    let RedisValue::Array(mut commands) = reply else {
        return None;
    };
    let RedisValue::Array(info) = commands.pop()? else {
        return None;
    };
    let Some(RedisValue::Array(flags)) = info.get(2) else {
        return None;
    };
    Some(
        flags
            .iter()
            .filter_map(|flag| match flag {
                RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.to_lowercase()),
                _ => None,
            })
            .collect(),
    )
}

/// Whether this call of a `getkeys-api` command only asks where its keys are.
pub fn is_keys_position_request(ctx: &Context) -> bool {
    // SAFETY: reading the API table, then a valid context.
    unsafe {
        raw::RedisModule_IsKeysPositionRequest.is_some_and(|is_request| is_request(ctx.ctx) != 0)
    }
}

/// Answers a key position request: argument `position` (the command name is 0) is a key,
/// accessed as `flags` (`REDISMODULE_CMD_KEY_*`) say.
pub fn declare_key(ctx: &Context, position: usize, flags: u32) {
    let (Ok(position), Ok(flags)) = (c_int::try_from(position), c_int::try_from(flags)) else {
        return;
    };
    // SAFETY: reading the API table, then a valid context inside a key position request.
    unsafe {
        if let Some(declare) = raw::RedisModule_KeyAtPosWithFlags {
            declare(ctx.ctx, position, flags);
        }
    }
}

/// The keys of the command `argv` (its name first) as the server finds them: each key's
/// position in `argv` and its `REDISMODULE_CMD_KEY_*` flags. Empty for an unknown command, a
/// wrong argument count or a command without keys.
pub fn command_keys(ctx: &Context, argv: &[RedisString]) -> Vec<(usize, u32)> {
    let Ok(argc) = c_int::try_from(argv.len()) else {
        return Vec::new();
    };
    if argc == 0 {
        return Vec::new();
    }
    let mut raw_args: Vec<*mut raw::RedisModuleString> = argv.iter().map(|a| a.inner).collect();
    let mut count: c_int = 0;
    let mut flags: *mut c_int = std::ptr::null_mut();
    // SAFETY: reading the API table, then a valid context and `argc` live strings; the
    // function fills `count` and `flags` only when it returns positions.
    let positions = unsafe {
        let Some(get_keys) = raw::RedisModule_GetCommandKeysWithFlags else {
            return Vec::new();
        };
        get_keys(ctx.ctx, raw_args.as_mut_ptr(), argc, &mut count, &mut flags)
    };
    if positions.is_null() {
        return Vec::new();
    }
    let count = usize::try_from(count).unwrap_or(0);
    let mut keys = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: both arrays hold `count` ints (flags when not null), as the call promised.
        let (position, flag) = unsafe {
            (
                *positions.add(i),
                if flags.is_null() { 0 } else { *flags.add(i) },
            )
        };
        if let (Ok(position), Ok(flag)) = (usize::try_from(position), u32::try_from(flag)) {
            keys.push((position, flag));
        }
    }
    // SAFETY: the arrays were allocated by the server for us to free with RM_Free, once.
    unsafe {
        if let Some(free) = raw::RedisModule_Free {
            free(positions.cast());
            if !flags.is_null() {
                free(flags.cast());
            }
        }
    }
    keys
}
