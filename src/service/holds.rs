//! How long locks are held: the age of the oldest hold (INFO), and long holds, the holds that
//! last longer than `lock.long-hold`: each is counted, announced once with the keyspace event
//! `lock.longhold` on its key, and logged (`LOCK.LONGHOLDS`, like SLOWLOG) with how it ended.
//!
//! The ages follow every announced change of a lock (see `effects::announce`), and a lock
//! leaves them with its value (see [`forget`]). A hold becomes long when the lease index looks at
//! its lock (its due time counts the crossing, see `Stored::due`): on a primary only, so a
//! replica counts and logs nothing, and a new primary announces a hold once more.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard};

use redis_module::{Context, NotifyEvent, RedisString, RedisValue};

use crate::config;
use crate::error::LockError;
use crate::host::command::{reply_nested, CommandResult, Nested};
use crate::host::keys;
use crate::host::server::{is_primary, now_ms, selected_db};
use crate::lock::ages::{tag_of, tag_text, Ages, Crossing, LongLog, Space, UNKNOWN};
use crate::lock::core::Lock;
use crate::lock::event::Event;
use crate::lock::locked;
use crate::lock::sessions;
use crate::metrics;
use crate::service::value::{Entries, Stored};
use crate::service::{leases, policy};

static AGES: Mutex<Ages> = Mutex::new(Ages::new());
static LOG: Mutex<LongLog> = Mutex::new(LongLog::new());

fn ages() -> MutexGuard<'static, Ages> {
    locked(&AGES)
}

fn log() -> MutexGuard<'static, LongLog> {
    locked(&LOG)
}

/// The `lock.long-hold` the index last followed.
static INDEXED_THRESHOLD: AtomicI64 = AtomicI64::new(0);

/// True (once per change) when `lock.long-hold` changed since the lease index last followed
/// it: every held lock's crossing time moved, and the index must be rebuilt.
pub fn threshold_changed() -> bool {
    let now = config::LONG_HOLD.get();
    INDEXED_THRESHOLD.swap(now, Ordering::Relaxed) != now
}

fn log_len() -> usize {
    usize::try_from(config::LONG_HOLD_LOG_LEN.get()).unwrap_or(0)
}

/// After a change of the lock `stored` under `key`: its oldest hold.
pub fn follow(stored: &Stored, key: &[u8]) {
    set_oldest(stored, key, age_of(stored.lock()));
}

/// What the ages record of `lock`: its oldest grant time, [`UNKNOWN`] when it is held by holds
/// of unknown grant time only, None when free.
fn age_of(lock: &Lock) -> Option<u64> {
    lock.has_holders()
        .then(|| lock.oldest_grant().unwrap_or(UNKNOWN))
}

/// After a change (`event`) of the lock `stored` under `key`: its oldest hold, without looking
/// through all its holders when the change cannot have moved it. A release, an expiry or a
/// forced release only took holds away: the oldest is the recorded one while that is still the
/// oldest grant (read without a pass when the shared holders are in grant order: see
/// `Group::oldest_grant`, so readers leaving oldest first cost no pass each). A grant (or a
/// refresh) added at most the newest hold: if a hold granted at the recorded oldest time is
/// still there, and the newest is no older, the oldest is unchanged.
pub fn follow_change(stored: &Stored, key: &[u8], event: Event) {
    let lock = stored.lock();
    let recorded = ages().since_of(stored.id(), stored.age_slot());
    let oldest = match (recorded, event) {
        (Some(_), Event::Release | Event::SessionEnd | Event::Expired | Event::ForceRelease) => {
            lock.oldest_grant()
        }
        (Some(recorded), Event::Acquire) => {
            let newest = lock
                .members()
                .last()
                .map(|m| &m.holder)
                .or(lock.holder.as_ref())
                .map(|h| h.grant.since);
            if newest.is_some_and(|since| since >= recorded)
                && lock.all_holders().any(|(_, h)| h.grant.since == recorded)
            {
                return;
            }
            lock.oldest_grant()
        }
        _ => lock.oldest_grant(),
    };
    if recorded.is_some() && oldest == recorded {
        return;
    }
    set_oldest(
        stored,
        key,
        lock.has_holders().then(|| oldest.unwrap_or(UNKNOWN)),
    );
}

fn set_oldest(stored: &Stored, key: &[u8], since: Option<u64>) {
    let slot = ages().set(stored.id(), stored.age_slot(), since, || {
        (tag_of(key), policy::space_of(key))
    });
    stored.set_age_slot(slot);
}

