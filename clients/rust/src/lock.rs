//! The lock recipe ([`Lock`]), the held lock ([`LockGuard`]) and its watchdog.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::{ConnectionLike, FromRedisValue, RedisError, RedisResult};

use crate::connector::{BoxedConnection, Connector};
use crate::error::{is_policy, is_unconfirmed, Error, Invalid, LostReason};
use crate::retry::{classify, Retry, RetryPolicy};

type LostCallback = Arc<dyn Fn(LostReason) + Send + Sync>;
type RenewalHook = Arc<dyn Fn(u32) + Send + Sync>;

/// How long an acquire may queue on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    No,
    Limited(Duration),
    Forever,
}

/// How to take one lock: its key, lease, waiting, watchdog and retry settings.
///
/// A `Lock` is a reusable recipe: every [`acquire`](Lock::acquire) draws a new random token, and
/// the returned [`LockGuard`] releases with that token when it is dropped.
#[derive(Clone)]
pub struct Lock {
    connector: Arc<dyn Connector>,
    key: String,
    ttl: Duration,
    wait: Wait,
    shared: bool,
    limit: Option<u32>,
    watchdog: bool,
    retry: RetryPolicy,
    io_timeout: Duration,
    on_lost: Option<LostCallback>,
    renewal_hook: Option<RenewalHook>,
    label: Option<String>,
    durability: Durability,
}

/// `SYNC numreplicas timeout-ms` and `FSYNC timeout-ms`, sent with every `LOCK.ACQUIRE` and
/// `LOCK.RENEW` of a lock when set.
#[derive(Clone, Copy, Debug, Default)]
struct Durability {
    sync: Option<(u32, Duration)>,
    fsync: Option<Duration>,
}

impl Durability {
    fn add_to(&self, cmd: &mut redis::Cmd) {
        if let Some((replicas, timeout)) = self.sync {
            cmd.arg("SYNC").arg(replicas).arg(millis(timeout));
        }
        if let Some(timeout) = self.fsync {
            cmd.arg("FSYNC").arg(millis(timeout));
        }
    }
}

/// The longest lease any server accepts (the highest `lock.max-ttl`: one year), in ms.
const MAX_TTL_MS: u128 = 31_536_000_000;
/// The longest `WAIT` a server accepts, in ms.
const MAX_WAIT_MS: u64 = 1 << 45;
/// The most permits a semaphore can have.
const MAX_LIMIT: u32 = 10_000;
/// The longest label the server accepts, in bytes.
const MAX_LABEL_LEN: usize = 128;

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("shared", &self.shared)
            .field("limit", &self.limit)
            .field("watchdog", &self.watchdog)
            .field("retry", &self.retry)
            .field("io_timeout", &self.io_timeout)
            .field("label", &self.label)
            .field("durability", &self.durability)
            .finish_non_exhaustive()
    }
}

impl Lock {
    /// A lock on `key` with leases of `ttl` (sent in whole milliseconds, rounded up). A zero
    /// ttl, or one above a year, is refused by [`acquire`](Lock::acquire) with
    /// [`Error::Invalid`], as are the other settings that make no sense ([`Invalid`]). By
    /// default it does not wait, has no watchdog, retries with [`RetryPolicy::default`] and
    /// bounds every network wait by 2 s.
    pub fn new(connector: impl Connector, key: impl Into<String>, ttl: Duration) -> Lock {
        Lock {
            connector: Arc::new(connector),
            key: key.into(),
            ttl,
            wait: Wait::No,
            shared: false,
            limit: None,
            watchdog: false,
            retry: RetryPolicy::default(),
            io_timeout: Duration::from_secs(2),
            on_lost: None,
            renewal_hook: None,
            label: None,
            durability: Durability::default(),
        }
    }

    /// `SYNC numreplicas timeout-ms` on every `LOCK.ACQUIRE` and `LOCK.RENEW` (the watchdog's
    /// and [`relabel`](LockGuard::relabel)'s too): the reply comes once that many replicas
    /// acknowledged the change. A grant they do not acknowledge in time is undone by the
    /// server, and acquire returns the server's `NOREPLICAS ...` error ([`Error::Redis`]); a
    /// renewal stays, with the same error. The timeout is sent in whole ms, rounded up; give
    /// [`io_timeout`](Lock::io_timeout) more. A zero timeout, or one above 2^45 ms, is refused
    /// by [`acquire`](Lock::acquire) ([`Invalid::Sync`]).
    pub fn sync(mut self, replicas: u32, timeout: Duration) -> Lock {
        self.durability.sync = Some((replicas, timeout));
        self
    }

    /// `FSYNC timeout-ms` on every `LOCK.ACQUIRE` and `LOCK.RENEW` (the watchdog's and
    /// [`relabel`](LockGuard::relabel)'s too): the reply comes once the change is fsynced to
    /// the server's AOF. A server without `appendonly yes` answers `ERR FSYNC needs appendonly
    /// yes` ([`Error::Redis`]). The timeout is sent in whole ms, rounded up; give
    /// [`io_timeout`](Lock::io_timeout) more. A zero timeout, or one above 2^45 ms, is refused
    /// by [`acquire`](Lock::acquire) ([`Invalid::Fsync`]).
    pub fn fsync(mut self, timeout: Duration) -> Lock {
        self.durability.fsync = Some(timeout);
        self
    }

