//! The lock itself, free of any Redis API: what a lock is and how it changes ([`core`]), the
//! server-wide fence floor ([`floor`]), the events a change is announced and replicated as
//! ([`event`]), the one encoding of a lock for RDB, replicated effects and digests ([`codec`]),
//! and the bookkeeping the service keeps beside the keyspace: the lease index
//! ([`lease_index`]), the queues of waiting clients ([`queues`]), the session owners
//! ([`sessions`]) and the cluster slots being imported ([`slots`]).
//!
//! Time is always a parameter here, so every rule is unit-tested without a server.

pub mod codec;
pub mod core;
pub mod event;
pub mod floor;
pub mod lease_index;
#[cfg(test)]
mod model_tests;
pub mod queues;
pub mod sessions;
pub mod slots;
#[cfg(test)]
mod slots_tests;

/// A key in a database: how the queues and the session table name a lock.
pub type KeyRef = (i32, Box<[u8]>);

/// Locks one of the module's process-wide tables. A panic while it was held (caught by the host
/// layer, the server kept running) does not lock the module out of it for good.
pub fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
