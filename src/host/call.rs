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

/// One page of `SCAN cursor TYPE type_name COUNT count` in the selected database, run as the
/// module (no ACL check: the caller filters keys by its own rights, see `may_read`): the next
/// cursor (`0` at the end) and the names found. None when the server answered otherwise.
pub fn scan_page(
    ctx: &Context,
    cursor: &[u8],
    type_name: &str,
    count: usize,
) -> Option<(Vec<u8>, Vec<RedisString>)> {
    let count = count.to_string();
    let words: [&[u8]; 5] = [
        cursor,
        b"TYPE",
        type_name.as_bytes(),
        b"COUNT",
        count.as_bytes(),
    ];
    let args: Vec<RedisString> = words
        .iter()
        .map(|word| RedisString::create_from_slice(ctx.ctx, word))
        .collect();
    let mut raw_args: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    // SAFETY: reading the API table. Then a valid context, a NUL-terminated name, a format whose
    // one `v` consumes the (pointer, length) pair after it, and strings alive for the call.
    let reply = unsafe {
        let call = raw::RedisModule_Call?;
        call(
            ctx.ctx,
            c"SCAN".as_ptr(),
            c"vE".as_ptr(),
            raw_args.as_mut_ptr(),
            raw_args.len(),
        )
    };
    let reply = CallReply(NonNull::new(reply)?);
    let cursor = string_at(&reply, 0)?;
    // SAFETY: reading the API table, then a live reply and an element it owns.
    let names = unsafe {
        let element = raw::RedisModule_CallReplyArrayElement?;
        let length = raw::RedisModule_CallReplyLength?;
        let list = element(reply.0.as_ptr(), 1);
        if list.is_null() {
            return None;
        }
        (0..length(list))
            .filter_map(|i| bytes_of(element(list, i)))
            .map(|name| RedisString::create_from_slice(ctx.ctx, &name))
            .collect()
    };
    Some((cursor, names))
}

/// The bytes of the string element `index` of the array `reply`.
fn string_at(reply: &CallReply, index: usize) -> Option<Vec<u8>> {
    // SAFETY: reading the API table, then a live reply; the element is owned by it.
    unsafe {
        let element = raw::RedisModule_CallReplyArrayElement?;
        bytes_of(element(reply.0.as_ptr(), index))
    }
}

/// The bytes of a string reply (copied), or None for a null or a reply of another type.
///
/// # Safety
/// `reply` is null or a call reply alive for the duration of the call.
unsafe fn bytes_of(reply: *mut raw::RedisModuleCallReply) -> Option<Vec<u8>> {
    if reply.is_null() {
        return None;
    }
    let mut len = 0usize;
    // SAFETY: as the caller promises; the pointer is valid for `len` bytes while it lives.
    unsafe {
        let text = raw::RedisModule_CallReplyStringPtr?(reply, &mut len);
        if text.is_null() {
            return None;
        }
        Some(std::slice::from_raw_parts(text.cast::<u8>(), len).to_vec())
    }
}

/// The reader the calling client is: a handle on its ACL user, freed on drop.
pub struct Reader(NonNull<raw::RedisModuleUser>);

impl Reader {
    /// The calling client's ACL user; None when the server cannot tell (no client, or an API
    /// it lacks): such a caller is shown no key.
    pub fn of_caller(ctx: &Context) -> Option<Reader> {
        // SAFETY: reading the API table, then a valid context; the name is freed at once (its
        // copy is what the user lookup keeps), and the user is freed by drop.
        unsafe {
            let name = raw::RedisModule_GetCurrentUserName?(ctx.ctx);
            if name.is_null() {
                return None;
            }
            let user = raw::RedisModule_GetModuleUserFromUserName.map(|get| get(name));
            if let Some(free) = raw::RedisModule_FreeString {
                free(ctx.ctx, name);
            }
            NonNull::new(user?).map(Reader)
        }
    }

    /// True when the user may read the key `name`.
    pub fn may_read(&self, name: &RedisString) -> bool {
        // SAFETY: reading the API table, then a live user and key string.
        unsafe {
            raw::RedisModule_ACLCheckKeyPermissions.is_some_and(|check| {
                check(
                    self.0.as_ptr(),
                    name.inner,
                    raw::REDISMODULE_CMD_KEY_ACCESS as c_int,
                ) == raw::REDISMODULE_OK as c_int
            })
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // SAFETY: a user from RM_GetModuleUserFromUserName, freed once, here.
        unsafe {
            if let Some(free) = raw::RedisModule_FreeModuleUser {
                free(self.0.as_ptr());
            }
        }
    }
}
