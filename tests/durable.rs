//! `FSYNC timeout-ms`: the reply of LOCK.ACQUIRE (and LOCK.RENEW) waits until the change is
//! fsynced to this server's AOF, so a grant a client acts on survives a crash of the machine; a
//! grant not fsynced in time is taken back and the client gets an error, as with SYNC. The
//! module fsyncs the AOF files itself (no server tells a module how far its AOF is fsynced), so
//! this holds whatever `appendfsync` says: these tests use `appendfsync no`, where Redis itself
//! never fsyncs.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

fn aof_config() -> Config {
    Config::default()
        .with("appendonly", "yes")
        .with("appendfsync", "no")
}

fn aof_server() -> Server {
    Server::start_with(aof_config())
}

/// The pages of `path` in the page cache that are dirty or being written back, as the kernel
/// counts them (`cachestat(2)`, Linux 6.5+). Under `appendfsync no` nothing but an fsync cleans
/// a page within seconds of its write (the kernel writes back pages older than 30 s), so 0
/// right after a reply is the observation that the module fsynced the file.
fn unsynced_pages(path: &Path) -> u64 {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    use std::os::fd::AsRawFd;
    const SYS_CACHESTAT: libc::c_long = 451;
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let range = Range { off: 0, len: 0 };
    let mut stat = Stat::default();
    // SAFETY: the syscall reads `range` and writes `stat`, both live and of the kernel's layout.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    assert_eq!(rc, 0, "cachestat: {}", std::io::Error::last_os_error());
    stat.dirty + stat.writeback
}

/// The incremental AOF files in `dir`'s `appendonlydir`.
fn incremental_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir.join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .collect()
}

fn persistence(server: &Server, field: &str) -> i64 {
    server
        .info_field("persistence", field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO persistence {field}"))
}

/// Waits until no child runs and no AOF rewrite is scheduled.
fn wait_no_child(server: &Server) {
    wait_for("no child and no scheduled rewrite", || {
        (persistence(server, "rdb_bgsave_in_progress") == 0
            && persistence(server, "aof_rewrite_in_progress") == 0
            && persistence(server, "aof_rewrite_scheduled") == 0)
            .then_some(())
    });
}

/// Grants `key` with FSYNC and checks the reply came only once every incremental AOF file was
/// clean in the page cache; returns the fence.
fn fsynced_grant(server: &Server, c: &mut Conn, key: &str) -> i64 {
    let fence = c
        .call(&["LOCK.ACQUIRE", key, "t", "600000", "FSYNC", "5000"])
        .int();
    for file in incremental_files(server.dir()) {
        assert_eq!(unsynced_pages(&file), 0, "{} not fsynced", file.display());
    }
    fence
}

/// A plain grant (no FSYNC) leaves its AOF write in the page cache, unsynced: the observation
/// [`fsynced_grant`] relies on can fail.
fn plain_grant_is_not_fsynced(server: &Server, c: &mut Conn, key: &str) {
    acquire(c, key, "t", 600_000);
    let unsynced: u64 = incremental_files(server.dir())
        .iter()
        .map(|f| unsynced_pages(f))
        .sum();
    assert!(unsynced > 0, "a plain grant's write was already clean");
}

/// Slows the next child (BGSAVE or rewrite) to about `keys` x `per_key_us`: the child copies the
/// setting when it forks.
fn slow_children(c: &mut Conn, keys: usize, per_key_us: u64) {
    for i in 0..keys {
        c.call(&["SET", &format!("filler:{i}"), "x"]);
    }
    assert_eq!(
        c.call(&[
            "CONFIG",
            "SET",
            "rdb-key-save-delay",
            &per_key_us.to_string()
        ]),
        Reply::status("OK")
    );
}

fn aof_dir(server: &Server) -> PathBuf {
    server.dir().join("appendonlydir")
}

/// Everything in the AOF's incremental files.
fn incremental_aof(server: &Server) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(aof_dir(server)).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().ends_with(".incr.aof") {
            text.push_str(&String::from_utf8_lossy(&std::fs::read(path).unwrap()));
        }
    }
    text
}