    /// A public label for the grant (`LABEL text`), such as `host-7:pid-42`: operators see it
    /// in `LOCK.WHO` and the long-hold log beside the connection that took the lock. It is not
    /// a secret and proves nothing. 1 to 128 bytes of printable ASCII without spaces, else
    /// [`Invalid::Label`]. Needs a server module of 0.2.0 or later.
    pub fn label(mut self, label: impl Into<String>) -> Lock {
        self.label = Some(label.into());
        self
    }

    /// Queue on the server for up to `timeout` when the lock is held (`WAIT timeout-ms`). A
    /// zero timeout means: do not wait. Above 2^45 ms is refused ([`Invalid::Wait`]).
    pub fn wait(mut self, timeout: Duration) -> Lock {
        self.wait = if timeout.is_zero() {
            Wait::No
        } else {
            Wait::Limited(timeout)
        };
        self
    }

    /// Queue on the server without a time limit (`WAIT 0`). The connection then has no read
    /// timeout while it waits.
    pub fn wait_forever(mut self) -> Lock {
        self.wait = Wait::Forever;
        self
    }

    /// Take a shared hold (`SHARED`): any number of shared holders at once, never beside an
    /// exclusive one. The guard's fence proves the hold, not exclusivity. Not together with
    /// [`limit`](Lock::limit) ([`Invalid::SharedWithLimit`]).
    pub fn shared(mut self) -> Lock {
        self.shared = true;
        self
    }

    /// Take one of the `permits` of a semaphore (`LIMIT permits`, 1 to 10000, else
    /// [`Invalid::Limit`]): every `Lock` on the key must name the same number. Not together
    /// with [`shared`](Lock::shared).
    pub fn limit(mut self, permits: u32) -> Lock {
        self.limit = Some(permits);
        self
    }

    /// Run a watchdog thread that renews the lease every third of the ttl while the guard
    /// lives (off by default).
    pub fn watchdog(mut self, on: bool) -> Lock {
        self.watchdog = on;
        self
    }

    /// Called exactly once per lost grant, from whichever thread notices first: the watchdog,
    /// or yours in `check()`, `fenced()`, `is_lost()`, `lost_reason()`, `renew()`, `guarded()`,
    /// `transaction()`, `release()` or drop. Never called for a grant released while held, and
    /// never with the guard's own mutexes held. Keep it short; it must not wait for the guard's
    /// own methods.
    pub fn on_lost(mut self, callback: impl Fn(LostReason) + Send + Sync + 'static) -> Lock {
        self.on_lost = Some(Arc::new(callback));
        self
    }

    /// How to retry `TRYAGAIN`, `CLUSTERDOWN`, `UNBLOCKED` and I/O errors.
    pub fn retry(mut self, policy: RetryPolicy) -> Lock {
        self.retry = policy;
        self
    }

