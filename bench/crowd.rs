//! Large crowds of `LOCK.ACQUIRE ... WAIT` clients driven from one thread with epoll: one
//! connection per client, each looping grant -> critical section -> release -> wait again, as the
//! contention section's client threads do. Thousands of client threads on the load generators'
//! core measured that core's scheduler (a woken thread waited behind thousands of others); one
//! event loop measures the server.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::common::{Conn, Reply, Server};

/// How long the driver waits for any reply before it gives up on the run (a stuck server).
const STALL: Duration = Duration::from_secs(60);

/// What a connection waits for next.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The reply to `LOCK.ACQUIRE ... WAIT`: its fence.
    Grant,
    /// The reply to `LOCK.RELEASE` (1).
    Released,
}

struct Client {
    stream: TcpStream,
    lock: usize,
    token: String,
    key: String,
    /// Bytes read and not yet parsed into replies.
    pending: Vec<u8>,
    expect: VecDeque<Expect>,
}

/// What a run measured: critical sections per second, and the handoff samples (release sent ->
/// the next holder of the same lock read its grant).
pub struct Crowded {
    pub per_sec: f64,
    pub samples: Vec<Duration>,
    /// The share of the run's time the server's main thread was on a CPU (NaN: not known).
    pub server_busy: f64,
    /// The same for the driver's thread: near 1, the driver, not the server, sets the pace.
    pub driver_busy: f64,
}

/// CPU time of the calling thread, in ns.
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// A run of `clients` connections spread over `locks` locks (client `i` on lock `i % locks`,
/// named by `key`) for `secs` seconds.
pub fn run(
    server: &Server,
    clients: usize,
    locks: usize,
    key: impl Fn(usize) -> String,
    ttl: &str,
    secs: f64,
) -> Crowded {
    let mut control = server.conn();
    assert_eq!(control.call(&["FLUSHALL"]), Reply::status("OK"));
    // The default bound (1000 per lock) would refuse most of a crowd of 4096 on one lock.
    let bound = clients.max(1000).to_string();
    assert_eq!(
        control.call(&["CONFIG", "SET", "lock.max-waiters", &bound]),
        Reply::status("OK")
    );
    let epoll = Epoll::new().expect("epoll_create1");
    let mut crowd: Vec<Client> = (0..clients)
        .map(|id| {
            let stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            stream.set_nonblocking(true).expect("nonblocking");
            epoll.add(stream.as_raw_fd(), id).expect("epoll_ctl");
            Client {
                stream,
                lock: id % locks,
                token: format!("crowd-{id}-5e0f1c"),
                key: key(id),
                pending: Vec::new(),
                expect: VecDeque::new(),
            }
        })
        .collect();
    for client in &mut crowd {
        send(client, &acquire_wait(&client.key, &client.token, ttl));
        client.expect.push_back(Expect::Grant);
    }
    wait_all_queued(&mut control, clients, locks);
    // Per lock: its holder (until it sends its release), and when its last release was sent.
    let mut holder: Vec<Option<usize>> = vec![None; locks];
    let mut released_at: Vec<Option<Instant>> = vec![None; locks];
    let mut samples = Vec::new();
    let mut sections = 0u64;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut last_reply = start;
    let mut events = vec![Event::default(); 256];
    let server_cpu = crate::util::cpu_ns(server.pid());
    let driver_cpu = thread_cpu_ns();
    while Instant::now() < end {
        let ready = epoll.wait(&mut events, 100).expect("epoll_wait");
        if ready == 0 {
            assert!(
                last_reply.elapsed() < STALL,
                "crowd: no reply for {STALL:?}"
            );
            continue;
        }
        for event in &events[..ready] {
            let id = event.id();
            let client = &mut crowd[id];
            read_available(client);
            while let Some(reply) = next_reply(&mut client.pending) {
                last_reply = Instant::now();
                match client.expect.pop_front() {
                    Some(Expect::Grant) => {
                        assert!(reply > 0, "crowd: a grant without a fence: {reply}");
                        let at = Instant::now();
                        let lock = client.lock;
                        assert!(holder[lock].is_none(), "crowd: two holders of lock {lock}");
                        holder[lock] = Some(id);
                        if let Some(released) = released_at[lock] {
                            samples.push(at.saturating_duration_since(released));
                        }
                        sections += 1;
                        // The critical section is empty: release at once and queue again
                        // (pipelined; the server grants the next waiter before it queues this
                        // one behind the others).
                        holder[lock] = None;
                        released_at[lock] = Some(Instant::now());
                        let mut out = release(&client.key, &client.token);
                        out.extend(acquire_wait(&client.key, &client.token, ttl));
                        send(client, &out);
                        client.expect.push_back(Expect::Released);
                        client.expect.push_back(Expect::Grant);
                    }
                    Some(Expect::Released) => {
                        assert_eq!(reply, 1, "crowd: LOCK.RELEASE answered {reply}");
                    }
                    None => panic!("crowd: an unexpected reply {reply}"),
                }
            }
        }
    }
    let elapsed = start.elapsed();
    let busy = |ns: u64| ns as f64 / elapsed.as_nanos() as f64;
    let server_busy = match (server_cpu, crate::util::cpu_ns(server.pid())) {
        (Some(before), Some(after)) => busy(after.saturating_sub(before)),
        _ => f64::NAN,
    };
    let driver_busy = busy(thread_cpu_ns().saturating_sub(driver_cpu));
    // The waits still queued end with their connections.
    drop(crowd);
    samples.sort();
    Crowded {
        per_sec: sections as f64 / elapsed.as_secs_f64(),
        samples,
        server_busy,
        driver_busy,
    }
}

