//! What happened to a lock: the word a change is replicated as, and the keyspace notification it
//! is announced with.

use std::ffi::CStr;

/// One kind of change. Replicas count the same events as their primary, so each kind has its
/// own word; `Sync` restates a lock without announcing anything (AOF rewrite).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Acquire,
    /// The exclusive holder turned its hold into a shared one.
    Downgrade,
    Release,
    /// A release that dropped one of several reentrant holds: the lock stays held.
    DropHold,
    /// The connection that owned a session lock closed.
    SessionEnd,
    Renew,
    Expired,
    ForceRelease,
    Sync,
    /// A free lock deleted: nobody held or awaited it for `lock.tombstone-ttl`.
    Reclaim,
}

impl Event {
    const ALL: [Event; 10] = [
        Event::Acquire,
        Event::Downgrade,
        Event::Release,
        Event::DropHold,
        Event::SessionEnd,
        Event::Renew,
        Event::Expired,
        Event::ForceRelease,
        Event::Sync,
        Event::Reclaim,
    ];

    /// True when the change ended a hold (or more) or made room for shared holders: waiters
    /// may get their turn, and sessions of holds that ended are forgotten.
    pub fn frees(self) -> bool {
        matches!(
            self,
            Event::Release
                | Event::SessionEnd
                | Event::Expired
                | Event::ForceRelease
                | Event::Downgrade
        )
    }

    /// The event's name in `LOCK.APPLY`.
    pub fn word(self) -> &'static CStr {
        match self {
            Event::Acquire => c"acquire",
            Event::Downgrade => c"downgrade",
            Event::Release => c"release",
            Event::DropHold => c"drophold",
            Event::SessionEnd => c"sessionend",
            Event::Renew => c"renew",
            Event::Expired => c"expired",
            Event::ForceRelease => c"forcerelease",
            Event::Sync => c"sync",
            Event::Reclaim => c"reclaim",
        }
    }

    /// The keyspace notification, published in the module class (`d`).
    pub fn notification(self) -> Option<&'static CStr> {
        match self {
            Event::Acquire => Some(c"lock.acquire"),
            Event::Downgrade => Some(c"lock.downgrade"),
            Event::Release | Event::SessionEnd => Some(c"lock.release"),
            Event::Renew => Some(c"lock.renew"),
            Event::Expired => Some(c"lock.expired"),
            Event::ForceRelease => Some(c"lock.forcerelease"),
            Event::DropHold | Event::Sync | Event::Reclaim => None,
        }
    }

    pub fn parse(word: &[u8]) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.word().to_bytes() == word)
    }
}