    /// Bound on connecting, writing and each wait for a reply (default 2 s). The watchdog
    /// waits at most half the ttl for a reply, if that is shorter.
    pub fn io_timeout(mut self, timeout: Duration) -> Lock {
        self.io_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Test hook: called by the watchdog thread with the renewal round's number (from 0) just
    /// before it takes its turn to renew; blocking in it simulates a stalled timer thread.
    #[doc(hidden)]
    pub fn before_renewal(mut self, hook: impl Fn(u32) + Send + Sync + 'static) -> Lock {
        self.renewal_hook = Some(Arc::new(hook));
        self
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The first setting that makes no sense, checked in the same order as the Python helper.
    fn invalid(&self) -> Option<Invalid> {
        let ttl_ms = self.ttl.as_nanos().div_ceil(1_000_000);
        if self.ttl.is_zero() || ttl_ms > MAX_TTL_MS {
            return Some(Invalid::Ttl);
        }
        if matches!(self.wait, Wait::Limited(d) if millis_floor(d) > MAX_WAIT_MS) {
            return Some(Invalid::Wait);
        }
        if self.limit.is_some_and(|n| n == 0 || n > MAX_LIMIT) {
            return Some(Invalid::Limit);
        }
        if self.shared && self.limit.is_some() {
            return Some(Invalid::SharedWithLimit);
        }
        if self.watchdog && ttl_ms < 3 {
            return Some(Invalid::WatchdogTtl);
        }
        if self.retry.attempts == 0 || self.retry.deadline.is_zero() {
            return Some(Invalid::Retry);
        }
        if self.label.as_deref().is_some_and(|l| !valid_label(l)) {
            return Some(Invalid::Label);
        }
        // As the server's SYNC and FSYNC take them: 1 ms to 2^45 ms (sent rounded up).
        let bad_timeout =
            |d: Duration| d.is_zero() || d.as_nanos().div_ceil(1_000_000) > u128::from(MAX_WAIT_MS);
        if self
            .durability
            .sync
            .is_some_and(|(_, timeout)| bad_timeout(timeout))
        {
            return Some(Invalid::Sync);
        }
        if self.durability.fsync.is_some_and(bad_timeout) {
            return Some(Invalid::Fsync);
        }
        None
    }

    /// Runs `body` with the fence while holding the lock, then releases it. When the lock is
    /// not granted, `body` is never called and the result is [`Error::NotAcquired`] (or another
    /// error). When the lock was lost before `body` returned, the result is [`Error::Lost`]
    /// (body's value is dropped: its effects must have been fenced to be safe); when the
    /// release itself fails, that error.
    pub fn run<T>(&self, body: impl FnOnce(i64) -> T) -> Result<T, Error> {
        let guard = self.acquire()?;
        let value = body(guard.fence());
        let lost = guard.check();
        guard.release()?;
        lost.map(|()| value)
    }

    /// Takes the lock: `Ok` with a guard holding the fence, [`Error::Invalid`] (before any
    /// command) when a setting makes no sense, [`Error::NotAcquired`] when another
    /// token holds it (or the wait budget ran out), [`Error::Connection`] at once when no
    /// connection could be opened before any request was sent (nothing granted),
    /// [`Error::Unknown`] when a request was sent, its reply lost, and the retries (attempts or
    /// deadline) were used up without learning the outcome, or a retry after such a lost reply
    /// was answered by an error that is not retried (`-POLICY`, `-READONLY`, `-MOVED`,
    /// `-NOREPLICAS` ...: it says nothing about the lost try; then one `LOCK.RELEASE` with the
    /// token gives back what may have been granted, best effort). [`Error::Policy`] when the server's lock namespaces
    /// refused the request (nothing changed), also when they refused the renewal that anchors a
    /// grant after a wait longer than a tenth of the lease (the grant was released first).
    ///
    /// Retries send the same token, so a grant whose reply was lost is returned (same fence)
    /// by the next attempt. With a limited wait, a retry waits only for what is left of the
    /// budget, and once it is spent makes one last attempt without `WAIT`.
    pub fn acquire(&self) -> Result<LockGuard, Error> {
        if let Some(why) = self.invalid() {
            return Err(Error::Invalid(why));
        }
        let token = new_token();
        let ttl_ms = millis(self.ttl);
        let deadline = match self.wait {
            Wait::Limited(d) => Some(Instant::now() + d),
            _ => None,
        };
        let mut conn: Option<(BoxedConnection, Option<Duration>)> = None;
        let mut failures = 0u32;
        // A request was sent and its reply lost: it may have been granted.
        let mut maybe_granted = false;
        let mut give_up_at: Option<Instant> = None;
        loop {
            let wait_arg = match self.wait {
                Wait::No => None,
                Wait::Forever => Some(0),
                Wait::Limited(_) => {
                    let left = deadline
                        .map(|d| d.saturating_duration_since(Instant::now()))
                        .unwrap_or_default();
                    // WAIT 0 would mean "forever": a spent budget makes a plain attempt.
                    Some(millis_floor(left)).filter(|ms| *ms > 0)
                }
            };
            let read_timeout = match wait_arg {
                None => Some(self.io_timeout),
                Some(0) => None,
                Some(ms) => Some(Duration::from_millis(ms) + self.io_timeout),
            };
            if conn.as_ref().is_some_and(|(_, t)| *t != read_timeout) {
                conn = None;
            }
            let result = match conn.as_mut() {
                Some((c, _)) => Ok(c),
                None => self
                    .connector
                    .connect(self.io_timeout, read_timeout)
                    .map(|c| &mut conn.insert((c, read_timeout)).0)
                    .map_err(Failure::Connect),
            }
            .and_then(|c| {
                let sent_at = Instant::now();
                let mut cmd = redis::cmd("LOCK.ACQUIRE");
                cmd.arg(&self.key).arg(&token).arg(ttl_ms);
                if self.shared {
                    cmd.arg("SHARED");
                }
                if let Some(permits) = self.limit {
                    cmd.arg("LIMIT").arg(permits);
                }
                if let Some(ms) = wait_arg {
                    cmd.arg("WAIT").arg(ms);
                }
                if let Some(label) = &self.label {
                    cmd.arg("LABEL").arg(label);
                }
                self.durability.add_to(&mut cmd);
                cmd.query::<Option<i64>>(c.as_mut())
                    .map(|reply| (reply, sent_at))
                    .map_err(Failure::Call)
            });
            match result {
                Ok((Some(fence), sent_at)) => {
                    // Keep the connection for release only if its read timeout is the plain one.
                    let main = conn
                        .filter(|(_, t)| *t == Some(self.io_timeout))
                        .map(|(c, _)| c);
                    return self.start_guard(token, fence, sent_at, main);
                }
                Ok((None, _)) => return Err(Error::NotAcquired),
                Err(failure) => {
                    let sent = matches!(failure, Failure::Call(_));
                    let e = failure.into_error();
                    match classify(&e) {
                        // A try whose reply was lost may have been granted: an answer that is
                        // not retried (-POLICY: the policy changed since; -READONLY, -MOVED:
                        // this retry reached another node; -NOREPLICAS: the token's grant
                        // stands, unconfirmed) says nothing about that try: unknown.
                        Retry::No if maybe_granted => {
                            self.forget(&token, conn.take().map(|(c, _)| c));
                            return Err(Error::Unknown(e));
                        }
                        // A -POLICY reply comes back as Error::Policy.
                        Retry::No => return Err(Error::from(e)),
                        Retry::Resend => {}
                        Retry::Reconnect => {
                            conn = None;
                            if !sent && !maybe_granted {
                                return Err(Error::Connection(e));
                            }
                            maybe_granted |= sent;
                        }
                    }
                    failures += 1;
                    match self.retry.pause(failures, &mut give_up_at) {
                        Some(pause) => thread::sleep(pause),
                        None => {
                            if maybe_granted {
                                self.forget(&token, conn.take().map(|(c, _)| c));
                            }
                            return Err(Error::Unknown(e));
                        }
                    }
                }
            }
        }
    }

    /// After an acquire that gave up without learning whether a try was granted: one
    /// `LOCK.RELEASE` with the token, best effort (the lease ends the grant otherwise).
    fn forget(&self, token: &str, conn: Option<BoxedConnection>) {
        let mut slot = conn;
        let _ = with_conn(
            &mut slot,
            &*self.connector,
            self.io_timeout,
            self.io_timeout,
            |c| {
                redis::cmd("LOCK.RELEASE")
                    .arg(&self.key)
                    .arg(token)
                    .query::<i64>(c)
            },
        );
    }

    fn start_guard(
        &self,
        token: String,
        fence: i64,
        sent_at: Instant,
        conn: Option<BoxedConnection>,
    ) -> Result<LockGuard, Error> {
        // The lease is counted from just before the ACQUIRE that got the fence was sent.
        let epoch = sent_at;
        let lease_end = sent_at + lease_len(self.ttl);
        let shared = Arc::new(Shared {
            connector: Arc::clone(&self.connector),
            key: self.key.clone(),
            token,
            ttl: self.ttl,
            fence,
            retry: self.retry,
            io_timeout: self.io_timeout,
            epoch,
            lease_end_ns: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            reason: AtomicU8::new(0),
            state: Mutex::new(RenewState { stopping: false }),
            wake: Condvar::new(),
            on_lost: self.on_lost.clone(),
            renewal_hook: self.renewal_hook.clone(),
            durability: self.durability,
        });
        shared.set_lease_end(lease_end);
        let mut guard = LockGuard {
            shared: Arc::clone(&shared),
            conn: Mutex::new(conn),
            watchdog: None,
            released: false,
        };
        if sent_at.elapsed() > self.ttl / 10 {
            // Granted at an unknown moment of a long wait: only "after sent_at" is known, so the
            // local lease could already look over. A renewal now starts a lease whose start is
            // known.
            let outcome = {
                let mut conn = lock_ignoring_poison(&guard.conn);
                shared.renew_locked(&mut conn, self.io_timeout, false)
            };
            match outcome {
                Renewal::Renewed(_) => {}
                Renewal::Lost(_) => {
                    guard.released = true;
                    return Err(Error::NotAcquired);
                }
                Renewal::Failed(e) | Renewal::Unconfirmed(e) => {
                    let _ = guard.release_inner(false);
                    return Err(Error::Unknown(e));
                }
                Renewal::Refused(e) => {
                    let _ = guard.release_inner(false);
                    return Err(Error::from(e));
                }
            }
        }
        if self.watchdog {
            let spawned = thread::Builder::new()
                .name(format!("lock-watchdog:{}", self.key))
                .spawn(move || watchdog(shared));
            match spawned {
                Ok(handle) => guard.watchdog = Some(handle),
                Err(e) => {
                    // No watchdog, no guard: give the lock back rather than hold it unrenewed.
                    let _ = guard.release_inner(false);
                    return Err(Error::Redis(RedisError::from(e)));
                }
            }
        }
        Ok(guard)
    }
}

/// State shared by a guard and its watchdog.
struct Shared {
    connector: Arc<dyn Connector>,
    key: String,
    token: String,
    ttl: Duration,
    fence: i64,
    retry: RetryPolicy,
    io_timeout: Duration,
    /// `lease_end_ns` counts from here.
    epoch: Instant,
    /// Conservative local lease end: the send time of the last successful ACQUIRE or RENEW
    /// plus the ttl, less a drift allowance (the server's lease ends no earlier).
    lease_end_ns: AtomicU64,
    lost: AtomicBool,
    reason: AtomicU8,
    /// Held across every renewal round trip; `stopping` is set under it by release.
    state: Mutex<RenewState>,
    wake: Condvar,
    on_lost: Option<LostCallback>,
    renewal_hook: Option<RenewalHook>,
    durability: Durability,
}

struct RenewState {
    stopping: bool,
}

enum Renewal {
    Renewed(Instant),
    Lost(LostReason),
    /// Applied on the primary, not confirmed (SYNC, FSYNC), answered before the local lease
    /// end: still held, on the old lease.
    Unconfirmed(RedisError),
    /// Not retried, or the retries ran out: the lease may not have been renewed.
    Failed(RedisError),
    /// `-POLICY`: the server will refuse every renewal alike.
    Refused(RedisError),
}

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn lease_end(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.lease_end_ns.load(Ordering::SeqCst))
    }

