//! Redlock over independent servers running the lock module: for soft locks only.
//!
//! A majority of N independent primaries each grant the same token with `LOCK.ACQUIRE`; the
//! lock is held when floor(N/2)+1 granted within the lease, for the lease less the time the
//! round took and a drift allowance ([`DRIFT_FACTOR`]). One server down does not stop a cron
//! job or a cache warmer.
//!
//! What it does not give: safety for money, inventory or unique constraints. A holder paused
//! past its validity, or a clock that jumps, lets another client take the majority while the
//! first still believes it holds the lock. And there is no global fence: each server's fence
//! orders only that server's grants, so no single number can tell a stale holder from a
//! current one. [`Redlock`] therefore has no `fenced()` or `guarded()`: use [`crate::Lock`] on
//! one primary, with fences, for work that must not be done twice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rand::Rng;
use redis::RedisError;

use crate::connector::Connector;
use crate::error::{is_policy, Error};

/// The drift allowance: validity = ttl - elapsed - (ttl * DRIFT_FACTOR + 2 ms). It covers the
/// servers' clocks running at slightly different rates over one lease (1%), plus rounding.
pub const DRIFT_FACTOR: f64 = 0.01;

/// A lock held by a majority of independent servers.
pub struct Redlock {
    servers: Vec<Arc<dyn Connector>>,
    key: String,
    ttl: Duration,
    server_timeout: Duration,
    retries: u32,
    retry_delay: Duration,
    watchdog: bool,
}

/// A Redlock held: released on every server when dropped (or by [`RedlockGuard::release`]).
pub struct RedlockGuard {
    held: Arc<Held>,
    fences: Vec<(usize, i64)>,
    /// The watchdog and the sender whose drop stops it.
    watchdog: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

/// What the guard and its watchdog share.
struct Held {
    lock: Redlock,
    token: String,
    valid_until: Mutex<Instant>,
    released: AtomicBool,
}

impl Redlock {
    /// A Redlock on `key` over `servers` (one connector each), with leases of `ttl`. Each
    /// server's answer is bounded by 50 ms; 3 more rounds follow a failed one, after a random
    /// pause of up to 200 ms.
    pub fn new(servers: Vec<Arc<dyn Connector>>, key: impl Into<String>, ttl: Duration) -> Redlock {
        Redlock {
            servers,
            key: key.into(),
            ttl,
            server_timeout: Duration::from_millis(50),
            retries: 3,
            retry_delay: Duration::from_millis(200),
            watchdog: false,
        }
    }

    /// Renew by majority every third of the lease while the guard lives (off by default). The
    /// watchdog stops at the first renewal without a majority in time (the validity ends then)
    /// and is stopped before the guard's release sends anything.
    pub fn watchdog(mut self, on: bool) -> Redlock {
        self.watchdog = on;
        self
    }

    /// How long each server may take to answer in one round.
    pub fn server_timeout(mut self, timeout: Duration) -> Redlock {
        self.server_timeout = timeout;
        self
    }

    /// Rounds after a failed one, and the most random pause before each.
    pub fn retries(mut self, retries: u32, delay: Duration) -> Redlock {
        self.retries = retries;
        self.retry_delay = delay;
        self
    }

    /// floor(N/2)+1.
    pub fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// Sends a command to every server at once; the integer replies that came in time, by
    /// server index (errors, nil and silence are left out).
    fn round(&self, build: impl Fn() -> redis::Cmd) -> Vec<(usize, i64)> {
        self.round_refused(build).0
    }

    /// [`round`](Redlock::round), and the `-POLICY` refusal of the first server (by index)
    /// that answered in time with one.
    fn round_refused(
        &self,
        build: impl Fn() -> redis::Cmd,
    ) -> (Vec<(usize, i64)>, Option<RedisError>) {
        let (tx, rx) = mpsc::channel();
        for (i, server) in self.servers.iter().enumerate() {
            let (tx, server, cmd, timeout) =
                (tx.clone(), Arc::clone(server), build(), self.server_timeout);
            thread::spawn(move || {
                let reply = server
                    .connect(timeout, Some(timeout))
                    .and_then(|mut conn| cmd.query::<Option<i64>>(conn.as_mut()));
                let _ = tx.send((i, reply));
            });
        }
        drop(tx);
        let deadline = Instant::now() + self.server_timeout;
        let mut replies = Vec::new();
        let mut refusals = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok((i, Ok(Some(value)))) => replies.push((i, value)),
                Ok((i, Err(e))) if is_policy(&e) => refusals.push((i, e)),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        replies.sort_unstable();
        let refused = refusals.into_iter().min_by_key(|(i, _)| *i).map(|(_, e)| e);
        (replies, refused)
    }

    fn validity_left(&self, elapsed: Duration) -> Option<Duration> {
        let drift = self.ttl.mul_f64(DRIFT_FACTOR) + Duration::from_millis(2);
        self.ttl.checked_sub(elapsed)?.checked_sub(drift)
    }