#[test]
fn a_grant_is_answered_once_its_effect_is_fsynced_to_the_aof() {
    let server = aof_server();
    let mut c = server.conn();
    let started = Instant::now();
    let fence = c
        .call(&["LOCK.ACQUIRE", "durable", "t", "60000", "FSYNC", "5000"])
        .int();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(fence > 0);
    assert!(server.info_int("lock_fsyncs") >= 1);
    assert_eq!(server.info_int("lock_sync_confirmed"), 1);
    assert_eq!(server.info_int("lock_fsync_errors"), 0);
    // The effect is in the AOF file the module fsynced.
    let aof = incremental_aof(&server);
    assert!(
        aof.contains("LOCK.APPLY") && aof.contains("durable"),
        "{aof}"
    );
    // A renewal waits the same way; FSYNC beside WAIT for a queued acquirer too.
    assert_eq!(
        c.call(&["LOCK.RENEW", "durable", "t", "60000", "FSYNC", "5000"]),
        Reply::Int(1)
    );
    let mut waiter = server.conn();
    waiter.send(&[
        "LOCK.ACQUIRE",
        "durable",
        "next",
        "60000",
        "WAIT",
        "5000",
        "FSYNC",
        "5000",
    ]);
    wait_blocked(&server, 1);
    assert_eq!(c.call(&["LOCK.RELEASE", "durable", "t"]), Reply::Int(1));
    assert!(waiter.read().int() > fence);
    assert_eq!(server.info_int("lock_sync_confirmed"), 3);
}

#[test]
fn many_clients_at_once_share_fsyncs() {
    let server = aof_server();
    let clients: Vec<Conn> = (0..20)
        .map(|i| {
            let mut c = server.conn();
            c.send(&[
                "LOCK.ACQUIRE",
                &format!("k{i}"),
                "t",
                "60000",
                "FSYNC",
                "5000",
            ]);
            c
        })
        .collect();
    for mut c in clients {
        assert!(c.read().int() > 0);
    }
    assert_eq!(server.info_int("lock_sync_confirmed"), 20);
    let fsyncs = server.info_int("lock_fsyncs");
    assert!((1..=20).contains(&fsyncs), "{fsyncs}");
}

#[test]
fn a_grant_not_fsynced_in_time_is_taken_back_and_a_renewal_reported() {
    let server = aof_server();
    let mut c = server.conn();
    let before = acquire(&mut c, "held", "t", 60_000);
    // The AOF's files are not where the manifest says (the server keeps writing through the
    // descriptor it has): nothing can be confirmed fsynced.
    let away = server.dir().join("appendonlydir.away");
    std::fs::rename(aof_dir(&server), &away).unwrap();
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "60000", "FSYNC", "200"]),
        Reply::error("ERR the grant was not fsynced to the AOF within 200 ms and was undone")
    );
    assert_eq!(state_of(&mut c, "k"), "free");
    assert_eq!(
        c.call(&["LOCK.RENEW", "held", "t", "60000", "FSYNC", "200"]),
        Reply::error(
            "ERR the change was not fsynced to the AOF within 200 ms: a crash of this machine may \
             lose it"
        )
    );
    assert_eq!(fence_of(&mut c, "held"), before);
    assert_eq!(state_of(&mut c, "held"), "held");
    assert!(server.info_int("lock_fsync_errors") > 0);
    assert_eq!(server.info_int("lock_sync_failed"), 2);
    // The audit line and the log send the operator to the disk, not to the replicas.
    let log = server.log();
    assert!(
        log.contains(
            "lock audit: FSYNC grant of 'k' taken back, it was not fsynced to this server's AOF \
             in time"
        ),
        "{log}"
    );
    assert!(!log.contains("its replicas did not acknowledge"), "{log}");
    wait_for("the FSYNC refusal in the log", || {
        server
            .log()
            .contains("lock FSYNC: confirms nothing for now: the AOF manifest cannot be read")
            .then_some(())
    });
    // Back in place: confirmed again.
    std::fs::rename(&away, aof_dir(&server)).unwrap();
    let fence = c
        .call(&["LOCK.ACQUIRE", "k", "t", "60000", "FSYNC", "5000"])
        .int();
    assert!(fence > before);
    // SYNC and FSYNC together: the replicas' part missing is reported as for SYNC alone.
    assert_eq!(
        c.call(&[
            "LOCK.ACQUIRE",
            "k2",
            "t",
            "60000",
            "SYNC",
            "1",
            "100",
            "FSYNC",
            "5000"
        ]),
        Reply::error(
            "NOREPLICAS the grant was not acknowledged by 1 replica(s) within 100 ms and was \
             undone"
        )
    );
    assert_eq!(state_of(&mut c, "k2"), "free");
}

