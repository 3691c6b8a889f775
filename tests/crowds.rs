//! Crowds of waiters: when tens of thousands of waiting clients disconnect at once, or a FLUSHALL
//! hands tens of thousands of locks to their waiters, the module's work per waiter is O(log n)
//! and the server keeps answering PING. Each crowd is measured against Redis' own blocking
//! (BLPOP waiters disconnecting) in the same run.
//!
//! The crowd is as large as the server's file descriptor limit allows, up to 100,000 (a machine
//! without CAP_SYS_RESOURCE and a hard limit of 20,000 gets about 19,900). The waiting clients
//! live in a child process (this test binary, in crowd mode) over a Unix socket, so that its exit
//! closes them all at once.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// One crowd at a time: the measurements compare runs, and each crowd takes a few GB of memory.
static SERIAL: Mutex<()> = Mutex::new(());

const MAX_CROWD: usize = 100_000;
/// The longest any crowd may take to gather or to leave: far beyond what any pass needs.
const CROWD_PATIENCE: Duration = Duration::from_secs(120);

/// Clients per crowd process: each connection takes two file descriptors in it (the client's
/// reader and writer), and a process may have 20,000 at most on machines like CI's.
const PER_PROCESS: usize = 9_000;

/// Crowd mode: with `CROWD_SOCKET` set, connects `CROWD_COUNT` clients to that Unix socket, sends
/// each the command `CROWD_COMMAND` (space-separated; `{i}` becomes the client's number, counted
/// from `CROWD_FIRST`), says `crowd-ready`, and exits when a line arrives on its standard input (which
/// closes every connection at once).
#[test]
fn crowd_child() {
    let Ok(socket) = std::env::var("CROWD_SOCKET") else {
        return;
    };
    let number = |name: &str| -> usize { std::env::var(name).expect(name).parse().expect(name) };
    let (first, count) = (number("CROWD_FIRST"), number("CROWD_COUNT"));
    let command = std::env::var("CROWD_COMMAND").expect("command");
    let mut conns = Vec::with_capacity(count);
    for i in first..first + count {
        let args: Vec<String> = command
            .split(' ')
            .map(|a| a.replace("{i}", &i.to_string()))
            .collect();
        let mut conn = Conn::connect_unix(Path::new(&socket), PATIENCE).expect("connect");
        conn.send(&args);
        conns.push(conn);
    }
    println!("crowd-ready");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// The waiting clients, in processes of their own.
struct Crowd {
    processes: Vec<(Child, ChildStdin)>,
}

impl Crowd {
    fn gather(socket: &Path, count: usize, command: &str) -> Crowd {
        let (tx, rx) = mpsc::channel();
        let mut crowd = Crowd {
            processes: Vec::new(),
        };
        for first in (0..count).step_by(PER_PROCESS) {
            let mut child = Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", "crowd_child", "--nocapture", "--test-threads=1"])
                .env("CROWD_SOCKET", socket)
                .env("CROWD_FIRST", first.to_string())
                .env("CROWD_COUNT", PER_PROCESS.min(count - first).to_string())
                .env("CROWD_COMMAND", command)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn the crowd");
            let stdout = child.stdout.take().expect("stdout");
            let stdin = child.stdin.take().expect("stdin");
            let tx = tx.clone();
            thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if line.contains("crowd-ready") {
                        let _ = tx.send(());
                    }
                }
            });
            crowd.processes.push((child, stdin));
        }
        for _ in 0..crowd.processes.len() {
            rx.recv_timeout(CROWD_PATIENCE)
                .expect("the crowd to gather");
        }
        crowd
    }

    /// Every client of the crowd disconnects at once.
    fn disperse(&mut self) {
        for (_, stdin) in &mut self.processes {
            let _ = stdin.write_all(b"\n");
        }
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        for (child, _) in &mut self.processes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Pings the server every few ms from its own connection and keeps the slowest round trip.
struct Pinger {
    stop: Arc<AtomicBool>,
    worst: thread::JoinHandle<Duration>,
}

impl Pinger {
    fn start(server: &Server) -> Pinger {
        let stop = Arc::new(AtomicBool::new(false));
        let mut conn = Conn::connect(server.port, CROWD_PATIENCE).expect("connect");
        let flag = stop.clone();
        let worst = thread::spawn(move || {
            let mut worst = Duration::ZERO;
            while !flag.load(Ordering::Relaxed) {
                let sent = Instant::now();
                assert_eq!(conn.call(&["PING"]), Reply::status("PONG"));
                worst = worst.max(sent.elapsed());
                thread::sleep(Duration::from_millis(5));
            }
            worst
        });
        Pinger { stop, worst }
    }

    fn finish(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.worst.join().expect("pinger")
    }
}

/// A server with a Unix socket, room for a crowd, and the crowd size it allows.
fn crowd_server(dir: &Path) -> (Server, PathBuf, usize) {
    let socket = dir.join("redis.sock");
    let config = Config::default()
        .with("unixsocket", socket.to_str().expect("path"))
        .with("unixsocketperm", "700")
        .with("maxclients", &MAX_CROWD.to_string())
        .module_arg("max-waiters")
        .module_arg("1000000");
    let server = Server::start_with(config);
    let maxclients: usize = server.conn().call(&["CONFIG", "GET", "maxclients"]).items()[1]
        .text()
        .parse()
        .expect("maxclients");
    let size = MAX_CROWD.min(maxclients - 100);
    (server, socket, size)
}

/// Waits, bounded, until the whole crowd of `size` is blocked.
fn wait_crowd_blocked(server: &Server, size: usize) {
    let started = Instant::now();
    while blocked(server) < size as i64 {
        assert!(started.elapsed() < CROWD_PATIENCE, "the crowd to block");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Waits, bounded, until no client is blocked.
fn wait_unblocked(server: &Server) {
    let started = Instant::now();
    while blocked(server) > 0 {
        assert!(started.elapsed() < CROWD_PATIENCE, "waiters still blocked");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Takes `count` locks named from `pattern` (`{i}` numbered), pipelined.
fn hold_locks(server: &Server, pattern: &str, count: usize) {
    let mut c = server.conn();
    for start in (0..count).step_by(1000) {
        let end = (start + 1000).min(count);
        for i in start..end {
            c.send(&[
                "LOCK.ACQUIRE",
                &pattern.replace("{i}", &i.to_string()),
                "holder",
                "600000",
            ]);
        }
        for _ in start..end {
            assert!(matches!(c.read(), Reply::Int(_)));
        }
    }
}

/// How long it took, and the slowest PING meanwhile.
struct Measure {
    took: Duration,
    worst_ping: Duration,
}

/// Gathers a crowd sending `command`, then ends its waits with `end` and measures until no
/// client is blocked any more.
fn measure(
    server: &Server,
    socket: &Path,
    size: usize,
    command: &str,
    end: impl FnOnce(&mut Crowd),
) -> Measure {
    let mut crowd = Crowd::gather(socket, size, command);
    wait_crowd_blocked(server, size);
    let pinger = Pinger::start(server);
    let started = Instant::now();
    end(&mut crowd);
    wait_unblocked(server);
    let took = started.elapsed();
    Measure {
        took,
        worst_ping: pinger.finish(),
    }
}

/// Redis' own blocking: BLPOP waiters (one list, or one list each) disconnecting at once.
fn baseline(server: &Server, socket: &Path, size: usize, key: &str) -> Measure {
    measure(
        server,
        socket,
        size,
        &format!("BLPOP {key} 0"),
        Crowd::disperse,
    )
}

/// `module` took at most `factor` times `baseline`, plus half a second for a noisy machine; and
/// so did the slowest PING.
fn assert_within(what: &str, module: &Measure, baseline: &Measure, factor: u32) {
    eprintln!(
        "{what}: {:?} (slowest PING {:?}); Redis' own blocked clients: {:?} (slowest PING {:?})",
        module.took, module.worst_ping, baseline.took, baseline.worst_ping
    );
    let bound = baseline.took * factor + Duration::from_millis(500);
    assert!(
        module.took <= bound,
        "{what} took {:?}, bound {bound:?}",
        module.took
    );
    let ping_bound = baseline.worst_ping * factor + Duration::from_millis(500);
    assert!(
        module.worst_ping <= ping_bound,
        "{what}: a PING waited {:?}, bound {ping_bound:?}",
        module.worst_ping
    );
}

#[test]
fn a_crowd_of_waiters_on_one_lock_disconnecting_at_once() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, socket, size) = crowd_server(dir.path());
    let base = baseline(&server, &socket, size, "list");
    acquire(&mut server.conn(), "k", "holder", 600_000);
    let module = measure(
        &server,
        &socket,
        size,
        "LOCK.ACQUIRE k t 1000 WAIT 0",
        Crowd::disperse,
    );
    assert_within(
        &format!("{size} waiters on one lock disconnecting"),
        &module,
        &base,
        2,
    );
    assert_eq!(server.info_int("lock_waiters"), 0);
    assert_eq!(
        lock_field(&mut server.conn(), "k", "waiters"),
        Reply::Int(0)
    );
}

#[test]
fn who_lists_a_crowd_of_waiters_bounded_by_count() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, socket, size) = crowd_server(dir.path());
    let mut c = server.conn();
    acquire(&mut c, "k", "holder", 600_000);
    let mut crowd = Crowd::gather(&socket, size, "LOCK.ACQUIRE k t{i} 1000 WAIT 0 LABEL w{i}");
    wait_crowd_blocked(&server, size);
    let field = |reply: &Reply, name: &str| fields_map(reply)[name].clone();
    // Without COUNT: the first ten, in queue order, and the total.
    let who = c.call(&["LOCK.WHO", "k"]);
    assert_eq!(field(&who, "waiters_total"), Reply::Int(size as i64));
    let first = field(&who, "waiters");
    let positions: Vec<i64> = first
        .items()
        .iter()
        .map(|w| field(w, "position").int())
        .collect();
    assert_eq!(positions, (1..=10).collect::<Vec<i64>>());
    // COUNT 10000 lists them all (up to that many); a client finds its own place.
    let all = field(&c.call(&["LOCK.WHO", "k", "COUNT", "10000"]), "waiters");
    assert_eq!(all.items().len(), size.min(10_000));
    let middle = &all.items()[size / 2];
    assert!(field(middle, "label").text().starts_with('w'));
    let id = field(middle, "client_id").int().to_string();
    let mine = field(&c.call(&["LOCK.WHO", "k", "CLIENT", &id]), "waiters");
    assert_eq!(mine.items().len(), 1);
    assert_eq!(
        field(&mine.items()[0], "position"),
        Reply::Int(size as i64 / 2 + 1)
    );
    crowd.disperse();
    wait_unblocked(&server);
}

#[test]
fn a_crowd_of_waiters_on_as_many_locks_disconnecting_at_once() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, socket, size) = crowd_server(dir.path());
    let base = baseline(&server, &socket, size, "list:{i}");
    hold_locks(&server, "k:{i}", size);
    let module = measure(
        &server,
        &socket,
        size,
        "LOCK.ACQUIRE k:{i} t 1000 WAIT 0",
        Crowd::disperse,
    );
    assert_within(
        &format!("{size} waiters on {size} locks disconnecting"),
        &module,
        &base,
        2,
    );
    assert_eq!(server.info_int("lock_waiters"), 0);
}