    /// Takes the lock on a majority. [`Error::NotAcquired`] after `1 + retries` failed rounds
    /// (every grant of a failed round is released, on every server, with the token);
    /// [`Error::Policy`] at once, after that round's grants are released, when any server's
    /// lock namespaces refused the request (another round would break the same rule).
    pub fn acquire(self) -> Result<RedlockGuard, Error> {
        let ttl_ms = self.ttl.as_millis().max(1) as u64;
        for attempt in 0..=self.retries {
            let token: String = (0..32)
                .map(|_| char::from(b"0123456789abcdef"[rand::rng().random_range(0..16)]))
                .collect();
            let started = Instant::now();
            let (grants, refused) = self.round_refused(|| {
                let mut cmd = redis::cmd("LOCK.ACQUIRE");
                cmd.arg(&self.key).arg(&token).arg(ttl_ms);
                cmd
            });
            if let Some(e) = refused {
                // The request breaks a server's lock namespace: give back what the others
                // granted, and stop.
                self.round(|| {
                    let mut cmd = redis::cmd("LOCK.RELEASE");
                    cmd.arg(&self.key).arg(&token);
                    cmd
                });
                return Err(Error::from(e));
            }
            let validity = self.validity_left(started.elapsed());
            if grants.len() >= self.quorum() {
                if let Some(validity) = validity {
                    let watchdog = self.watchdog;
                    let held = Arc::new(Held {
                        valid_until: Mutex::new(started + validity),
                        token,
                        lock: self,
                        released: AtomicBool::new(false),
                    });
                    let watchdog = watchdog.then(|| {
                        let (stop, stopped) = mpsc::channel::<()>();
                        let held = Arc::clone(&held);
                        let every = held.lock.ttl / 3;
                        let thread = thread::spawn(move || {
                            while let Err(mpsc::RecvTimeoutError::Timeout) =
                                stopped.recv_timeout(every)
                            {
                                if !held.renew() {
                                    return;
                                }
                            }
                        });
                        (stop, thread)
                    });
                    return Ok(RedlockGuard {
                        held,
                        fences: grants,
                        watchdog,
                    });
                }
            }
            // A minority, or too late: give every grant back, even those that answered late.
            self.round(|| {
                let mut cmd = redis::cmd("LOCK.RELEASE");
                cmd.arg(&self.key).arg(&token);
                cmd
            });
            if attempt < self.retries && !self.retry_delay.is_zero() {
                thread::sleep(self.retry_delay.mul_f64(rand::rng().random_range(0.0..1.0)));
            }
        }
        Err(Error::NotAcquired)
    }
}

impl Held {
    fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn is_held(&self) -> bool {
        !self.released.load(Ordering::SeqCst) && Instant::now() < self.valid_until()
    }

    /// One renewal round; see [`RedlockGuard::renew`].
    fn renew(&self) -> bool {
        if !self.is_held() {
            return false;
        }
        let started = Instant::now();
        let ttl_ms = self.lock.ttl.as_millis().max(1) as u64;
        let renewed = self
            .lock
            .round(|| {
                let mut cmd = redis::cmd("LOCK.RENEW");
                cmd.arg(&self.lock.key).arg(&self.token).arg(ttl_ms);
                cmd
            })
            .iter()
            .filter(|(_, reply)| *reply == 1)
            .count();
        let mut valid_until = self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match self.lock.validity_left(started.elapsed()) {
            Some(validity) if renewed >= self.lock.quorum() && Instant::now() < *valid_until => {
                *valid_until = started + validity;
                true
            }
            _ => {
                *valid_until = Instant::now();
                false
            }
        }
    }
}

impl RedlockGuard {
    /// Each granting server's fence, by its index in the server list. Comparable only with
    /// later fences of the same server, never across servers.
    pub fn fences(&self) -> &[(usize, i64)] {
        &self.fences
    }

    /// True while the validity lasts by the local clock.
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// What is left of the validity.
    pub fn validity(&self) -> Duration {
        self.held
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// Renews on every server; true when a majority renewed within the validity (it starts
    /// again), false when not (consider the lock lost).
    pub fn renew(&self) -> bool {
        self.held.renew()
    }

    /// Stops the watchdog, then releases on every server (token-checked, so a late grant on a
    /// minority server goes too); how many released.
    pub fn release(mut self) -> usize {
        self.release_all()
    }

    fn release_all(&mut self) -> usize {
        if let Some((stop, thread)) = self.watchdog.take() {
            drop(stop);
            let _ = thread.join();
        }
        if self.held.released.swap(true, Ordering::SeqCst) {
            return 0;
        }
        let held = &self.held;
        held.lock
            .round(|| {
                let mut cmd = redis::cmd("LOCK.RELEASE");
                cmd.arg(&held.lock.key).arg(&held.token);
                cmd
            })
            .iter()
            .filter(|(_, reply)| *reply == 1)
            .count()
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        self.release_all();
    }
}

impl std::fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockGuard")
            .field("key", &self.held.lock.key)
            .field("fences", &self.fences)
            .field("validity", &self.validity())
            .finish_non_exhaustive()
    }
}
