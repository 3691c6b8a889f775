//! Test servers: a real redis-server with the module loaded, in its own temporary directory, on
//! a free loopback port, stopped when the guard drops. Waits are bounded and poll for state.
//!
//! The server binary is `$REDIS_SERVER` or `redis-server` from PATH; the module is `$LOCK_MODULE`
//! or the debug build in `target/` (`make test` builds it first).

#![allow(dead_code)]

pub mod cluster;
pub mod resp;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub use resp::{Conn, Reply};

/// Longest time any test waits for a condition.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub fn redis_server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

pub fn module_path() -> PathBuf {
    if let Ok(path) = std::env::var("LOCK_MODULE") {
        return PathBuf::from(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("target/debug/libredis_lock.so");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build` (make test does)",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// Polls `check` until it returns `Some`, or panics after [`PATIENCE`] with `what`.
pub fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        sleep(Duration::from_millis(5));
    }
}

/// How to start a server.
#[derive(Clone)]
pub struct Config {
    /// `--name value` pairs for redis-server.
    pub server_args: Vec<(String, String)>,
    /// Arguments after the module path.
    pub module_args: Vec<String>,
    pub load_module: bool,
    /// The module to load instead of [`module_path`] (another build: tests/upgrade.rs).
    pub module: Option<PathBuf>,
    /// A Redis Cluster node: cluster mode on, with a cluster bus port of its own.
    pub cluster: bool,
    /// A config file to start from (written as `redis.conf` in the server's directory at the
    /// first start, kept across restarts, so CONFIG REWRITE has somewhere to write).
    pub config_file: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server_args: vec![
                ("save".into(), "".into()),
                ("appendonly".into(), "no".into()),
                ("enable-debug-command".into(), "yes".into()),
                // Replicas sync at once instead of after the default 5 s grace.
                ("repl-diskless-sync-delay".into(), "0".into()),
            ],
            module_args: Vec::new(),
            load_module: true,
            module: None,
            cluster: false,
            config_file: None,
        }
    }
}

impl Config {
    /// Sets (or replaces) a redis-server option.
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.server_args.retain(|(n, _)| n != name);
        self.server_args.push((name.into(), value.into()));
        self
    }

    /// Starts the server with this `lock.namespaces` policy.
    pub fn namespaces(self, policy: &str) -> Self {
        self.with("lock.namespaces", policy)
    }

    pub fn module_arg(mut self, arg: &str) -> Self {
        self.module_args.push(arg.into());
        self
    }
}

/// A running redis-server; killed (and its directory removed) on drop.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    /// The cluster bus port of a cluster node (0 otherwise).
    pub bus_port: u16,
    pub config: Config,
    dir: tempfile::TempDir,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(Config::default())
    }

    pub fn start_with(config: Config) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Server {
            child: None,
            port: 0,
            bus_port: 0,
            config,
            dir,
        };
        server.launch();
        server
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn launch(&mut self) {
        for _ in 0..5 {
            self.port = free_port();
            let mut cmd = Command::new(redis_server_binary());
            if let Some(text) = &self.config.config_file {
                let path = self.dir.path().join("redis.conf");
                if !path.exists() {
                    std::fs::write(&path, text).expect("write redis.conf");
                }
                cmd.arg(path);
            }
            cmd.arg("--port").arg(self.port.to_string());
            cmd.arg("--bind").arg("127.0.0.1");
            cmd.arg("--dir").arg(self.dir.path());
            cmd.arg("--logfile").arg(self.dir.path().join("server.log"));
            cmd.arg("--daemonize").arg("no");
            for (name, value) in &self.config.server_args {
                cmd.arg(format!("--{name}")).arg(value);
            }
            if self.config.cluster {
                // The bus port is not port + 10000, which may be out of range or taken.
                self.bus_port = free_port();
                cmd.args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ]);
                cmd.arg("--cluster-port").arg(self.bus_port.to_string());
            }
            if self.config.load_module {
                let module = self.config.module.clone().unwrap_or_else(module_path);
                cmd.arg("--loadmodule").arg(module);
                cmd.args(&self.config.module_args);
            }
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = cmd
                .spawn()
                .expect("spawn redis-server (install it or set REDIS_SERVER)");
            // Owned by the guard from here on: whatever happens, Drop stops it.
            self.child = Some(child);
            let start = Instant::now();
            let ready = loop {
                let exited = self
                    .child
                    .as_mut()
                    .map(|c| matches!(c.try_wait(), Ok(Some(_))));
                if exited != Some(false) {
                    break false;
                }
                // Ready when the server on the port is ours (another test's server may have
                // taken a port that was free a moment ago: ours then exits and we retry) and
                // answers PING. Ours works in our directory; its pid may not be our child's
                // (`make valgrind` starts servers through a wrapper script).
                let ours = self.dir.path().canonicalize().ok();
                if let Ok(mut conn) = Conn::connect(self.port, Duration::from_secs(1)) {
                    // PING also waits out loading (it answers LOADING until the data is in).
                    if ours.is_some()
                        && conn.try_server_dir() == ours
                        && conn.try_read_ping() == Some(true)
                    {
                        break true;
                    }
                }
                if start.elapsed() > PATIENCE {
                    break false;
                }
                sleep(Duration::from_millis(10));
            };
            if ready {
                return;
            }
            if let Some(mut child) = self.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            if self.log().contains("Can't load module") || self.log().contains("not loaded") {
                break;
            }
        }
        panic!("redis-server did not start; log:\n{}", self.log());
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub fn conn(&self) -> Conn {
        Conn::connect(self.port, PATIENCE).expect("connect")
    }

    /// A RESP3 connection.
    pub fn conn3(&self) -> Conn {
        let mut conn = self.conn();
        let hello = conn.call(&["HELLO", "3"]);
        assert!(matches!(hello, Reply::Map(_)), "{hello:?}");
        conn
    }

    /// False once the server was killed or shut down (and not restarted).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// True when the server process ended by itself (it aborted, say).
    pub fn has_exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Stops the server the way an operator would (SHUTDOWN, which saves if persistence is on).
    pub fn shutdown(&mut self) {
        let mut conn = self.conn();
        conn.send(&["SHUTDOWN"]);
        let _ = conn.try_read();
        self.reap();
    }

    /// Kills the server with SIGKILL: no save, no goodbye.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
        }
        self.reap();
    }

    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let start = Instant::now();
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if start.elapsed() > PATIENCE {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                sleep(Duration::from_millis(10));
            }
        }
    }

    /// Starts the server again on the same directory and configuration.
    pub fn restart(&mut self) {
        self.reap();
        self.launch();
    }

    pub fn shutdown_and_restart(&mut self) {
        self.shutdown();
        self.launch();
    }

    /// One field of INFO, as text.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let info = self.conn().call(&["INFO", section]).text();
        info.lines().find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_string())
        })
    }

    pub fn info_int(&self, field: &str) -> i64 {
        let section = if field.starts_with("lock_") {
            "lock"
        } else {
            "everything"
        };
        self.info_field(section, field)
            .unwrap_or_else(|| panic!("no INFO field {field}"))
            .parse()
            .expect("integer INFO field")
    }

    /// Makes this server a replica of `primary` and waits until the link is up and synced.
    pub fn replicate_from(&self, primary: &Server) {
        let reply = self
            .conn()
            .call(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
        assert_eq!(reply, Reply::status("OK"));
        wait_for("replica link up", || {
            (self
                .info_field("replication", "master_link_status")
                .as_deref()
                == Some("up"))
            .then_some(())
        });
    }

    /// Waits until `count` replicas of this primary acknowledged all writes so far (the
    /// primary's replication offset now). Read from INFO replication rather than with WAIT on
    /// a new connection: WAIT waits for that connection's own last write, and Valkey 8 does not
    /// move it for a command that wrote nothing (a PING), so WAIT would return at once.
    pub fn sync_replicas(&self, count: i64) {
        let target: i64 = self
            .info_field("replication", "master_repl_offset")
            .expect("master_repl_offset")
            .parse()
            .expect("integer offset");
        wait_for(
            &format!("{count} replicas to acknowledge offset {target}"),
            || {
                let info = self.conn().call(&["INFO", "replication"]).text();
                let acked = info
                    .lines()
                    .filter(|line| line.starts_with("slave") && line.contains("state=online"))
                    .filter_map(|line| {
                        line.split(',')
                            .find_map(|field| field.strip_prefix("offset="))
                            .and_then(|offset| offset.parse::<i64>().ok())
                    })
                    .filter(|&offset| offset >= target)
                    .count();
                (acked as i64 >= count).then_some(())
            },
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Conn {
    fn try_read_ping(&mut self) -> Option<bool> {
        self.try_send(&["PING"]).ok()?;
        match self.try_read() {
            Ok(Reply::Status(s)) => Some(s == "PONG"),
            Ok(_) => Some(false),
            Err(_) => None,
        }
    }

    /// The process id of the server on the other end, if it answers.
    /// The server's working directory (`CONFIG GET dir`), canonical.
    fn try_server_dir(&mut self) -> Option<PathBuf> {
        self.try_send(&["CONFIG", "GET", "dir"]).ok()?;
        match self.try_read().ok()? {
            Reply::Array(items) => match items.get(1)? {
                Reply::Bulk(dir) => Path::new(&String::from_utf8_lossy(dir).into_owned())
                    .canonicalize()
                    .ok(),
                _ => None,
            },
            _ => None,
        }
    }
}

/// `LOCK.INFO` as (field, value) pairs with integer values where the server sent integers.
pub fn lock_info(conn: &mut Conn, key: &str) -> Option<Vec<(String, Reply)>> {
    lock_info_fields(conn.call(&["LOCK.INFO", key]))
}

/// A `LOCK.INFO` reply already read (in a transaction's or script's replies) as (field, value)
/// pairs; `None` for a missing key.
pub fn lock_info_fields(reply: Reply) -> Option<Vec<(String, Reply)>> {
    match reply {
        Reply::Nil => None,
        Reply::Array(items) => Some(
            items
                .chunks(2)
                .map(|pair| (pair[0].text(), pair[1].clone()))
                .collect(),
        ),
        Reply::Map(pairs) => Some(pairs.into_iter().map(|(k, v)| (k.text(), v)).collect()),
        other => panic!("unexpected LOCK.INFO reply {other:?}"),
    }
}

/// One field of `LOCK.INFO`.
pub fn lock_field(conn: &mut Conn, key: &str, field: &str) -> Reply {
    lock_info(conn, key)
        .unwrap_or_else(|| panic!("{key} does not exist"))
        .into_iter()
        .find(|(name, _)| name == field)
        .map(|(_, value)| value)
        .unwrap_or_else(|| panic!("LOCK.INFO {key} has no field {field}"))
}

pub fn fence_of(conn: &mut Conn, key: &str) -> i64 {
    lock_field(conn, key, "fence").int()
}

pub fn state_of(conn: &mut Conn, key: &str) -> String {
    lock_field(conn, key, "state").text()
}

/// Acquires and returns the fence, failing the test when the lock is not granted.
pub fn acquire(conn: &mut Conn, key: &str, token: &str, ttl: u64) -> i64 {
    match conn.call(&["LOCK.ACQUIRE", key, token, &ttl.to_string()]) {
        Reply::Int(fence) => fence,
        other => panic!("LOCK.ACQUIRE {key} {token} {ttl}: {other:?}"),
    }
}

/// `command` (its key second, as in every LOCK.* command) answers `error` inside MULTI (as the
/// one reply of EXEC) and inside a script (`redis.pcall`, the key passed as `KEYS[1]`).
pub fn refused_in_multi_and_script(c: &mut Conn, command: &[&str], error: &str) {
    assert_eq!(c.call(&["MULTI"]), Reply::status("OK"));
    assert_eq!(c.call(command), Reply::status("QUEUED"));
    assert_eq!(c.call(&["EXEC"]), Reply::Array(vec![Reply::error(error)]));
    let quoted: Vec<String> = command
        .iter()
        .enumerate()
        .map(|(i, arg)| {
            if i == 1 {
                "KEYS[1]".to_string()
            } else {
                format!("'{arg}'")
            }
        })
        .collect();
    let script = format!("return redis.pcall({})", quoted.join(", "));
    assert_eq!(
        c.call(&["EVAL", &script, "1", command[1]]),
        Reply::error(error)
    );
}

/// `LOCK.ACQUIRE key token ttl` with `extra` options, the reply as it came.
pub fn acquire_with(c: &mut Conn, key: &str, token: &str, ttl: u64, extra: &[&str]) -> Reply {
    let ttl = ttl.to_string();
    let mut call = vec!["LOCK.ACQUIRE", key, token, &ttl];
    call.extend_from_slice(extra);
    c.call(&call)
}

/// `DEBUG DIGEST-VALUE key` as text.
pub fn digest_value(conn: &mut Conn, key: &str) -> String {
    let reply = conn.call(&["DEBUG", "DIGEST-VALUE", key]);
    reply.items()[0].text()
}

/// Subscribes (RESP2) to keyspace notifications of `key` in db 0 and returns the connection.
pub fn subscribe_keyspace(server: &Server, key: &str) -> Conn {
    let mut sub = server.conn();
    let channel = format!("__keyspace@0__:{key}");
    let reply = sub.call(&["SUBSCRIBE", &channel]);
    assert_eq!(reply.items()[0], Reply::bulk("subscribe"));
    sub
}

/// The next keyspace event name a subscription receives.
pub fn next_event(sub: &mut Conn) -> String {
    let message = sub.read();
    let items = message.items();
    assert_eq!(items[0], Reply::bulk("message"), "{message:?}");
    items[2].text()
}

// ---------------------------------------------------------------------------------------------
// Crafted DUMP payloads of the lock type (for RESTORE): fences far ahead of the clock, and
// corrupted values whose checksum is still right so they reach the module's loader.

/// Redis' CRC-64 (Jones polynomial, reflected), the checksum at the end of a DUMP payload.
pub fn crc64(data: &[u8]) -> u64 {
    let mut crc: u64 = 0;
    for &byte in data {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x95AC_9329_AC4B_C9B5
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// RDB length encoding.
pub fn rdb_len(value: u64) -> Vec<u8> {
    if value < 1 << 6 {
        vec![value as u8]
    } else if value < 1 << 14 {
        vec![0x40 | (value >> 8) as u8, value as u8]
    } else if value <= u64::from(u32::MAX) {
        let mut out = vec![0x80];
        out.extend_from_slice(&(value as u32).to_be_bytes());
        out
    } else {
        let mut out = vec![0x81];
        out.extend_from_slice(&value.to_be_bytes());
        out
    }
}

/// Decodes an RDB length at the start of `bytes`: (value, bytes used).
pub fn rdb_len_decode(bytes: &[u8]) -> (u64, usize) {
    match bytes[0] >> 6 {
        0 => (u64::from(bytes[0] & 0x3f), 1),
        1 => ((u64::from(bytes[0] & 0x3f) << 8) | u64::from(bytes[1]), 2),
        _ if bytes[0] == 0x80 => (
            u64::from(u32::from_be_bytes(bytes[1..5].try_into().unwrap())),
            5,
        ),
        _ if bytes[0] == 0x81 => (u64::from_be_bytes(bytes[1..9].try_into().unwrap()), 9),
        _ => panic!("not an RDB length: {:02x}", bytes[0]),
    }
}

/// A module-value field: an unsigned integer (RDB_MODULE_OPCODE_UINT).
pub fn rdb_uint(value: u64) -> Vec<u8> {
    let mut out = vec![2];
    out.extend(rdb_len(value));
    out
}

/// A module-value field: a string buffer (RDB_MODULE_OPCODE_STRING).
pub fn rdb_string(value: &[u8]) -> Vec<u8> {
    let mut out = vec![5];
    out.extend(rdb_len(value.len() as u64));
    out.extend_from_slice(value);
    out
}

/// What the module keeps of a token (src/lock/token.rs): the first 16 bytes of the SHA-256 of a
/// fixed prefix and the token. Never the token itself.
pub fn token_digest(token: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let hash = Sha256::new()
        .chain_update(b"redis-lock token digest v1\0")
        .chain_update(token)
        .finalize();
    hash[..16].to_vec()
}

/// [`token_digest`] as the replication tap shows arguments (lossy text).
pub fn token_digest_text(token: &str) -> String {
    String::from_utf8_lossy(&token_digest(token.as_bytes())).into_owned()
}

/// Module fields of a free lock (tombstone), with the EOF marker.
pub fn tombstone_fields(fence: u64) -> Vec<u8> {
    let mut out = rdb_uint(fence);
    out.extend(rdb_uint(0));
    out.push(0);
    out
}

/// Module fields of a held lock as this release writes them (the token's digest, flags bit 3
/// set), with the EOF marker.
pub fn held_fields(fence: u64, token: &[u8], deadline: u64, holds: u64, flags: u64) -> Vec<u8> {
    held_fields_raw(
        fence,
        &token_digest(token),
        deadline,
        holds,
        flags | DIGEST_FLAG,
    )
}

/// The holder flag saying the token field is the token's digest (version 5).
pub const DIGEST_FLAG: u64 = 8;

/// Module fields of a held lock as releases before version 5 wrote them: the token itself.
pub fn held_fields_of_token(
    fence: u64,
    token: &[u8],
    deadline: u64,
    holds: u64,
    flags: u64,
) -> Vec<u8> {
    held_fields_raw(fence, token, deadline, holds, flags)
}

/// Module fields of a held lock with this token field and flags, with the EOF marker.
pub fn held_fields_raw(fence: u64, token: &[u8], deadline: u64, holds: u64, flags: u64) -> Vec<u8> {
    let mut out = rdb_uint(fence);
    out.extend(rdb_uint(1));
    out.extend(rdb_string(token));
    out.extend(rdb_uint(deadline));
    out.extend(rdb_uint(holds));
    out.extend(rdb_uint(flags));
    out.push(0);
    out
}

/// The module's current RDB encoding version of a lock (src/lock/codec.rs). Version 2 added
/// the lock-delay (a free lock without one is written as version 1 wrote it); version 5 stores
/// a token's digest instead of the token (flags bit 3; a holder without it names the token,
/// which is hashed when loaded: what [`held_fields`] writes).
pub const LOCK_ENCODING_VERSION: u64 = 5;

/// Module fields of a free lock in a lock-delay ending at `until` (version 2), with the EOF
/// marker.
pub fn delayed_tombstone_fields(fence: u64, until: u64) -> Vec<u8> {
    let mut out = rdb_uint(fence);
    out.extend(rdb_uint(2));
    out.extend(rdb_uint(until));
    out.push(0);
    out
}

/// How this server frames a lock value in DUMP: the module type id (with the encoding version in
/// its low 10 bits) and the RDB version of the footer. Learnt from a real DUMP and checked by
/// rebuilding that DUMP byte for byte.
#[derive(Clone, Copy, Debug)]
pub struct LockDumpFormat {
    pub module_id: u64,
    pub rdb_version: [u8; 2],
}

impl LockDumpFormat {
    pub fn learn(conn: &mut Conn) -> LockDumpFormat {
        let scratch = "__lock_dump_format__";
        acquire(conn, scratch, "scratch-token", 60_000);
        assert_eq!(
            conn.call(&["LOCK.RELEASE", scratch, "scratch-token"]),
            Reply::Int(1)
        );
        let fence = fence_of(conn, scratch) as u64;
        let Reply::Bulk(dump) = conn.call(&["DUMP", scratch]) else {
            panic!("DUMP of a lock")
        };
        assert_eq!(conn.call(&["DEL", scratch]), Reply::Int(1));
        assert_eq!(
            dump[0], 7,
            "DUMP of a lock starts with RDB_TYPE_MODULE_2: {dump:?}"
        );
        let (module_id, _) = rdb_len_decode(&dump[1..]);
        let n = dump.len();
        let format = LockDumpFormat {
            module_id,
            rdb_version: [dump[n - 10], dump[n - 9]],
        };
        assert_eq!(
            module_id & 1023,
            LOCK_ENCODING_VERSION,
            "encoding version {LOCK_ENCODING_VERSION}"
        );
        assert_eq!(
            format.payload(&tombstone_fields(fence)),
            dump,
            "crafted DUMP matches the real one"
        );
        format
    }

    /// A DUMP payload of the lock type with these module fields (EOF marker included by the
    /// caller) and a correct checksum.
    pub fn payload(&self, fields: &[u8]) -> Vec<u8> {
        self.payload_with_id(self.module_id, fields)
    }

    /// The same, framed as encoding version `version` of the lock type.
    pub fn payload_of_version(&self, version: u64, fields: &[u8]) -> Vec<u8> {
        self.payload_with_id((self.module_id & !1023) | version, fields)
    }

    pub fn payload_with_id(&self, module_id: u64, fields: &[u8]) -> Vec<u8> {
        let mut out = vec![7];
        out.extend(rdb_len(module_id));
        out.extend_from_slice(fields);
        out.extend_from_slice(&self.rdb_version);
        let crc = crc64(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

/// `RESTORE key 0 payload`.
pub fn restore(conn: &mut Conn, key: &str, payload: &[u8]) -> Reply {
    conn.call(&[&b"RESTORE"[..], key.as_bytes(), b"0", payload])
}

/// Stores under `key` a free lock whose last fence is `fence`, however far ahead of the clock.
pub fn plant_fence(conn: &mut Conn, key: &str, fence: u64) {
    let format = LockDumpFormat::learn(conn);
    assert_eq!(
        restore(conn, key, &format.payload(&tombstone_fields(fence))),
        Reply::status("OK")
    );
    assert_eq!(fence_of(conn, key), fence as i64);
    assert_eq!(state_of(conn, key), "free");
}

/// A fence about ten days ahead of what the server's clock term gives now: only the fence floor
/// can make a later grant exceed it.
pub fn fence_far_ahead(conn: &mut Conn) -> u64 {
    let probe = "__fence_probe__";
    let now_fence = acquire(conn, probe, "probe-token", 60_000) as u64;
    assert_eq!(conn.call(&["DEL", probe]), Reply::Int(1));
    now_fence + (1 << 40)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Waits until `replica` has processed everything `primary` wrote so far (its processed
/// replication offset reaches the primary's offset). Unlike `Server::sync_replicas`, this does
/// not depend on which connection made the writes: WAIT on a fresh connection has nothing to
/// wait for (its own write offset is 0) and returns at once.
pub fn wait_replica_caught_up(primary: &Server, replica: &Server) {
    let offset = |server: &Server, field: &str| -> i64 {
        server
            .info_field("replication", field)
            .unwrap_or_else(|| panic!("no INFO replication field {field}"))
            .parse()
            .expect("integer offset")
    };
    let target = offset(primary, "master_repl_offset");
    wait_for("replica caught up with the primary", || {
        (replica
            .info_field("replication", "master_link_status")
            .as_deref()
            == Some("up")
            && offset(replica, "slave_repl_offset") >= target)
            .then_some(())
    });
}

/// Which server the tests run on, as it names itself in `INFO server`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    Redis,
    Valkey,
}

/// The server under test: product and version. Valkey reports `redis_version:7.2.4` whatever its
/// own version, so its `server_name` and `valkey_version` are read instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub product: Product,
    pub version: (u32, u32, u32),
}

impl Identity {
    /// The server lets modules put commands in ACL categories (RedisModule_SetCommandACLCategories:
    /// Redis 7.2+, every Valkey).
    pub fn command_acl_categories(&self) -> bool {
        match self.product {
            Product::Redis => self.version >= (7, 2, 0),
            Product::Valkey => true,
        }
    }

    /// The server lets modules add their own ACL category (RedisModule_AddACLCategory: Redis
    /// 7.4+, Valkey 8.0+).
    pub fn module_acl_category(&self) -> bool {
        match self.product {
            Product::Redis => self.version >= (7, 4, 0),
            Product::Valkey => self.version >= (8, 0, 0),
        }
    }

    /// `ACL CAT lock` names the module's commands. Valkey 8.0 leaves module commands out of
    /// ACL CAT's lists (seen on 8.0.1; 9.1.2 lists them), though `+@lock` and `-@lock` work.
    pub fn acl_cat_lists_module_commands(&self) -> bool {
        match self.product {
            Product::Redis => self.module_acl_category(),
            Product::Valkey => self.version >= (9, 0, 0),
        }
    }

    /// The server has atomic slot migration (`CLUSTER MIGRATESLOTS`, Valkey 9), which the
    /// module handles.
    pub fn atomic_slot_migration(&self) -> bool {
        self.product == Product::Valkey && self.version >= (9, 0, 0)
    }

    /// A module's command filter learns the client of each command
    /// (RedisModule_CommandFilterGetClientId: Redis 7.2+, Valkey), so CONFIG changes name it.
    pub fn filter_knows_the_client(&self) -> bool {
        match self.product {
            Product::Redis => self.version >= (7, 2, 0),
            Product::Valkey => true,
        }
    }

    /// The server has COMMANDLOG (Valkey 8.1+), beside SLOWLOG.
    pub fn commandlog(&self) -> bool {
        self.product == Product::Valkey && self.version >= (8, 1, 0)
    }
}

impl Server {
    /// The server's product and version, from `INFO server`.
    pub fn identity(&self) -> Identity {
        let valkey = self.info_field("server", "valkey_version");
        let product = match self.info_field("server", "server_name").as_deref() {
            Some("valkey") => Product::Valkey,
            _ => Product::Redis,
        };
        let text = match product {
            Product::Valkey => valkey.expect("Valkey's INFO server has valkey_version"),
            Product::Redis => self
                .info_field("server", "redis_version")
                .expect("INFO server has redis_version"),
        };
        let mut parts = text.split('.').map(|p| {
            p.parse::<u32>()
                .unwrap_or_else(|_| panic!("version {text}"))
        });
        let mut next = || parts.next().unwrap_or(0);
        Identity {
            product,
            version: (next(), next(), next()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Blocked clients and stopped processes, shared by the waiting, operability, replication and
// chaos suites.

pub fn blocked(server: &Server) -> i64 {
    server.info_int("blocked_clients")
}

pub fn wait_blocked(server: &Server, count: i64) {
    wait_for(&format!("{count} blocked clients"), || {
        (blocked(server) == count).then_some(())
    });
}

/// Sends `LOCK.ACQUIRE key token ttl WAIT timeout` on a new connection and waits until the
/// server has blocked it (so queue order is known).
pub fn queue_waiter(server: &Server, key: &str, token: &str, ttl: u64, timeout: u64) -> Conn {
    let before = blocked(server);
    let mut conn = server.conn();
    conn.send(&[
        "LOCK.ACQUIRE",
        key,
        token,
        &ttl.to_string(),
        "WAIT",
        &timeout.to_string(),
    ]);
    wait_blocked(server, before + 1);
    conn
}

/// A map reply (RESP3) or a flat field/value array (RESP2) as a map.
pub fn fields_map(reply: &Reply) -> std::collections::BTreeMap<String, Reply> {
    match reply {
        Reply::Map(pairs) => pairs.iter().map(|(k, v)| (k.text(), v.clone())).collect(),
        other => other
            .items()
            .chunks(2)
            .map(|pair| (pair[0].text(), pair[1].clone()))
            .collect(),
    }
}

/// The address (`CLIENT INFO`'s `addr=`) and the id of this connection.
pub fn client_addr_and_id(c: &mut Conn) -> (String, i64) {
    let info = c.call(&["CLIENT", "INFO"]).text();
    let addr = info
        .split(' ')
        .find_map(|f| f.strip_prefix("addr="))
        .expect("addr= in CLIENT INFO")
        .to_string();
    (addr, c.call(&["CLIENT", "ID"]).int())
}

/// Reads a grant (the fence) from a waiting connection.
pub fn granted(conn: &mut Conn) -> i64 {
    match conn.read() {
        Reply::Int(fence) => fence,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Sends a signal with kill(1).
pub fn signal(sig: &str, pid: u32) -> bool {
    Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A process stopped with SIGSTOP, continued with SIGCONT when this drops (also when a test
/// fails while it is stopped).
pub struct Stopped {
    pid: u32,
    running: bool,
}

impl Stopped {
    pub fn stop(pid: u32) -> Stopped {
        assert!(signal("-STOP", pid), "kill -STOP {pid}");
        Stopped {
            pid,
            running: false,
        }
    }

    pub fn resume(&mut self) {
        if !self.running {
            assert!(signal("-CONT", self.pid), "kill -CONT {}", self.pid);
            self.running = true;
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.running {
            signal("-CONT", self.pid);
        }
    }
}

/// The replication stream of a primary, as a replica receives it: attaches with `SYNC`, skips
/// the RDB snapshot, then reads the commands the primary propagates (PINGs left out).
pub struct ReplicationTap {
    conn: Conn,
}

impl ReplicationTap {
    pub fn attach(primary: &Server) -> ReplicationTap {
        let mut conn = primary.conn();
        conn.send(&["SYNC"]);
        // Newlines keep the link alive while the snapshot is made; then `$<len>` and the bytes.
        let header = loop {
            let line = conn.read_raw_line().expect("SYNC reply");
            if line != b"\n" {
                break line;
            }
        };
        let len: usize = std::str::from_utf8(&header)
            .ok()
            .and_then(|h| h.trim().strip_prefix('$'))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("SYNC answered {:?}", String::from_utf8_lossy(&header)));
        conn.read_raw(len).expect("RDB snapshot");
        ReplicationTap { conn }
    }

    /// The next propagated command, as its arguments (the name upper-cased).
    pub fn next_command(&mut self) -> Vec<Vec<u8>> {
        loop {
            let reply = self.conn.read();
            let mut args: Vec<Vec<u8>> = reply
                .items()
                .iter()
                .map(|a| match a {
                    Reply::Bulk(b) => b.clone(),
                    other => panic!("replicated argument {other:?}"),
                })
                .collect();
            args[0].make_ascii_uppercase();
            if args[0] != b"PING" {
                return args;
            }
        }
    }

    /// The propagated commands up to and including the first whose name is `until`, leaving
    /// out MULTI, EXEC and SELECT; each as its name and its arguments as text.
    pub fn commands_until(&mut self, until: &str) -> Vec<Vec<String>> {
        let mut commands = Vec::new();
        loop {
            let command: Vec<String> = self
                .next_command()
                .iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let done = command[0] == until.to_uppercase();
            if !matches!(command[0].as_str(), "MULTI" | "EXEC" | "SELECT") {
                commands.push(command);
            }
            if done {
                return commands;
            }
        }
    }
}
