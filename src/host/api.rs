//! Which parts of the module API this server has. Every choice is made by whether the function
//! exists in the table the server filled in at load, never by a version number: Valkey 8 and 9
//! report `redis_version:7.2.4` in INFO, and calling a function a server lacks would crash it.

use redis_module::{raw, Context};

use crate::host::server::info_field;

/// Valkey's module option for atomic slot migration (valkeymodule.h: 1 << 5). Redis has no such
/// option (and may give the bit another meaning): set only on Valkey, once the module has
/// subscribed to Valkey's slot migration event.
pub const VALKEY_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION: std::ffi::c_int = 1 << 5;

/// Expands to `[(name, present), ...]` for the named API functions.
macro_rules! presence {
    ($($function:ident),* $(,)?) => {
        [$((
            stringify!($function),
            // SAFETY: reads one function pointer of the API table, which RedisModule_Init filled
            // in before any code of ours ran and nothing writes afterwards.
            unsafe { raw::$function }.is_some(),
        )),*]
    };
}

/// The functions the module cannot work without (all in Redis 7.0 and Valkey 8.0). A server
/// lacking one gets a refused load, not a module that silently skips, say, replication.
fn required() -> impl Iterator<Item = (&'static str, bool)> {
    presence!(
        RedisModule_BlockClientOnKeys,
        RedisModule_Call,
        RedisModule_CallReplyStringPtr,
        RedisModule_CallReplyType,
        RedisModule_CreateCommand,
        RedisModule_CreateTimer,
        RedisModule_EmitAOF,
        RedisModule_Free,
        RedisModule_FreeCallReply,
        RedisModule_FreeServerInfo,
        RedisModule_GetBlockedClientPrivateData,
        RedisModule_GetClientId,
        RedisModule_GetCommand,
        RedisModule_GetCommandKeysWithFlags,
        RedisModule_GetContextFlags,
        RedisModule_GetContextFromIO,
        RedisModule_GetSelectedDb,
        RedisModule_GetServerInfo,
        RedisModule_InfoAddFieldLongLong,
        RedisModule_InfoAddSection,
        RedisModule_IsKeysPositionRequest,
        RedisModule_KeyAtPosWithFlags,
        RedisModule_KeyType,
        RedisModule_LoadConfigs,
        RedisModule_LoadStringBuffer,
        RedisModule_LoadUnsigned,
        RedisModule_Milliseconds,
        RedisModule_ModuleTypeGetType,
        RedisModule_ModuleTypeGetValue,
        RedisModule_ModuleTypeSetValue,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_RedactClientCommandArgument,
        RedisModule_RegisterInfoFunc,
        RedisModule_RegisterNumericConfig,
        RedisModule_Replicate,
        RedisModule_ReplyWithCallReply,
        RedisModule_ReplyWithError,
        RedisModule_SaveStringBuffer,
        RedisModule_SaveUnsigned,
        RedisModule_Scan,
        RedisModule_ScanCursorCreate,
        RedisModule_ScanCursorDestroy,
        RedisModule_SelectDb,
        RedisModule_ServerInfoGetFieldC,
        RedisModule_ServerInfoGetFieldSigned,
        RedisModule_SetCommandInfo,
        RedisModule_SetDisconnectCallback,
        RedisModule_SetModuleOptions,
        RedisModule_SignalKeyAsReady,
        RedisModule_SignalModifiedKey,
        RedisModule_StopTimer,
        RedisModule_StringToLongLong,
        RedisModule_SubscribeToKeyspaceEvents,
        RedisModule_SubscribeToServerEvent,
        RedisModule_UnblockClient,
    )
    .into_iter()
}

/// The required functions this server lacks (empty on every server the module supports).
pub fn missing_required() -> Vec<&'static str> {
    required()
        .filter(|(_, present)| !present)
        .map(|(name, _)| name)
        .collect()
}

/// The optional functions, each deciding one feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Optional {
    /// `RedisModule_SetCommandACLCategories` (Redis 7.2+, Valkey): LOCK.FORCERELEASE in
    /// `@dangerous`, and the commands in `@lock` where that exists.
    pub command_acl_categories: bool,
    /// `RedisModule_AddACLCategory` (Redis 7.4+, Valkey 8.0+): the module's own `@lock`.
    pub module_acl_category: bool,
    /// `RedisModule_AvoidReplicaTraffic`: no replication of expiries during CLIENT PAUSE and
    /// failovers. Without it the module replicates as usual (every supported server has it).
    pub avoid_replica_traffic: bool,
    /// Valkey's atomic slot migration, which the module declares it handles: the server is
    /// Valkey and has the slot migration event (see [`crate::host::events::subscribe`]).
    pub atomic_slot_migration: bool,
}

impl Optional {
    /// What this server offers; `slot_imports`: the module subscribed to Valkey's slot
    /// migration event.
    pub fn probe(slot_imports: bool) -> Self {
        let [categories, category, avoid] = presence!(
            RedisModule_SetCommandACLCategories,
            RedisModule_AddACLCategory,
            RedisModule_AvoidReplicaTraffic,
        );
        Self {
            command_acl_categories: categories.1,
            module_acl_category: category.1,
            avoid_replica_traffic: avoid.1,
            atomic_slot_migration: slot_imports,
        }
    }

    /// One line for the server log, e.g. `command ACL categories: yes, @lock category: no, ...`.
    pub fn describe(&self) -> String {
        let yes_no = |present: bool| if present { "yes" } else { "no" };
        format!(
            "command ACL categories: {}, @lock category: {}, replica traffic check: {}, atomic \
             slot migration: {}",
            yes_no(self.command_acl_categories),
            yes_no(self.module_acl_category),
            yes_no(self.avoid_replica_traffic),
            yes_no(self.atomic_slot_migration),
        )
    }
}

/// The server's product and version as INFO names them: `valkey 9.1.2` (from `server_name` and
/// `valkey_version`), else `redis 7.0.15`. Read once, at load.
pub struct ServerName {
    product: String,
    version: String,
}

impl ServerName {
    pub fn read(ctx: &Context) -> Self {
        let field = |name: &std::ffi::CStr| info_field(ctx, c"server", name);
        ServerName {
            product: field(c"server_name").unwrap_or_else(|| "redis".into()),
            version: field(c"valkey_version")
                .or_else(|| field(c"redis_version"))
                .unwrap_or_else(|| "(unknown version)".into()),
        }
    }

    /// True on Valkey. Only for what Valkey numbers differently from Redis (an event id, an
    /// option bit); features are still probed one by one.
    pub fn is_valkey(&self) -> bool {
        self.product == "valkey"
    }
}

impl std::fmt::Display for ServerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.product, self.version)
    }
}
