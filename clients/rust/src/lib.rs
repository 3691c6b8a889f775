//! Client helpers for the `lock` Redis module (`LOCK.*` commands) that make the safe use the
//! easy one: a guard that releases with its own token, a fence handed to your code, an
//! opt-in watchdog that never renews a lease that may already have ended, fenced
//! transactions, and retries that keep the token across `TRYAGAIN`, `CLUSTERDOWN`,
//! `UNBLOCKED` and lost connections, for standalone servers and Redis Cluster alike.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{Error, Lock};
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let lock = Lock::new(client, "{order:42}:lock", Duration::from_secs(10))
//!     .wait(Duration::from_secs(5)) // queue on the server for up to 5 s
//!     .watchdog(true)               // renew every ttl/3 while the guard lives
//!     .on_lost(|why| eprintln!("lock lost: {why}"));
//! match lock.run(|fence| println!("writing with fence {fence}")) {
//!     Err(Error::NotAcquired) => println!("busy, body not run"),
//!     other => other?,
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is promised, and what is not
//!
//! * A lock that was not granted never runs user code ([`Lock::run`], [`Error::NotAcquired`]).
//! * Every acquisition draws 16 random bytes as its token; release and renew present it, so a
//!   guard can never free or extend someone else's grant. Retries reuse the token: a grant
//!   whose reply was lost comes back with its fence.
//! * The guard keeps a conservative local lease end (the send time of the last successful
//!   `LOCK.ACQUIRE`/`LOCK.RENEW` plus the ttl, less 1% + 2 ms for clock drift). Past it,
//!   [`LockGuard::check`] and [`LockGuard::fenced`] report [`Error::Lost`], and the watchdog stops without sending a
//!   renewal: a late renewal could otherwise extend a lease the server already ended.
//! * The watchdog is stopped and joined before [`LockGuard::release`] (or drop) sends
//!   `LOCK.RELEASE`: no renewal reaches the server after the release.
//! * A lost grant is reported through [`Lock::on_lost`] exactly once, by whichever thread
//!   notices first; [`LockGuard::is_lost`] is true as soon as the local lease end has passed.
//! * Settings that make no sense are refused before any command ([`Error::Invalid`]); a
//!   connection that could not be opened sent nothing ([`Error::Connection`]), unlike a reply
//!   lost after sending ([`Error::Unknown`]).
//! * A lease is not consensus: a holder can be paused past its lease and act late, and a
//!   failover can lose a grant. Hand the [fence](LockGuard::fence) to the storage you protect
//!   and let it refuse older fences, or use [`LockGuard::transaction`] for other Redis keys.

#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod connector;
mod election;
mod error;
mod lock;
mod redlock;
mod retry;

pub use connector::{BoxedConnection, Connector};
pub use election::{Election, Leader, Leadership};
pub use error::{Error, Invalid, LostReason};
pub use lock::{Lock, LockGuard};
pub use redlock::{Redlock, RedlockGuard, DRIFT_FACTOR};
pub use retry::{is_retryable, RetryPolicy};
