//! What the server tests share beside the repository's harness (`tests/common`, included by
//! each test file): a client for a test server, the server's command counts, a watchdog pause
//! and a connector that injects the faults of `clients/conformance/README.md`.

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use redis::{ConnectionLike, RedisResult, Value};
use redis_lock_client::{BoxedConnection, Connector};

use crate::common::{wait_for, Conn, Reply, Server, PATIENCE};

/// A `redis` crate client for `server`.
pub fn client(server: &Server) -> redis::Client {
    redis::Client::open(format!("redis://127.0.0.1:{}/", server.port)).expect("client")
}

/// A write of `data_key` through `LOCK.GUARD lock_key fence`, sent directly (not through a
/// helper), is refused with `FENCED`: `fence` is no longer the lock's current one.
pub fn stale_guarded_write_is_fenced(conn: &mut Conn, lock_key: &str, fence: i64, data_key: &str) {
    let raw = conn.call(&[
        "LOCK.GUARD",
        lock_key,
        &fence.to_string(),
        "SET",
        data_key,
        "stale",
    ]);
    assert!(
        matches!(&raw, Reply::Error(e) if e.starts_with("FENCED")),
        "{raw:?}"
    );
}

/// `calls` of a command in INFO commandstats (0 before its first call).
pub fn calls(server: &Server, command: &str) -> i64 {
    server
        .info_field("commandstats", &format!("cmdstat_{command}"))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// LOCK.RENEW calls the server ran.
pub fn renews(server: &Server) -> i64 {
    calls(server, "lock.renew")
}

/// A watchdog pause ([`Lock::before_renewal`]): the watchdog stops at one renewal round (from
/// 0), between its timer and its renewal, until [`go`](Pause::go); bounded, so a failing test
/// never hangs.
///
/// [`Lock::before_renewal`]: redis_lock_client::Lock::before_renewal
#[derive(Clone)]
pub struct Pause {
    round: u32,
    /// (reached, go)
    state: Arc<(Mutex<(bool, bool)>, Condvar)>,
}

impl Pause {
    pub fn at_round(round: u32) -> Pause {
        Pause {
            round,
            state: Arc::default(),
        }
    }

    /// The hook for [`Lock::before_renewal`](redis_lock_client::Lock::before_renewal).
    pub fn hook(&self) -> impl Fn(u32) + Send + Sync + 'static {
        let pause = self.clone();
        move |round| {
            if round == pause.round {
                pause.hold();
            }
        }
    }

    fn hold(&self) {
        let (mutex, wake) = &*self.state;
        let mut state = mutex.lock().expect("pause");
        state.0 = true;
        wake.notify_all();
        let until = Instant::now() + PATIENCE * 3;
        while !state.1 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = wake.wait_timeout(state, left).expect("pause").0;
        }
    }

    pub fn reached(&self) -> bool {
        self.state.0.lock().expect("pause").0
    }

    /// Waits (bounded) until the watchdog is held here.
    pub fn wait_reached(&self) {
        wait_for("the watchdog to reach its pause", || {
            self.reached().then_some(())
        });
    }

    /// Lets the watchdog go on.
    pub fn go(&self) {
        let (mutex, wake) = &*self.state;
        mutex.lock().expect("pause").1 = true;
        wake.notify_all();
    }
}

/// Which commands of a name a [`Fault`] hits, counting from 1.
#[derive(Clone, Debug)]
pub enum Nth {
    Every,
    These(Vec<usize>),
}

/// What happens to a command a [`Fault`] hits.
#[derive(Clone, Debug)]
pub enum FaultKind {
    /// The server runs it; the helper sees a reset connection (an I/O error) instead of the
    /// reply.
    DropReply,
    /// Not sent; the helper gets this error reply (its text, without the `-`), parsed by the
    /// `redis` crate.
    ReplyError(String),
}

/// One fault of `clients/conformance/README.md`: on the nth command named `at`.
#[derive(Clone, Debug)]
pub struct Fault {
    pub at: String,
    pub nth: Nth,
    pub kind: FaultKind,
}

impl Fault {
    pub fn drop_reply(at: &str, nth: usize) -> Fault {
        Fault {
            at: at.to_string(),
            nth: Nth::These(vec![nth]),
            kind: FaultKind::DropReply,
        }
    }
}