#[test]
fn flushall_hands_a_crowd_of_locks_to_their_waiters() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, socket, size) = crowd_server(dir.path());
    // Redis' own: every BLPOP waiter served by a pipeline of LPUSHes to its list.
    let mut c = server.conn();
    let base = measure(&server, &socket, size, "BLPOP list:{i} 0", |_| {
        for i in 0..size {
            c.send(&["LPUSH", &format!("list:{i}"), "x"]);
        }
        for _ in 0..size {
            assert_eq!(c.read(), Reply::Int(1));
        }
    });
    hold_locks(&server, "k:{i}", size);
    let module = measure(
        &server,
        &socket,
        size,
        "LOCK.ACQUIRE k:{i} t 60000 WAIT 0",
        |_| {
            assert_eq!(c.call(&["FLUSHALL"]), Reply::status("OK"));
        },
    );
    assert_within(
        &format!("FLUSHALL handing {size} locks to their waiters"),
        &module,
        &base,
        // Per waiter, the module does several times what LPUSH does (a fresh lock and its
        // effect, the grant and its effect: about 5x in a debug build); a cost per waiter that
        // grew with the crowd would be far beyond this.
        8,
    );
    assert_eq!(server.info_int("lock_waiters"), 0);
    assert_eq!(server.info_int("lock_held"), size as i64);
    assert_eq!(server.info_int("lock_acquired"), 2 * size as i64);
}