/// The lock `stored` arrived under `key` (RENAME, MOVE, COPY, RESTORE).
pub fn arrived(stored: &Stored, key: &[u8]) {
    ages().retag(
        stored.id(),
        stored.age_slot(),
        tag_of(key),
        policy::space_of(key),
    );
    follow(stored, key);
}

/// The policy changed: the lock `stored` under `key` is counted in its key's namespace now.
pub fn respace(stored: &Stored, key: &[u8]) {
    ages().respace(stored.id(), stored.age_slot(), policy::space_of(key));
}

/// After the walk that followed a policy change: puts the ages back in time order, about
/// `budget` locks at a time (see `Ages::merge_aside`); true once done.
pub fn merge_aside(budget: usize) -> bool {
    ages().merge_aside(budget)
}

/// Before loading's rebuild ([`follow`] for each lock found): no lock has an age.
pub fn clear() {
    INDEXED_THRESHOLD.store(config::LONG_HOLD.get(), Ordering::Relaxed);
    ages().clear();
}

/// The value of lock `id` is being freed (possibly on a lazy-free thread): its age goes, and
/// its logged long holds end as deleted. Also takes its lease index entry out, and ends its
/// sessions.
pub fn forget(id: u64, entries: Entries) {
    leases::forget(id, entries.index);
    ages().forget(id, entries.age);
    if entries.long {
        log().all_ended(id, "deleted", now_ms());
    }
    if entries.sessions {
        sessions::value_freed(id);
    }
}

/// The word a long hold's log entry shows for the change that ended it.
fn ending_of(event: Event) -> &'static str {
    match event {
        Event::Release | Event::DropHold => "released",
        Event::Expired => "expired",
        Event::ForceRelease => "forced",
        Event::SessionEnd => "session",
        // A downgrade keeps the hold; anything else that ends one replaced the lock.
        _ => "replaced",
    }
}

/// Before a change of `stored`: the fences of its long holds, to see which the change ends.
pub fn long_before(stored: &Stored) -> Vec<u64> {
    stored.lock().long_fences()
}

/// After a change (`event`) of `stored`: the long holds of `before` that are gone ended so.
pub fn ended(stored: &Stored, before: &[u64], event: Event, now: u64) {
    let gone = before
        .iter()
        .filter(|fence| !stored.lock().has_hold_with(**fence));
    let mut log = None;
    for fence in gone {
        log.get_or_insert_with(self::log)
            .ended(stored.id(), *fence, ending_of(event), now);
    }
}

/// On a primary, when the lease index looks at the lock under `key`: the holds that became long
/// holds are counted, announced and logged.
pub fn cross(ctx: &Context, key: &RedisString, stored: &mut Stored, now: u64) {
    if !is_primary(ctx) {
        return;
    }
    let crossed = stored.mark_long(policy::long_hold_of(key.as_slice()), now);
    if crossed.is_empty() {
        return;
    }
    let db = selected_db(ctx);
    let max = log_len();
    for (fence, grant) in crossed {
        metrics::LONG_HOLDS.incr();
        keys::notify(ctx, NotifyEvent::MODULE, c"lock.longhold", key);
        log().record(
            Crossing {
                at: now,
                db,
                key: key.as_slice(),
                lock: stored.id(),
                fence,
                since: grant.since,
                client: grant.client,
                who: grant.who(),
            },
            max,
        );
    }
}

/// INFO: the age of the oldest hold in ms (0 when nothing is held), and its key's tag (empty
/// when none).
pub fn oldest() -> (u64, String) {
    match ages().oldest() {
        Some((since, tag)) => (now_ms().saturating_sub(since), tag_text(tag)),
        None => (0, String::new()),
    }
}

/// The grant time of the oldest hold of `stored` (ms since the epoch), as the ages record it;
/// None when nobody holds it, or no hold's grant time is known.
pub fn since_of(stored: &Stored) -> Option<u64> {
    ages().since_of(stored.id(), stored.age_slot())
}

/// INFO, per namespace: the held locks in `space`, and the age of their oldest hold in ms (0
/// when none).
pub fn in_space(space: Space) -> (usize, u64) {
    let ages = ages();
    let oldest = ages
        .oldest_in(space)
        .map_or(0, |(since, _)| now_ms().saturating_sub(since));
    (ages.len_in(space), oldest)
}