/// Waits until every client but the first of each lock (granted at once) is blocked, at most
/// [`STALL`].
fn wait_all_queued(control: &mut Conn, clients: usize, locks: usize) {
    let deadline = Instant::now() + STALL;
    let queued = clients.saturating_sub(locks);
    loop {
        let blocked = crate::util::info_field(control, "clients", "blocked_clients")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        if blocked >= queued {
            return;
        }
        assert!(Instant::now() < deadline, "crowd: clients did not queue");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn acquire_wait(key: &str, token: &str, ttl: &str) -> Vec<u8> {
    command(&["LOCK.ACQUIRE", key, token, ttl, "WAIT", "0"])
}

fn release(key: &str, token: &str) -> Vec<u8> {
    command(&["LOCK.RELEASE", key, token])
}

fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n{arg}\r\n", arg.len()).into_bytes());
    }
    out
}

/// Writes all of `bytes` (a few dozen: the socket buffer takes them at once).
fn send(client: &mut Client, bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        match client.stream.write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("crowd: write: {e}"),
        }
    }
}

fn read_available(client: &mut Client) {
    let mut buf = [0u8; 4096];
    loop {
        match client.stream.read(&mut buf) {
            Ok(0) => panic!("crowd: the server closed a connection"),
            Ok(n) => client.pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("crowd: read: {e}"),
        }
    }
}

/// The next complete integer reply in `pending`, taken off it. An error reply panics: nothing in
/// this loop may fail.
fn next_reply(pending: &mut Vec<u8>) -> Option<i64> {
    let end = pending.windows(2).position(|w| w == b"\r\n")?;
    let line: Vec<u8> = pending.drain(..end + 2).take(end).collect();
    match line.split_first() {
        Some((b':', digits)) => Some(
            std::str::from_utf8(digits)
                .ok()
                .and_then(|d| d.parse().ok())
                .expect("crowd: an integer reply"),
        ),
        _ => panic!(
            "crowd: unexpected reply {:?}",
            String::from_utf8_lossy(&line)
        ),
    }
}

/// An epoll instance; closed when dropped.
struct Epoll(i32);

#[derive(Clone, Copy)]
#[repr(transparent)]
struct Event(libc::epoll_event);

impl Default for Event {
    fn default() -> Self {
        Event(libc::epoll_event { events: 0, u64: 0 })
    }
}

impl Event {
    fn id(&self) -> usize {
        self.0.u64 as usize
    }
}

impl Epoll {
    fn new() -> io::Result<Epoll> {
        // SAFETY: a plain syscall without pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Epoll(fd))
    }

    fn add(&self, fd: i32, id: usize) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: id as u64,
        };
        // SAFETY: both descriptors are open; `event` is a valid epoll_event for the call.
        if unsafe { libc::epoll_ctl(self.0, libc::EPOLL_CTL_ADD, fd, &mut event) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits at most `timeout_ms` for events; how many `events` were filled.
    fn wait(&self, events: &mut [Event], timeout_ms: i32) -> io::Result<usize> {
        let capacity = i32::try_from(events.len()).unwrap_or(i32::MAX);
        // SAFETY: `events` is writable for `capacity` entries of the layout epoll expects
        // (`Event` is a transparent epoll_event).
        let n =
            unsafe { libc::epoll_wait(self.0, events.as_mut_ptr().cast(), capacity, timeout_ms) };
        if n < 0 {
            let error = io::Error::last_os_error();
            return if error.kind() == io::ErrorKind::Interrupted {
                Ok(0)
            } else {
                Err(error)
            };
        }
        Ok(n as usize)
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}
