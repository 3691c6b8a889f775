//! Which errors are worth another attempt, and how long to wait before it.

use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Bounded exponential backoff for errors that say "try again".
///
/// Attempt `n` (counting from 1) that fails with a retryable error is followed by a pause of
/// `min(max, base * 2^(n-1))`, jittered down by up to half, and at most `attempts` attempts are
/// made in all; no retry starts later than `deadline` after the first failure. Every retry sends
/// the same token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 0 is refused by `Lock::acquire`
    /// (`Invalid::Retry`).
    pub attempts: u32,
    /// Pause after the first failed attempt.
    pub base: Duration,
    /// Longest pause.
    pub max: Duration,
    /// How long retrying may go on, from the first failure: no retry starts after it, however
    /// many attempts are left (a connector whose client retries on its own makes each attempt
    /// longer).
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    /// 6 attempts, 20 ms first pause, 1 s longest pause, 10 s deadline.
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            base: Duration::from_millis(20),
            max: Duration::from_secs(1),
            deadline: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// No retries: one attempt only.
    pub fn none() -> Self {
        RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The pause after `failures` failed attempts (1 = after the first), with jitter.
    pub fn backoff(&self, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(20);
        let full = self.base.saturating_mul(1u32 << shift).min(self.max);
        let nanos = u64::try_from(full.as_nanos()).unwrap_or(u64::MAX);
        let half = nanos / 2;
        let jitter = if half == 0 {
            0
        } else {
            rand::random::<u64>() % (half + 1)
        };
        Duration::from_nanos(nanos - jitter)
    }

    pub(crate) fn attempt_count(&self) -> u32 {
        self.attempts.max(1)
    }

    /// The pause before the next attempt after `failures` failed ones, or `None` when the
    /// attempts or the deadline are used up. `give_up_at` is the deadline, set at the first
    /// failure.
    pub(crate) fn pause(
        &self,
        failures: u32,
        give_up_at: &mut Option<Instant>,
    ) -> Option<Duration> {
        let now = Instant::now();
        let until = *give_up_at.get_or_insert(now + self.deadline);
        let pause = self.backoff(failures);
        (failures < self.attempt_count() && now + pause < until).then_some(pause)
    }
}

/// What to do after an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Not retryable: report it.
    No,
    /// The server refused the command for now; the connection is fine.
    Resend,
    /// The connection failed or timed out: its state is unknown, so open a new one. The
    /// command may or may not have run.
    Reconnect,
}

pub(crate) fn classify(e: &RedisError) -> Retry {
    if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
        return Retry::Reconnect;
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading,
        ) => Retry::Resend,
        ErrorKind::ClusterConnectionNotFound | ErrorKind::Io => Retry::Reconnect,
        _ => match e.code() {
            Some("UNBLOCKED" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "LOADING") => {
                Retry::Resend
            }
            _ => Retry::No,
        },
    }
}

/// True for the errors the helpers retry: `TRYAGAIN`, `CLUSTERDOWN`, `UNBLOCKED`,
/// `MASTERDOWN`, `LOADING`, and I/O errors (lost connections and timeouts).
pub fn is_retryable(e: &RedisError) -> bool {
    classify(e) != Retry::No
}