#[test]
fn fsync_is_refused_where_it_cannot_be_kept_and_bad_values_change_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "100"]),
        Reply::error("ERR FSYNC needs appendonly yes")
    );
    assert_eq!(
        c.call(&["LOCK.RENEW", "k", "t", "1000", "FSYNC", "100"]),
        Reply::error("ERR FSYNC needs appendonly yes")
    );
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
    drop(c);
    let server = aof_server();
    let mut c = server.conn();
    refused_in_multi_and_script(
        &mut c,
        &["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "100"],
        "ERR FSYNC cannot wait inside MULTI or a script; send WAITAOF after EXEC instead",
    );
    for (args, error) in [
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC"],
            "ERR invalid FSYNC timeout-ms: missing after FSYNC",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "0"],
            "ERR invalid FSYNC timeout-ms: must be positive",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "x"],
            "ERR invalid FSYNC timeout-ms: not an integer",
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "t", "1000", "FSYNC", "35184372088833"],
            "ERR invalid FSYNC timeout-ms: too large",
        ),
        (
            vec![
                "LOCK.ACQUIRE",
                "k",
                "t",
                "1000",
                "FSYNC",
                "10",
                "FSYNC",
                "10",
            ],
            "ERR option FSYNC given more than once",
        ),
        (
            vec!["LOCK.RENEW", "k", "t", "1000", "FSYNC"],
            "ERR invalid FSYNC timeout-ms: missing after FSYNC",
        ),
        (
            vec!["LOCK.MACQUIRE", "1", "k", "t", "1000", "FSYNC", "10"],
            "ERR option FSYNC is not supported by LOCK.MACQUIRE",
        ),
    ] {
        assert_eq!(c.call(&args), Reply::error(error), "{args:?}");
    }
    assert_eq!(c.call(&["EXISTS", "k"]), Reply::Int(0));
    assert_eq!(server.info_int("lock_fsyncs"), 0);
}

/// The server names a file that needs quoting (a space, a quote, a tab) quoted in its manifest:
/// the module reads the name back as the server does, and fsyncs the file before answering.
#[test]
fn aof_file_names_that_need_quoting_are_fsynced_before_the_reply() {
    for name in ["my aof", "it\"s.aof", "tab\there"] {
        let server = Server::start_with(aof_config().with("appendfilename", name));
        let manifest = std::fs::read_to_string(
            server
                .dir()
                .join("appendonlydir")
                .join(format!("{name}.manifest")),
        )
        .unwrap();
        assert!(manifest.contains("file \""), "quoted: {manifest}");
        let mut c = server.conn();
        plain_grant_is_not_fsynced(&server, &mut c, "plain");
        assert!(fsynced_grant(&server, &mut c, "durable") > 0);
        assert!(server.info_int("lock_fsyncs") >= 1);
        assert_eq!(server.info_int("lock_fsync_errors"), 0, "{name}");
    }
}

