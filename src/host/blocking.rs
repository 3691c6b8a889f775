//! Clients blocked on a key (`RedisModule_BlockClientOnKeys`): Redis keeps them in arrival
//! order, calls [`OnKey::ready`] for each when the key is signalled as ready, [`OnKey::ended`] on
//! timeout, `CLIENT UNBLOCK` or [`unblock`], [`OnKey::disconnected`] when the client goes away,
//! and [`OnKey::freed`] last, exactly once, with the private data given at blocking time.

use std::ffi::{c_int, c_longlong, c_void};

use redis_module::{raw, Context, RedisString};

use crate::error::LockError;
use crate::host::command::{reply, CommandResult};
use crate::host::{guarded, ERR, OK};

/// A blocked client, as Redis named it. Only touched on the main thread.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BlockedClient(*mut raw::RedisModuleBlockedClient);

// SAFETY: handles are created, used and dropped on Redis' main thread only; they are kept in
// statics, which requires Send.
unsafe impl Send for BlockedClient {}

/// What a kind of blocked client does at each step.
pub trait OnKey {
    /// The private data each blocked client carries.
    type Tag: 'static;
    /// The key was signalled as ready: `Some(reply)` answers and unblocks the client, `None`
    /// keeps it waiting in its place.
    fn ready(ctx: &Context, tag: &Self::Tag) -> Option<CommandResult>;
    /// Timeout, `CLIENT UNBLOCK` or [`unblock`]: the reply.
    fn ended(ctx: &Context, tag: &Self::Tag) -> CommandResult;
    /// The client disconnected (its free call follows later). `ctx` is the disconnecting
    /// client's, in the database it waited in.
    fn disconnected(ctx: &Context, tag: &Self::Tag);
    /// The last call, whatever ended the wait.
    fn freed(tag: Self::Tag);
}

/// Blocks the client of `ctx` on `key` for at most `timeout_ms` (0: no limit).
pub fn block_on_key<B: OnKey>(
    ctx: &Context,
    key: &RedisString,
    timeout_ms: u64,
    tag: B::Tag,
) -> Option<BlockedClient> {
    block_on_keys::<B>(ctx, &[key], timeout_ms, tag)
}

/// Blocks the client of `ctx` on every key of `keys` (its reply callback runs when any of them
/// is signalled) for at most `timeout_ms` (0: no limit).
pub fn block_on_keys<B: OnKey>(
    ctx: &Context,
    keys: &[&RedisString],
    timeout_ms: u64,
    tag: B::Tag,
) -> Option<BlockedClient> {
    let count = c_int::try_from(keys.len()).ok()?;
    let timeout = c_longlong::try_from(timeout_ms).unwrap_or(c_longlong::MAX);
    // SAFETY: reading the API table Redis filled in at load.
    let (Some(block), Some(on_disconnect)) = (unsafe {
        (
            raw::RedisModule_BlockClientOnKeys,
            raw::RedisModule_SetDisconnectCallback,
        )
    }) else {
        return None;
    };
    let privdata = Box::into_raw(Box::new(tag));
    let mut keys: Vec<*mut raw::RedisModuleString> = keys.iter().map(|k| k.inner).collect();
    // SAFETY: a valid context and key; `privdata` is owned by Redis from here on and handed back
    // to `free::<B>` exactly once (or freed below when blocking failed).
    let handle = unsafe {
        block(
            ctx.ctx,
            Some(ready::<B>),
            Some(ended::<B>),
            Some(free::<B>),
            timeout,
            keys.as_mut_ptr(),
            count,
            privdata.cast(),
        )
    };
    if handle.is_null() {
        // SAFETY: Redis did not take `privdata`; it is still ours, from Box::into_raw above.
        drop(unsafe { Box::from_raw(privdata) });
        return None;
    }
    // SAFETY: a live blocked-client handle.
    unsafe { on_disconnect(handle, Some(disconnected::<B>)) };
    Some(BlockedClient(handle))
}

/// Unblocks a client: its [`OnKey::ended`] call answers it.
pub fn unblock(client: BlockedClient) {
    // SAFETY: the handle is live: Redis frees it only after the free callback, and callers
    // only unblock clients still queued (not yet freed).
    unsafe {
        if let Some(unblock) = raw::RedisModule_UnblockClient {
            unblock(client.0, std::ptr::null_mut());
        }
    }
}

/// The private data of the blocked client a callback runs for.
fn tag_of<'a, T>(ctx: *mut raw::RedisModuleCtx) -> Option<&'a T> {
    // SAFETY: a valid callback context; the private data is the `T` given to `block_on_key`
    // (or null), alive until the free callback, which runs after every other callback.
    unsafe {
        let privdata = raw::RedisModule_GetBlockedClientPrivateData?(ctx);
        privdata.cast::<T>().as_ref()
    }
}

extern "C" fn ready<B: OnKey>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let served = guarded(None, || {
        tag_of::<B::Tag>(ctx).and_then(|tag| B::ready(&context, tag))
    });
    match served {
        Some(outcome) => {
            reply(&context, outcome);
            OK
        }
        None => ERR,
    }
}

extern "C" fn ended<B: OnKey>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let outcome = guarded(
        Err(LockError::internal("a wait's end panicked")),
        || match tag_of::<B::Tag>(ctx) {
            Some(tag) => B::ended(&context, tag),
            None => Err(LockError::internal("a waiter without its data")),
        },
    );
    reply(&context, outcome);
    OK
}

extern "C" fn free<B: OnKey>(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    guarded((), || {
        if !privdata.is_null() {
            // SAFETY: `privdata` came from Box::into_raw in `block_on_key`; Redis calls this once.
            let tag = unsafe { Box::from_raw(privdata.cast::<B::Tag>()) };
            B::freed(*tag);
        }
    });
}

extern "C" fn disconnected<B: OnKey>(
    ctx: *mut raw::RedisModuleCtx,
    _handle: *mut raw::RedisModuleBlockedClient,
) {
    guarded((), || {
        if let Some(tag) = tag_of::<B::Tag>(ctx) {
            B::disconnected(&Context::new(ctx), tag);
        }
    });
}