    fn set_lease_end(&self, at: Instant) {
        let ns =
            u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.lease_end_ns.store(ns, Ordering::SeqCst);
    }

    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    fn lost_reason(&self) -> Option<LostReason> {
        match self.reason.load(Ordering::SeqCst) {
            1 => Some(LostReason::NotHeld),
            2 => Some(LostReason::LeaseExpired),
            3 => Some(LostReason::LateReply),
            4 => Some(LostReason::Refused),
            5 => Some(LostReason::RenewalFailed),
            _ => None,
        }
    }

    /// Marks the lock lost; true the first time only (the caller then reports it).
    fn mark_lost(&self, reason: LostReason) -> bool {
        let code = match reason {
            LostReason::NotHeld => 1,
            LostReason::LeaseExpired => 2,
            LostReason::LateReply => 3,
            LostReason::Refused => 4,
            LostReason::RenewalFailed => 5,
        };
        if self.lost.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.reason.store(code, Ordering::SeqCst);
        true
    }

    /// Calls the user's callback; never with one of our mutexes held.
    fn report_lost(&self, reason: LostReason) {
        if let Some(callback) = &self.on_lost {
            callback(reason);
        }
    }

    fn lose(&self, reason: LostReason) {
        if self.mark_lost(reason) {
            self.report_lost(reason);
        }
    }

