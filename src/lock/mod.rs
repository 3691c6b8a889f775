//! The lock itself, free of any Redis API: what a lock is, who may hold it and how it changes
//! ([`core`]), a hold's record, its holder and grant ([`grant`]), the shared or permit holders of
//! a lock ([`group`]), the server-wide fence floor ([`floor`]), the events a change is announced
//! and replicated as ([`event`]), the one encoding of a lock for RDB, replicated effects and
//! digests ([`codec`]), and the bookkeeping the service keeps beside the keyspace: the lease
//! index ([`lease_index`]), the queues of waiting clients ([`queues`]), the session owners
//! ([`sessions`]) and the cluster slots being imported ([`slots`]); a token as the server keeps
//! it, a digest ([`token`]); the short texts a grant keeps inline ([`text`]).
//!
//! Time is always a parameter here, so every rule is unit-tested without a server.

pub mod ages;
pub mod chunked;
pub mod codec;
pub mod core;
pub mod event;
pub mod floor;
pub mod grant;
pub mod group;
pub mod lease_index;
#[cfg(test)]
pub(crate) mod model_tests;
pub mod queues;
#[cfg(test)]
mod review14_tests;
pub mod sessions;
pub mod slots;
#[cfg(test)]
mod slots_tests;
pub mod text;
pub mod token;

/// A key in a database: how the queues and the session table name a lock.
pub type KeyRef = (i32, Box<[u8]>);

/// The most bytes the module keeps of a text a client chose and the server sets no limit to (a
/// key name in the long-hold log, a client name with a grant or a waiter), as SLOWLOG keeps of
/// an argument: a longer text is kept as its first `KEPT_BYTES` bytes followed by
/// `... (N more bytes)`, N being how many were cut.
pub const KEPT_BYTES: usize = 128;

/// `text` as kept (see [`KEPT_BYTES`]). A text already cut so is left as it is: a client name
/// cut once stays the same through the grant, the waiter and the long-hold log.
pub fn kept(text: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    match text.split_at_checked(KEPT_BYTES) {
        Some((head, cut)) if !cut.is_empty() && !is_cut_mark(cut) => {
            let mark = format!("... ({} more bytes)", cut.len());
            std::borrow::Cow::Owned([head, mark.as_bytes()].concat())
        }
        _ => std::borrow::Cow::Borrowed(text),
    }
}

/// True when `tail` is the mark [`kept`] puts after the bytes it keeps (a count of at most 20
/// digits, so a text that only looks cut is still short).
fn is_cut_mark(tail: &[u8]) -> bool {
    tail.strip_prefix(b"... (")
        .and_then(|rest| rest.strip_suffix(b" more bytes)"))
        .is_some_and(|n| (1..=20).contains(&n.len()) && n.iter().all(u8::is_ascii_digit))
}

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
    use super::{kept, UniqueFifo, KEPT_BYTES};

    #[test]
    fn a_long_text_keeps_128_bytes_and_says_how_many_it_cut_once() {
        let long = vec![b'x'; 1000];
        let cut = [&long[..KEPT_BYTES], b"... (872 more bytes)"].concat();
        assert_eq!(&*kept(&long), &cut[..]);
        // Cut again: the same.
        assert_eq!(&*kept(&cut), &cut[..]);
        // Up to the limit: whole.
        assert_eq!(&*kept(&long[..KEPT_BYTES]), &long[..KEPT_BYTES]);
        assert_eq!(&*kept(b""), b"");
        // Only a mark with a count is one; a long count is not.
        for tail in [
            &b"... ( more bytes)"[..],
            b"... (12x more bytes)",
            b"... (123456789012345678901 more bytes)",
            b"... (5 more bytes) ",
        ] {
            let text = [&long[..KEPT_BYTES], tail].concat();
            let more = format!("... ({} more bytes)", tail.len());
            assert_eq!(
                &*kept(&text),
                &[&long[..KEPT_BYTES], more.as_bytes()].concat()[..]
            );
        }
    }

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