/// `LOCK.LONGHOLDS GET [count] | LEN | RESET`.
pub fn longholds(ctx: &Context, args: &[RedisString]) -> CommandResult {
    let [_, subcommand, rest @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    let word = subcommand.as_slice();
    // `lock.long-hold-log-len` may have been lowered since the last entry.
    log().trim(log_len());
    if word.eq_ignore_ascii_case(b"LEN") && rest.is_empty() {
        return Ok(RedisValue::Integer(
            i64::try_from(log().len()).unwrap_or(i64::MAX),
        ));
    }
    if word.eq_ignore_ascii_case(b"RESET") && rest.is_empty() {
        log().reset();
        return Ok(RedisValue::SimpleStringStatic("OK"));
    }
    if !word.eq_ignore_ascii_case(b"GET") {
        return Err(LockError::UnknownSubcommand {
            command: "LOCK.LONGHOLDS",
            expected: "GET [count], LEN or RESET",
        });
    }
    // Like SLOWLOG GET: 10 by default, -1 for all.
    let count = match rest {
        [] => 10,
        [count] => match crate::host::server::parse_integer(count) {
            Some(-1) => usize::MAX,
            Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
            _ => {
                return Err(LockError::BadInteger {
                    name: "count",
                    detail: "must be -1 or a non-negative integer",
                })
            }
        },
        _ => return Err(LockError::WrongArity),
    };
    let now = now_ms();
    let entries = log()
        .newest(count)
        .map(|entry| {
            Nested::Map(vec![
                ("id", Nested::int(entry.id)),
                ("time", Nested::int(entry.at / 1000)),
                ("key", Nested::bulk(&entry.key)),
                ("tag", Nested::bulk(tag_text(entry.tag).as_bytes())),
                ("db", Nested::int(entry.db)),
                (
                    "held_ms",
                    Nested::int(entry.held_ms.unwrap_or(now.saturating_sub(entry.since))),
                ),
                (
                    "granted_at",
                    Nested::int(super::who::granted_at(entry.since)),
                ),
                ("fence", Nested::int(entry.fence)),
                ("label", Nested::bulk(&entry.label)),
                ("client_id", Nested::int(entry.client)),
                ("client_name", Nested::bulk(&entry.name)),
                ("client_addr", Nested::bulk(&entry.addr)),
                ("ended", Nested::word(entry.ended.unwrap_or("held"))),
            ])
        })
        .collect();
    reply_nested(ctx, Nested::List(entries))
}

/// review15: `follow_change` (rewritten in e9201a1) keeps the ages' record of a lock's oldest
/// hold exact through random sequences of every event, against the parent commit's logic.
#[cfg(test)]
mod review15_tests {
    use super::*;
    use crate::lock::codec::{effect_args, parse_effect};
    use crate::lock::core::tests::{asking, dg, T0};
    use crate::lock::core::{Acquire, Mode};
    use crate::lock::grant::{Grant, Holder};
    use crate::lock::group::Member;

    use crate::lock::model_tests::Rng;

    /// `follow_change` as it was before e9201a1.
    fn old_follow_change(stored: &Stored, key: &[u8], event: Event) {
        let lock = stored.lock();
        let recorded = ages().since_of(stored.id(), stored.age_slot());
        if let Some(recorded) = recorded {
            let newest = lock
                .members()
                .last()
                .map(|m| &m.holder)
                .or(lock.holder.as_ref())
                .map(|h| h.grant.since);
            let kept = match event {
                Event::Acquire => newest.is_some_and(|since| since >= recorded),
                Event::Release | Event::SessionEnd | Event::Expired | Event::ForceRelease => true,
                _ => false,
            };
            if kept && lock.all_holders().any(|(_, h)| h.grant.since == recorded) {
                return;
            }
        }
        set_oldest(stored, key, age_of(lock));
    }

    fn exact(lock: &Lock) -> Option<u64> {
        lock.all_holders()
            .map(|(_, h)| h.grant.since)
            .filter(|since| *since > 0)
            .min()
    }

    /// What the ages hold for `stored`: (tracked, its oldest known grant time).
    fn recorded(stored: &Stored) -> (bool, Option<u64>) {
        let tracked = stored.age_slot().is_some();
        (tracked, ages().since_of(stored.id(), stored.age_slot()))
    }

    #[test]
    fn review15_follow_change_keeps_the_exact_oldest_through_every_event() {
        let mut counts = std::collections::BTreeMap::new();
        for case in 0..60u64 {
            let mut rng = Rng(0xA6E5_0000 + case);
            let key = format!("review15:ages:{case}").into_bytes();
            // The new logic on one value, the old on another: the same changes to both.
            let mut new = Stored::new(Lock::default());
            let mut old = Stored::new(Lock::default());
            follow(&new, &key);
            follow(&old, &key);
            let limit = if case % 3 == 2 { 5 } else { 0 };
            let mode = if limit == 0 {
                Mode::Shared
            } else {
                Mode::Permit(limit)
            };
            let pool = 3 + rng.below(20);
            let mut now = T0;
            let mut floor = 0;
            for step in 0..400u64 {
                now = match rng.below(10) {
                    0 => now,
                    1..=6 => now + rng.below(40),
                    7 => now + 500 + rng.below(1_000),
                    _ => now.saturating_sub(rng.below(300)),
                };
                let name = format!("t{}", rng.below(pool)).into_bytes();
                let token = dg(&name);
                let ttl = 300 + rng.below(1_500);
                let op = rng.below(16);
                let session = rng.chance(30);
                let reentrant = rng.chance(25);
                let budget = 1 + rng.below(10) as usize;
                let force = rng.chance(30);
                let sync_to = (op == 14).then(|| {
                    let args = effect_args(Event::Sync, new.lock());
                    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                    parse_effect(&refs).expect("a whole state parses").lock
                });
                let change = |lock: &mut Lock| -> Option<Event> {
                    match op {
                        0..=4 => {
                            let mut request = asking(&name, ttl, mode);
                            request.session = session;
                            request.reentrant = reentrant;
                            while lock.expire(now) {}
                            match lock.grant(&request, floor, now) {
                                Ok(Acquire::Granted { .. } | Acquire::Refreshed { .. }) => {
                                    Some(Event::Acquire)
                                }
                                Ok(Acquire::Downgraded { .. }) => Some(Event::Downgrade),
                                _ => None,
                            }
                        }
                        5 if limit == 0 => {
                            let request = asking(&name, ttl, Mode::Exclusive);
                            while lock.expire(now) {}
                            match lock.grant(&request, floor, now) {
                                Ok(Acquire::Granted { .. } | Acquire::Refreshed { .. }) => {
                                    Some(Event::Acquire)
                                }
                                _ => None,
                            }
                        }
                        6 | 7 => match lock.release(&token, now) {
                            Some(true) => Some(Event::Release),
                            Some(false) => Some(Event::DropHold),
                            None => None,
                        },
                        8 => lock.renew(&token, ttl, now).then_some(Event::Renew),
                        9 => {
                            let gone = lock.expire_members(now, budget);
                            (!gone.is_empty() || lock.expire(now)).then_some(Event::Expired)
                        }
                        10 => lock.end_session(&token, now).then_some(Event::SessionEnd),
                        11 => (force && lock.force_release(now)).then_some(Event::ForceRelease),
                        12 => {
                            // A holder of unknown grant time arrives (an older release's
                            // holder, applied as a replica applies a member).
                            if lock.holder.is_some()
                                || lock.members().iter().any(|m| *m.holder.token() == token)
                            {
                                return None;
                            }
                            if limit > 0 && lock.members().len() >= limit as usize {
                                return None;
                            }
                            let group = lock.group.get_or_insert_with(Box::default);
                            group.limit = limit;
                            let fence = lock.fence.max(floor) + 1;
                            group.push(Member::new(
                                fence,
                                Holder {
                                    deadline: now + ttl,
                                    holds: 1,
                                    session: false,
                                    provisional: false,
                                    long: false,
                                    grant: Box::new(Grant::new(token, 0, 0, 0, b"")),
                                },
                            ));
                            lock.fence = fence;
                            Some(Event::Acquire)
                        }
                        13 => {
                            let _ = lock.mark_long(200, now);
                            None
                        }
                        14 => {
                            *lock = sync_to.clone()?;
                            Some(Event::Sync)
                        }
                        _ => None,
                    }
                };
                let event_new = new.update_at(now, change);
                let event_old = old.update_at(now, change);
                assert_eq!(event_new, event_old);
                floor = floor.max(new.lock().fence);
                let Some(event) = event_new else { continue };
                *counts.entry(format!("{event:?}")).or_insert(0u32) += 1;
                follow_change(&new, &key, event);
                old_follow_change(&old, &key, event);
                let what = format!("case {case} step {step} {event:?}");
                let truth = exact(new.lock());
                let held = new.lock().has_holders();
                assert_eq!(recorded(&old), (held, truth), "{what}: the parent's logic");
                assert_eq!(
                    recorded(&new),
                    (held, truth),
                    "{what}: {:?}",
                    new.lock()
                        .all_holders()
                        .map(|(_, h)| h.grant.since)
                        .collect::<Vec<_>>()
                );
            }
            set_oldest(&new, &key, None);
            set_oldest(&old, &key, None);
        }
        for event in [
            "Acquire",
            "Release",
            "DropHold",
            "Renew",
            "Expired",
            "SessionEnd",
            "ForceRelease",
            "Downgrade",
            "Sync",
        ] {
            assert!(
                counts.get(event).is_some_and(|n| *n > 0),
                "{event} never came: {counts:?}"
            );
        }
    }
}
