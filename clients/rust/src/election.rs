//! Leader election over one lock key, in the shape of etcd's Election: campaign, proclaim,
//! leader, observe, resign.
//!
//! The leader holds the lock (a watchdog renews it); its public value is the grant's `LABEL`,
//! which everyone reads with `LOCK.WHO`, never the token. Its fence is its term: terms only
//! grow, and a leader's writes go through [`Leadership::guarded`] so that a deposed leader
//! (paused past its lease) cannot write once a newer term exists. Leadership is a lease: after a
//! leader dies, the next one is elected when the lease (plus any lock-delay) runs out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{ConnectionLike, FromRedisValue, Value};

use crate::connector::Connector;
use crate::error::Error;
use crate::lock::{Lock, LockGuard};

/// Who leads: the value it proclaimed (its label), its term (fence) and its client id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The public value the leader campaigned or last proclaimed with (its label).
    pub value: String,
    /// Its term: the fence of its grant.
    pub term: i64,
    /// The id of the connection it was granted on (on the primary that granted it).
    pub client_id: i64,
}

/// Candidates for leadership of one name, with leases of one length.
pub struct Election {
    lock: Lock,
}

/// This candidate's leadership: released (resigned) when dropped.
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Election {
    /// An election of `name` (the lock key) with leases of `ttl`.
    pub fn new(connector: impl Connector, name: impl Into<String>, ttl: Duration) -> Election {
        Election {
            lock: Lock::new(connector, name, ttl).watchdog(true),
        }
    }

    /// The underlying lock, to change its settings (`retry`, `on_lost`, `io_timeout`).
    pub fn configure(mut self, settings: impl FnOnce(Lock) -> Lock) -> Election {
        self.lock = settings(self.lock).watchdog(true);
        self
    }

    /// Waits (on the server, first come first served) to lead with `value` as the public
    /// value: `None` waits without a limit, `Some(d)` up to `d` ([`Error::NotAcquired`] when it
    /// runs out). A watchdog renews the lease until the [`Leadership`] is resigned or dropped.
    pub fn campaign(&self, value: &str, wait: Option<Duration>) -> Result<Leadership, Error> {
        let lock = self.lock.clone().label(value);
        let lock = match wait {
            None => lock.wait_forever(),
            Some(d) => lock.wait(d),
        };
        Ok(Leadership {
            guard: lock.acquire()?,
        })
    }

    /// The current leader (`None`: nobody leads), read with `LOCK.WHO` on `conn`.
    pub fn leader(&self, conn: &mut dyn ConnectionLike) -> Result<Option<Leader>, Error> {
        let who: Value = redis::cmd("LOCK.WHO")
            .arg(self.lock.key())
            .arg("COUNT")
            .arg(1)
            .query(conn)
            .map_err(Error::Redis)?;
        Ok(leader_of(&who))
    }

    /// Calls `on_change` with the leader now and at every change, each once and in order,
    /// until `stop` is set (looked at least every `idle`). Driven by keyspace events of the key
    /// (the server needs `notify-keyspace-events` with `K` and `d`, or `KA`); every
    /// (re)subscription reads the leader again, so a reconnect misses nothing. Standalone
    /// servers (`client` opens the subscription and the reads).
    pub fn observe(
        &self,
        client: &redis::Client,
        stop: &AtomicBool,
        idle: Duration,
        mut on_change: impl FnMut(Option<Leader>),
    ) -> Result<(), Error> {
        let db = client.get_connection_info().redis_settings().db();
        let channel = format!("__keyspace@{db}__:{}", self.lock.key());
        let mut last: Option<Option<Leader>> = None;
        while !stop.load(Ordering::SeqCst) {
            let mut reader = client.get_connection().map_err(Error::Redis)?;
            let mut sub_conn = client.get_connection().map_err(Error::Redis)?;
            let mut sub = sub_conn.as_pubsub();
            sub.subscribe(&channel).map_err(Error::Redis)?;
            sub.set_read_timeout(Some(idle)).map_err(Error::Redis)?;
            // Subscribed first, read second: a change between the two is seen by both.
            let mut report = |reader: &mut redis::Connection| -> Result<(), Error> {
                let current = self.leader(reader)?;
                if last.as_ref() != Some(&current) {
                    last = Some(current.clone());
                    on_change(current);
                }
                Ok(())
            };
            report(&mut reader)?;
            while !stop.load(Ordering::SeqCst) {
                match sub.get_message() {
                    Ok(message) => {
                        let event: String = message.get_payload().unwrap_or_default();
                        if event != "lock.renew" {
                            report(&mut reader)?;
                        }
                    }
                    Err(e) if e.is_timeout() => continue,
                    // A lost connection: subscribe again and read again.
                    Err(e) if e.is_connection_dropped() || e.is_io_error() => break,
                    Err(e) => return Err(Error::Redis(e)),
                }
            }
        }
        Ok(())
    }
}

/// The first holder of a `LOCK.WHO` reply as a [`Leader`].
fn leader_of(who: &Value) -> Option<Leader> {
    let holders = field(who, "holders")?;
    let holder = match holders {
        Value::Array(items) => items.first()?,
        _ => return None,
    };
    Some(Leader {
        value: String::from_redis_value(field(holder, "label")?.clone()).ok()?,
        term: i64::from_redis_value(field(holder, "fence")?.clone()).ok()?,
        client_id: i64::from_redis_value(field(holder, "client_id")?.clone()).ok()?,
    })
}

/// A field of a map reply (RESP3) or a flat field/value array (RESP2).
fn field<'a>(reply: &'a Value, name: &str) -> Option<&'a Value> {
    let is = |key: &Value| String::from_redis_value(key.clone()).is_ok_and(|k| k == name);
    match reply {
        Value::Map(pairs) => pairs.iter().find(|(k, _)| is(k)).map(|(_, v)| v),
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.len() == 2 && is(&pair[0]))
            .map(|pair| &pair[1]),
        _ => None,
    }
}

impl Leadership {
    /// The term: this leadership's fence, larger than every earlier leader's.
    pub fn term(&self) -> i64 {
        self.guard.fence()
    }

    /// True while leading, by the local lease too.
    pub fn is_leading(&self) -> bool {
        !self.guard.is_lost()
    }

    /// A new public value, the same term. [`Error::Lost`] when no longer leading.
    pub fn proclaim(&self, value: &str) -> Result<(), Error> {
        self.guard.relabel(value)
    }

    /// Runs one command only while this term is current (`LOCK.GUARD`); [`Error::Lost`] when a
    /// newer term exists (the command did not run).
    pub fn guarded<T: FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, Error> {
        self.guard.guarded(command)
    }

    /// Stops leading. True when this candidate still led.
    pub fn resign(self) -> Result<bool, Error> {
        self.guard.release()
    }
}