/// What a [`Faulty`] connector saw: connections opened and the commands the helper sent (each
/// as its words), faulted ones included.
#[derive(Default)]
pub struct Sent {
    pub connects: usize,
    pub commands: Vec<Vec<Vec<u8>>>,
}

/// A connector between a helper and a real server that records what the helper sends and
/// injects [`Fault`]s; commands are counted by name over all its connections.
#[derive(Clone)]
pub struct Faulty {
    client: redis::Client,
    faults: Arc<Vec<Fault>>,
    sent: Arc<Mutex<Sent>>,
}

impl Faulty {
    pub fn new(client: redis::Client, faults: Vec<Fault>) -> Faulty {
        Faulty {
            client,
            faults: Arc::new(faults),
            sent: Arc::default(),
        }
    }

    pub fn connects(&self) -> usize {
        self.sent.lock().expect("sent").connects
    }

    /// The commands sent, each as its words.
    pub fn commands(&self) -> Vec<Vec<String>> {
        let sent = self.sent.lock().expect("sent");
        sent.commands
            .iter()
            .map(|words| {
                words
                    .iter()
                    .map(|w| String::from_utf8_lossy(w).into_owned())
                    .collect()
            })
            .collect()
    }

    /// How many commands named `name` were sent.
    pub fn count(&self, name: &str) -> usize {
        let sent = self.sent.lock().expect("sent");
        sent.commands
            .iter()
            .filter(|words| words[0].eq_ignore_ascii_case(name.as_bytes()))
            .count()
    }

    /// Records `cmd` and returns the fault that hits it, if any.
    fn record(&self, cmd: &[u8]) -> Option<FaultKind> {
        let words = command_words(cmd);
        let mut sent = self.sent.lock().expect("sent");
        let n = 1 + sent
            .commands
            .iter()
            .filter(|w| w[0].eq_ignore_ascii_case(&words[0]))
            .count();
        let name = String::from_utf8_lossy(&words[0]).into_owned();
        sent.commands.push(words);
        self.faults
            .iter()
            .find(|f| {
                f.at.eq_ignore_ascii_case(&name)
                    && match &f.nth {
                        Nth::Every => true,
                        Nth::These(ns) => ns.contains(&n),
                    }
            })
            .map(|f| f.kind.clone())
    }
}

/// The words of one command in RESP (`*n`, then `$len` and the bytes of each word).
fn command_words(cmd: &[u8]) -> Vec<Vec<u8>> {
    fn line(rest: &[u8]) -> (usize, &[u8]) {
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a RESP line");
        let n = std::str::from_utf8(&rest[1..end])
            .expect("a length")
            .parse()
            .expect("a length");
        (n, &rest[end + 2..])
    }
    let (count, mut rest) = line(cmd);
    let mut words = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, after) = line(rest);
        words.push(after[..len].to_vec());
        rest = &after[len + 2..];
    }
    words
}

struct FaultyConn {
    inner: BoxedConnection,
    faulty: Faulty,
}

impl ConnectionLike for FaultyConn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        match self.faulty.record(cmd) {
            None => self.inner.req_packed_command(cmd),
            Some(FaultKind::ReplyError(text)) => {
                redis::parse_redis_value(format!("-{text}\r\n").as_bytes())?.extract_error()
            }
            Some(FaultKind::DropReply) => {
                self.inner.req_packed_command(cmd)?;
                Err(
                    io::Error::new(io::ErrorKind::ConnectionReset, "reply dropped by the test")
                        .into(),
                )
            }
        }
    }
    /// Pipelines (transactions) pass through unrecorded.
    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.inner.req_packed_commands(cmd, offset, count)
    }
    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
    fn check_connection(&mut self) -> bool {
        self.inner.check_connection()
    }
    fn is_open(&self) -> bool {
        self.inner.is_open()
    }
}

impl Connector for Faulty {
    fn connect(
        &self,
        timeout: Duration,
        read_timeout: Option<Duration>,
    ) -> RedisResult<BoxedConnection> {
        self.sent.lock().expect("sent").connects += 1;
        let inner = self.client.connect(timeout, read_timeout)?;
        Ok(Box::new(FaultyConn {
            inner,
            faulty: self.clone(),
        }))
    }
}