/// `CONFIG SET appendonly yes` while a BGSAVE child runs only schedules the AOF: nothing is
/// written anywhere until its rewrite runs, and the manifest left from before `appendonly no`
/// names files the server no longer appends to. Nothing is confirmed until the switch is done;
/// every grant confirmed survives kill -9.
#[test]
fn nothing_is_confirmed_while_the_aof_switch_on_is_only_scheduled() {
    let mut server = aof_server();
    let mut c = server.conn();
    acquire(&mut c, "before", "t", 600_000);
    assert_eq!(
        c.call(&["CONFIG", "SET", "appendonly", "no"]),
        Reply::status("OK")
    );
    slow_children(&mut c, 4, 250_000);
    assert_eq!(
        c.call(&["BGSAVE"]),
        Reply::status("Background saving started")
    );
    assert_eq!(
        c.call(&["CONFIG", "SET", "rdb-key-save-delay", "0"]),
        Reply::status("OK")
    );
    assert_eq!(
        c.call(&["CONFIG", "SET", "appendonly", "yes"]),
        Reply::status("OK")
    );
    assert_eq!(persistence(&server, "aof_rewrite_scheduled"), 1);
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "600000", "FSYNC", "200"]),
        Reply::error("ERR the grant was not fsynced to the AOF within 200 ms and was undone")
    );
    assert_eq!(state_of(&mut c, "k"), "free");
    assert!(server
        .log()
        .contains("lock audit: FSYNC grant of 'k' taken back, it was not fsynced"));
    wait_no_child(&server);
    let fence = fsynced_grant(&server, &mut c, "k");
    server.kill();
    server.restart();
    let mut c = server.conn();
    assert_eq!(state_of(&mut c, "k"), "held");
    assert_eq!(fence_of(&mut c, "k"), fence);
}

/// While the switch-on's rewrite runs the server appends to a temporary file no manifest names:
/// not confirmed; once the rewrite is done, confirmed again. Off and on again, the same.
#[test]
fn appendonly_switched_off_and_on_again_confirms_only_once_the_rewrite_is_done() {
    let mut server = aof_server();
    let mut c = server.conn();
    fsynced_grant(&server, &mut c, "first");
    for _ in 0..2 {
        assert_eq!(
            c.call(&["CONFIG", "SET", "appendonly", "no"]),
            Reply::status("OK")
        );
        assert_eq!(
            c.call(&["LOCK.ACQUIRE", "k", "t", "600000", "FSYNC", "200"]),
            Reply::error("ERR FSYNC needs appendonly yes")
        );
        slow_children(&mut c, 4, 250_000);
        assert_eq!(
            c.call(&["CONFIG", "SET", "appendonly", "yes"]),
            Reply::status("OK")
        );
        assert_eq!(persistence(&server, "aof_rewrite_in_progress"), 1);
        assert_eq!(
            c.call(&["LOCK.ACQUIRE", "k", "t", "600000", "FSYNC", "200"]),
            Reply::error("ERR the grant was not fsynced to the AOF within 200 ms and was undone")
        );
        assert_eq!(
            c.call(&["CONFIG", "SET", "rdb-key-save-delay", "0"]),
            Reply::status("OK")
        );
        wait_no_child(&server);
        fsynced_grant(&server, &mut c, "k");
        assert_eq!(c.call(&["LOCK.RELEASE", "k", "t"]), Reply::Int(1));
    }
    let fence = fsynced_grant(&server, &mut c, "last");
    server.kill();
    server.restart();
    let mut c = server.conn();
    assert_eq!(fence_of(&mut c, "last"), fence);
    assert_eq!(state_of(&mut c, "last"), "held");
}

/// A `temp-*.incr` file left by a crash during a switch-on is named by no manifest: the
/// restarted server's healthy AOF is fsynced and confirmed as always.
#[test]
fn a_temporary_file_left_by_a_crash_does_not_stop_fsync() {
    let mut server = aof_server();
    let mut c = server.conn();
    fsynced_grant(&server, &mut c, "before");
    server.kill();
    std::fs::write(
        server
            .dir()
            .join("appendonlydir")
            .join("temp-appendonly.aof.incr"),
        "*1\r\n$4\r\nPING\r\n",
    )
    .unwrap();
    server.restart();
    let mut c = server.conn();
    assert!(fsynced_grant(&server, &mut c, "after") > 0);
    assert_eq!(server.info_int("lock_fsync_errors"), 0);
}