    /// Local check: lost, or past the conservative lease end.
    fn check(&self) -> Result<(), Error> {
        if !self.is_lost() && Instant::now() >= self.lease_end() {
            self.lose(LostReason::LeaseExpired);
        }
        if self.is_lost() {
            Err(Error::Lost)
        } else {
            Ok(())
        }
    }

    /// One renewal, retried while the lease lasts. The caller holds `state` (or, before the
    /// watchdog starts, is the only user). `anchored: false` when the local lease end is not
    /// known yet (a grant at some moment of a long server-side wait): then the server's 1 alone
    /// says the hold never lapsed, since LOCK.RENEW finds nothing to renew once a lease ended.
    fn renew_locked(
        &self,
        conn: &mut Option<BoxedConnection>,
        read_timeout: Duration,
        anchored: bool,
    ) -> Renewal {
        let lease_end = self.lease_end();
        let mut failures = 0u32;
        loop {
            if let Some(reason) = self.lost_reason() {
                return Renewal::Lost(reason);
            }
            if anchored && Instant::now() >= lease_end {
                // Too late: renewing now could extend a lease that already ended on the server.
                return Renewal::Lost(LostReason::LeaseExpired);
            }
            let sent = with_conn(conn, &*self.connector, self.io_timeout, read_timeout, |c| {
                let sent_at = Instant::now();
                let mut cmd = redis::cmd("LOCK.RENEW");
                cmd.arg(&self.key).arg(&self.token).arg(millis(self.ttl));
                self.durability.add_to(&mut cmd);
                cmd.query::<i64>(c).map(|reply| (reply, sent_at))
            });
            match sent {
                Ok((1, sent_at)) => {
                    if anchored && Instant::now() >= lease_end {
                        return Renewal::Lost(LostReason::LateReply);
                    }
                    self.set_lease_end(sent_at + lease_len(self.ttl));
                    return Renewal::Renewed(sent_at);
                }
                Ok(_) => return Renewal::Lost(LostReason::NotHeld),
                Err(e) => {
                    if is_policy(&e) {
                        return Renewal::Refused(e);
                    }
                    let reply = classify(&e) != Retry::Reconnect;
                    if reply && anchored && Instant::now() >= lease_end {
                        // Answered too late, whatever it says (an unconfirmed renewal too): the
                        // lease may have ended in between.
                        return Renewal::Lost(LostReason::LateReply);
                    }
                    if is_unconfirmed(&e) {
                        return Renewal::Unconfirmed(e);
                    }
                    match classify(&e) {
                        Retry::No => return Renewal::Failed(e),
                        Retry::Resend => {}
                        Retry::Reconnect => *conn = None,
                    }
                    failures += 1;
                    if failures >= self.retry.attempt_count() {
                        return Renewal::Failed(e);
                    }
                    let pause = self.retry.backoff(failures);
                    thread::sleep(if anchored {
                        pause.min(lease_end.saturating_duration_since(Instant::now()))
                    } else {
                        pause
                    });
                }
            }
        }
    }
}

/// Which step of a call failed.
enum Failure {
    /// Opening the connection: nothing was sent.
    Connect(RedisError),
    /// The command on an open connection: it may have run.
    Call(RedisError),
}

impl Failure {
    fn into_error(self) -> RedisError {
        match self {
            Failure::Connect(e) | Failure::Call(e) => e,
        }
    }
}

/// Runs `op` on the connection in `slot`, opening one first if needed. An I/O error leaves
/// the slot empty (the connection's state is unknown).
/// What the server's `LABEL` takes: 1 to 128 bytes of printable ASCII without spaces.
fn valid_label(label: &str) -> bool {
    (1..=MAX_LABEL_LEN).contains(&label.len()) && label.bytes().all(|b| (b'!'..=b'~').contains(&b))
}

fn with_conn<T>(
    slot: &mut Option<BoxedConnection>,
    connector: &dyn Connector,
    timeout: Duration,
    read_timeout: Duration,
    op: impl FnOnce(&mut dyn ConnectionLike) -> RedisResult<T>,
) -> RedisResult<T> {
    with_conn_staged(slot, connector, timeout, read_timeout, op).map_err(Failure::into_error)
}

/// [`with_conn`], telling a failed connect (nothing sent) from a failed call.
fn with_conn_staged<T>(
    slot: &mut Option<BoxedConnection>,
    connector: &dyn Connector,
    timeout: Duration,
    read_timeout: Duration,
    op: impl FnOnce(&mut dyn ConnectionLike) -> RedisResult<T>,
) -> Result<T, Failure> {
    let conn = match slot {
        Some(c) => c,
        None => slot.insert(
            connector
                .connect(timeout, Some(read_timeout))
                .map_err(Failure::Connect)?,
        ),
    };
    let result = op(conn.as_mut());
    if let Err(e) = &result {
        if classify(e) == Retry::Reconnect {
            *slot = None;
        }
    }
    result.map_err(Failure::Call)
}

