//! The lock itself, free of any Redis API: what a lock is and how it changes ([`core`]), the
//! server-wide fence floor ([`floor`]), the events a change is announced and replicated as
//! ([`event`]), the one encoding of a lock for RDB, replicated effects and digests ([`codec`]),
//! and the bookkeeping the service keeps beside the keyspace: the lease index
//! ([`lease_index`]), the queues of waiting clients ([`queues`]), the session owners
//! ([`sessions`]) and the cluster slots being imported ([`slots`]); a token as the server keeps
//! it, a digest ([`token`]).
//!
//! Time is always a parameter here, so every rule is unit-tested without a server.

pub mod ages;
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
pub mod token;

/// A key in a database: how the queues and the session table name a lock.
pub type KeyRef = (i32, Box<[u8]>);

/// Locks one of the module's process-wide tables. A panic while it was held (caught by the host
/// layer, the server kept running) does not lock the module out of it for good.
pub fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A first-in first-out queue that holds each item at most once: a push of an item already
/// queued keeps its place. Work lists that the same event may ask for repeatedly (keys to serve,
/// deferred jobs) are kept in one.
#[derive(Debug)]
pub struct UniqueFifo<T> {
    items: std::collections::VecDeque<T>,
    /// The same items, for O(1) de-duplication.
    queued: std::collections::HashSet<T>,
}

impl<T> Default for UniqueFifo<T> {
    fn default() -> Self {
        UniqueFifo {
            items: std::collections::VecDeque::new(),
            queued: std::collections::HashSet::new(),
        }
    }
}

impl<T: Clone + Eq + std::hash::Hash> UniqueFifo<T> {
    /// Queues `item` at the back unless it is queued already.
    pub fn push(&mut self, item: T) {
        if self.queued.insert(item.clone()) {
            self.items.push_back(item);
        }
    }

    /// Takes the front item.
    pub fn pop(&mut self) -> Option<T> {
        let item = self.items.pop_front()?;
        self.queued.remove(&item);
        Some(item)
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::UniqueFifo;

    #[test]
    fn a_unique_fifo_keeps_order_and_holds_each_item_once() {
        let mut fifo = UniqueFifo::default();
        for item in [3, 1, 3, 2, 1] {
            fifo.push(item);
        }
        assert_eq!(fifo.pop(), Some(3));
        // Taken out, an item may be queued again, at the back.
        fifo.push(3);
        assert_eq!(fifo.pop(), Some(1));
        assert_eq!(fifo.pop(), Some(2));
        assert!(!fifo.is_empty());
        assert_eq!(fifo.pop(), Some(3));
        assert_eq!(fifo.pop(), None);
        assert!(fifo.is_empty());
    }
}