/// A rewrite that begins right after the grant's write moves appending to a new file; the
/// grant's write is in the old one, which the manifest still names until the rewrite ends: both
/// are fsynced, and the grant survives kill -9.
#[test]
fn a_rewrite_beginning_while_a_grant_waits_for_its_fsync() {
    let mut server = aof_server();
    let mut c = server.conn();
    for round in 0..5 {
        wait_no_child(&server);
        let key = format!("k{round}");
        c.send(&["LOCK.ACQUIRE", &key, "t", "600000", "FSYNC", "5000"]);
        c.send(&["BGREWRITEAOF"]);
        let fence = c.read().int();
        assert!(matches!(c.read(), Reply::Status(_)));
        assert!(fence > 0);
    }
    wait_no_child(&server);
    let fences: Vec<i64> = (0..5).map(|i| fence_of(&mut c, &format!("k{i}"))).collect();
    server.kill();
    server.restart();
    let mut c = server.conn();
    for (i, fence) in fences.iter().enumerate() {
        assert_eq!(fence_of(&mut c, &format!("k{i}")), *fence);
    }
    assert_eq!(server.info_int("lock_fsync_errors"), 0);
}

/// After `CONFIG SET dir` the server keeps appending to the file in the old directory while the
/// manifest is looked for in the new one: nothing is confirmed until a rewrite has put the AOF
/// into the new directory, then grants are fsynced there.
#[test]
fn config_set_dir_with_the_aof_on_confirms_only_where_the_server_appends() {
    let server = Server::start_with(aof_config().with("enable-protected-configs", "yes"));
    let mut c = server.conn();
    fsynced_grant(&server, &mut c, "before");
    let moved = server.dir().join("moved");
    std::fs::create_dir(&moved).unwrap();
    assert_eq!(
        c.call(&["CONFIG", "SET", "dir", moved.to_str().unwrap()]),
        Reply::status("OK")
    );
    assert_eq!(
        c.call(&["LOCK.ACQUIRE", "k", "t", "600000", "FSYNC", "200"]),
        Reply::error("ERR the grant was not fsynced to the AOF within 200 ms and was undone")
    );
    assert_eq!(
        c.call(&["BGREWRITEAOF"]),
        Reply::status("Background append only file rewriting started")
    );
    wait_no_child(&server);
    assert_eq!(
        persistence(&server, "aof_rewrites_consecutive_failures"),
        0,
        "{}",
        server.log()
    );
    let fence = c
        .call(&["LOCK.ACQUIRE", "k", "t", "600000", "FSYNC", "5000"])
        .int();
    assert!(fence > 0);
    let files = incremental_files(&moved);
    assert!(!files.is_empty());
    for file in files {
        assert_eq!(unsynced_pages(&file), 0, "{}", file.display());
    }
}

/// Makes a directory immutable (no file may be created, renamed or removed in it, even by
/// root) until dropped.
struct Immutable(PathBuf);

impl Immutable {
    fn set(dir: &Path) -> Immutable {
        let status = std::process::Command::new("chattr")
            .arg("+i")
            .arg(dir)
            .status()
            .expect("chattr");
        assert!(status.success(), "chattr +i {}", dir.display());
        Immutable(dir.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

/// A read-only AOF directory: the server keeps appending to its open file, which is fsynced and
/// confirmed; a rewrite cannot start there, and grants go on being confirmed in the old file.
#[test]
fn a_read_only_aof_directory_keeps_confirming_what_the_server_appends() {
    let mut server = aof_server();
    let mut c = server.conn();
    fsynced_grant(&server, &mut c, "before");
    {
        let _immutable = Immutable::set(&server.dir().join("appendonlydir"));
        plain_grant_is_not_fsynced(&server, &mut c, "plain");
        fsynced_grant(&server, &mut c, "during");
        let reply = c.call(&["BGREWRITEAOF"]);
        wait_no_child(&server);
        assert!(
            reply.is_error() || persistence(&server, "aof_rewrites_consecutive_failures") > 0,
            "{reply:?}"
        );
        fsynced_grant(&server, &mut c, "after");
    }
    let fence = fence_of(&mut c, "after");
    server.kill();
    server.restart();
    let mut c = server.conn();
    assert_eq!(fence_of(&mut c, "after"), fence);
}