/// The watchdog thread: renews every ttl/3 until told to stop or the lock is lost.
fn watchdog(shared: Arc<Shared>) {
    let interval = (shared.ttl / 3).max(Duration::from_millis(1));
    let read_timeout = (shared.ttl / 2)
        .max(Duration::from_millis(10))
        .min(shared.io_timeout);
    let mut conn: Option<BoxedConnection> = None;
    let mut next = Instant::now() + interval;
    let mut round = 0u32;
    loop {
        {
            let mut state = lock_ignoring_poison(&shared.state);
            loop {
                if state.stopping {
                    return;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                state = shared
                    .wake
                    .wait_timeout(state, next - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        if let Some(hook) = &shared.renewal_hook {
            hook(round);
        }
        round = round.wrapping_add(1);
        let state = lock_ignoring_poison(&shared.state);
        if state.stopping || shared.is_lost() {
            return;
        }
        let outcome = shared.renew_locked(&mut conn, read_timeout, true);
        drop(state);
        match outcome {
            Renewal::Renewed(sent_at) => next = sent_at + interval,
            Renewal::Lost(reason) => {
                shared.lose(reason);
                return;
            }
            Renewal::Refused(_) => {
                // Every renewal would be refused alike: the lease cannot be kept as asked.
                shared.lose(LostReason::Refused);
                return;
            }
            Renewal::Unconfirmed(_) => {
                // Renewed, unconfirmed (NOREPLICAS, FSYNC): held on the old lease. Try again
                // soon, while that lease lasts; the next round marks it lost if not.
                let left = shared.lease_end().saturating_duration_since(Instant::now());
                next = Instant::now() + (left / 2).min(interval);
            }
            Renewal::Failed(_) => {
                // The lease may not have been renewed: lost, as in the Python and Node.js
                // helpers.
                shared.lose(LostReason::RenewalFailed);
                return;
            }
        }
    }
}

/// A held lock. Dropping it stops the watchdog (if any) and releases the lock with its token.
///
/// Use [`fence`](LockGuard::fence) with every write to the protected resource, and let the
/// resource refuse fences older than the newest it has seen: a lease alone cannot stop a
/// paused holder from acting late.
pub struct LockGuard {
    shared: Arc<Shared>,
    conn: Mutex<Option<BoxedConnection>>,
    watchdog: Option<JoinHandle<()>>,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.shared.key)
            .field("fence", &self.shared.fence)
            .field("lost", &self.shared.is_lost())
            .field("watchdog", &self.watchdog.is_some())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// The fence of this grant: larger than every earlier grant's fence of the same key.
    pub fn fence(&self) -> i64 {
        self.shared.fence
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// True once the lock is known lost, including as soon as the local lease end has passed
    /// (no call needed); never goes back to false. When this is the first to notice, the loss
    /// is reported (`on_lost`) from this thread.
    pub fn is_lost(&self) -> bool {
        self.shared.check().is_err()
    }

    /// Why the lock was lost, if it was (the local lease end counts, as for
    /// [`is_lost`](LockGuard::is_lost)).
    pub fn lost_reason(&self) -> Option<LostReason> {
        let _ = self.shared.check();
        self.shared.lost_reason()
    }

    /// The local, conservative end of the lease: the server's lease ends no earlier.
    pub fn lease_end(&self) -> Instant {
        self.shared.lease_end()
    }

    /// `Err(Error::Lost)` when the lock is known lost or the local lease end has passed (with
    /// or without the watchdog). No network round trip.
    pub fn check(&self) -> Result<(), Error> {
        self.shared.check()
    }

    /// Runs `f` with the fence if the lock is not known lost; never runs it otherwise. Pass the
    /// fence on to the storage so that it can refuse a stale holder.
    pub fn fenced<T>(&self, f: impl FnOnce(i64) -> T) -> Result<T, Error> {
        self.check()?;
        Ok(f(self.shared.fence))
    }

    /// Renews the lease now (`LOCK.RENEW`: the lease ends ttl from now), for use without the
    /// watchdog. `Err(Error::Lost)` when the server says the token no longer holds the lock, the
    /// local lease end passed before a renewal got through, any reply came after it
    /// ([`LostReason::LateReply`]), or the renewal failed with an error that is not retried
    /// (`READONLY` ...) or after its retries ([`LostReason::RenewalFailed`]); [`Error::Policy`]
    /// when the server's lock namespace refused it (the guard then counts as lost,
    /// [`LostReason::Refused`], as the watchdog counts it); [`Error::Redis`] when the server
    /// renewed in time but could not confirm it (`NOREPLICAS the change was not acknowledged
    /// ...`, `ERR the change was not fsynced ...`): still held, on the old lease end.
    pub fn renew(&self) -> Result<(), Error> {
        let state = lock_ignoring_poison(&self.shared.state);
        if state.stopping {
            return Err(Error::Lost);
        }
        let mut conn = lock_ignoring_poison(&self.conn);
        let outcome = self
            .shared
            .renew_locked(&mut conn, self.shared.io_timeout, true);
        drop(conn);
        drop(state);
        match outcome {
            Renewal::Renewed(_) => Ok(()),
            Renewal::Lost(reason) => {
                self.shared.lose(reason);
                Err(Error::Lost)
            }
            Renewal::Unconfirmed(e) => Err(Error::Redis(e)),
            Renewal::Failed(_) => {
                self.shared.lose(LostReason::RenewalFailed);
                Err(Error::Lost)
            }
            Renewal::Refused(e) => {
                self.shared.lose(LostReason::Refused);
                Err(Error::from(e))
            }
        }
    }

    /// Runs `op` on the guard's connection (opened again if it was lost), bounded by the I/O
    /// timeout.
    fn on_conn<T>(
        &self,
        op: impl FnOnce(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let shared = &self.shared;
        let mut slot = lock_ignoring_poison(&self.conn);
        with_conn(
            &mut slot,
            &*shared.connector,
            shared.io_timeout,
            shared.io_timeout,
            op,
        )
    }

    /// Gives this grant a new public label (`LABEL`), keeping its fence: the token asks for
    /// the lock again, which sets the lease to ttl from now. [`Error::Lost`] when the token no
    /// longer holds it (or the local lease end passed); [`Error::Invalid`] for a bad label.
    pub fn relabel(&self, label: &str) -> Result<(), Error> {
        if !valid_label(label) {
            return Err(Error::Invalid(Invalid::Label));
        }
        let state = lock_ignoring_poison(&self.shared.state);
        if state.stopping {
            return Err(Error::Lost);
        }
        self.check()?;
        let shared = &self.shared;
        let outcome = self.on_conn(|c| {
            let sent_at = Instant::now();
            let mut cmd = redis::cmd("LOCK.ACQUIRE");
            cmd.arg(&shared.key)
                .arg(&shared.token)
                .arg(millis(shared.ttl))
                .arg("LABEL")
                .arg(label);
            shared.durability.add_to(&mut cmd);
            cmd.query::<Option<i64>>(c).map(|reply| (reply, sent_at))
        });
        drop(state);
        match outcome {
            Ok((Some(fence), sent_at)) if fence == shared.fence => {
                shared.set_lease_end(sent_at + lease_len(shared.ttl));
                Ok(())
            }
            Ok(_) => {
                shared.lose(LostReason::NotHeld);
                Err(Error::Lost)
            }
            // A -POLICY reply comes back as Error::Policy; the grant is unchanged.
            Err(e) => Err(Error::from(e)),
        }
    }

    /// Runs one command only while this grant's fence is current: `LOCK.GUARD key fence
    /// command ...` checks the fence and runs the command in one step on the server, which
    /// replicates the command as itself. Returns the command's reply; [`Error::Lost`] when the
    /// fence is no longer current (the command did not run); the command's own errors come
    /// back as [`Error::Redis`]. Not retried, since the command may not be idempotent. In a
    /// cluster its keys must share the lock's slot (hash tags).
    ///
    /// ```no_run
    /// # fn demo(guard: &redis_lock_client::LockGuard) -> Result<(), redis_lock_client::Error> {
    /// let added: i64 = guard.guarded(redis::cmd("HSET").arg("{order:42}:data").arg("status").arg("shipped"))?;
    /// # Ok(()) }
    /// ```
    pub fn guarded<T: FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, Error> {
        self.check()?;
        let mut guard_cmd = redis::cmd("LOCK.GUARD");
        guard_cmd.arg(&self.shared.key).arg(self.shared.fence);
        for arg in command.args_iter() {
            if let redis::Arg::Simple(bytes) = arg {
                guard_cmd.arg(bytes);
            }
        }
        let outcome = self.on_conn(|c| guard_cmd.query::<T>(c));
        match outcome {
            Ok(value) => Ok(value),
            Err(e) if e.code() == Some("FENCED") => {
                self.shared.lose(LostReason::NotHeld);
                Err(Error::Lost)
            }
            Err(e) => Err(Error::Redis(e)),
        }
    }

    /// Writes to other keys only while this grant is current, atomically: `WATCH` the lock's
    /// key (and `data_keys`), `LOCK.FENCE key fence`, then `MULTI`, the commands `build` adds to
    /// the pipeline, `EXEC`. An aborted `EXEC` (the lock or a watched key changed) starts over,
    /// at most [`RetryPolicy::attempts`] times in all ([`Error::Conflict`] after that);
    /// `LOCK.FENCE` answering 0 gives [`Error::Lost`].
    ///
    /// `T` is the `EXEC` result (a tuple of the replies of the commands not marked `ignore`).
    /// The watchdog does not renew during the transaction (a renewal would abort the `EXEC`).
    /// Needs a standalone connection; in a cluster the lock and data keys share one slot (hash
    /// tags) and the cluster client must support transactions. Errors are not retried: an
    /// `EXEC` whose reply was lost may have run.
    ///
    /// For a single command, [`guarded`](LockGuard::guarded) does the same in one round trip,
    /// without aborts caused by renewals.
    pub fn transaction<T: FromRedisValue>(
        &self,
        data_keys: &[&str],
        mut build: impl FnMut(&mut redis::Pipeline, i64),
    ) -> Result<T, Error> {
        let attempts = self.shared.retry.attempt_count();
        for _ in 0..attempts {
            self.check()?;
            let state = lock_ignoring_poison(&self.shared.state);
            let mut slot = lock_ignoring_poison(&self.conn);
            let shared = &self.shared;
            let outcome = with_conn(
                &mut slot,
                &*shared.connector,
                shared.io_timeout,
                shared.io_timeout,
                |c| -> RedisResult<Option<Option<T>>> {
                    redis::cmd("WATCH")
                        .arg(&shared.key)
                        .arg(data_keys)
                        .exec(&mut *c)?;
                    let current: i64 = redis::cmd("LOCK.FENCE")
                        .arg(&shared.key)
                        .arg(shared.fence)
                        .query(&mut *c)?;
                    if current != 1 {
                        redis::cmd("UNWATCH").exec(&mut *c)?;
                        return Ok(None);
                    }
                    let mut pipe = redis::pipe();
                    pipe.atomic();
                    build(&mut pipe, shared.fence);
                    pipe.query::<Option<T>>(c).map(Some)
                },
            );
            drop(slot);
            drop(state);
            match outcome {
                Ok(Some(Some(value))) => return Ok(value),
                Ok(Some(None)) => continue,
                Ok(None) => {
                    self.shared.lose(LostReason::NotHeld);
                    return Err(Error::Lost);
                }
                Err(e) => return Err(Error::Redis(e)),
            }
        }
        Err(Error::Conflict { attempts })
    }

    /// Stops the watchdog (no renewal is sent after this returns), then releases the lock with
    /// its token. `Ok(true)`: released; `Ok(false)`: the token did not hold it any more (lost,
    /// or an earlier attempt whose reply was lost already released it). A loss found here (the
    /// local lease end passed, or the first `LOCK.RELEASE` answered 0) is reported through
    /// `on_lost` unless it was reported before.
    pub fn release(mut self) -> Result<bool, Error> {
        self.release_inner(true)
    }

    /// `report`: false for a grant never handed out (its loss is nobody's news).
    fn release_inner(&mut self, report: bool) -> Result<bool, Error> {
        if self.released {
            return Ok(false);
        }
        self.released = true;
        if report {
            // Past the local lease end the grant counts as lost, whatever the server says.
            let _ = self.shared.check();
        }
        {
            let mut state = lock_ignoring_poison(&self.shared.state);
            state.stopping = true;
        }
        self.shared.wake.notify_all();
        if let Some(handle) = self.watchdog.take() {
            // A guard dropped from its own on_lost callback must not wait for itself.
            if handle.thread().id() != thread::current().id() {
                let _ = handle.join();
            }
        }
        let outcome = self.send_release();
        // The connection's mutex is free again: on_lost may run here.
        if let Ok((false, 0)) = outcome {
            // Only the first try's 0 says the grant was gone: a 0 after a retry may answer
            // our own earlier release whose reply was lost.
            if report {
                self.shared.lose(LostReason::NotHeld);
            }
        }
        outcome.map(|(released, _)| released)
    }

    /// `LOCK.RELEASE` with the token, retried: whether it released, and after how many failures.
    /// [`Error::Connection`] when no connection could be opened before anything was sent.
    fn send_release(&self) -> Result<(bool, u32), Error> {
        let shared = &self.shared;
        let mut slot = lock_ignoring_poison(&self.conn);
        let mut failures = 0u32;
        let mut maybe_sent = false;
        let mut give_up_at: Option<Instant> = None;
        loop {
            let result = with_conn_staged(
                &mut slot,
                &*shared.connector,
                shared.io_timeout,
                shared.io_timeout,
                |c| {
                    redis::cmd("LOCK.RELEASE")
                        .arg(&shared.key)
                        .arg(&shared.token)
                        .query::<i64>(c)
                },
            );
            match result {
                Ok(n) => return Ok((n == 1, failures)),
                Err(failure) => {
                    let sent = matches!(failure, Failure::Call(_));
                    let e = failure.into_error();
                    match classify(&e) {
                        Retry::No => return Err(Error::Redis(e)),
                        Retry::Reconnect if !sent && !maybe_sent => {
                            return Err(Error::Connection(e));
                        }
                        Retry::Reconnect => maybe_sent |= sent,
                        Retry::Resend => {}
                    }
                    failures += 1;
                    match shared.retry.pause(failures, &mut give_up_at) {
                        Some(pause) => thread::sleep(pause),
                        None => return Err(Error::Redis(e)),
                    }
                }
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = self.release_inner(true);
    }
}

/// 16 random bytes, hex-encoded: a fresh secret per acquisition.
fn new_token() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The lease length counted locally: the ttl less an allowance for the server's millisecond
/// clock granularity and for clock drift (1% of the ttl plus 2 ms, as Redlock allows).
fn lease_len(ttl: Duration) -> Duration {
    ttl.saturating_sub(ttl / 100 + Duration::from_millis(2))
}

/// Whole milliseconds, rounded up, at least 1.
fn millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

/// Whole milliseconds, rounded down.
fn millis_floor(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_32_hex_digits_and_differ() {
        let a = new_token();
        let b = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn millis_rounds_up() {
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_millis(300)), 300);
        assert_eq!(millis(Duration::from_micros(300_001)), 301);
        assert_eq!(millis_floor(Duration::from_micros(999)), 0);
    }

    #[test]
    fn backoff_is_bounded_and_grows() {
        let p = RetryPolicy::default();
        for n in 1..40 {
            let d = p.backoff(n);
            assert!(d <= p.max, "{n}: {d:?}");
        }
        let first = p.backoff(1);
        assert!(first >= p.base / 2 && first <= p.base, "{first:?}");
        let fourth = p.backoff(4);
        assert!(fourth >= p.base * 4, "{fourth:?}");
    }
}
