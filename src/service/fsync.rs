//! `FSYNC timeout-ms`: replies that wait until their change is fsynced to this server's AOF.
//!
//! No server tells a module how far its AOF is fsynced (no INFO field, API or event; WAITAOF
//! through `RM_Call` measures the call's own fake client, which never wrote), so the module
//! fsyncs the AOF files itself, for many waiting replies at once (a group commit):
//! - every change waiting for it is tagged with the event-loop turn that made it; its effect is
//!   in the AOF buffer that Redis writes at the end of that turn (after the module's
//!   before-sleep hook);
//! - right after the next sleep, before any command of the new turn runs, an empty AOF buffer
//!   with no write error means that write happened (with `appendfsync everysec` Redis may put a
//!   write off for up to 2 s while its own fsync runs); then a worker thread fdatasyncs every
//!   incremental file the AOF manifest lists (an AOF rewrite may have begun a new one), and
//!   publishes the turn it covers;
//! - the waiting replies up to that turn are answered in the next before-sleep hook (`acks`),
//!   with the same take-back rule as SYNC when the timeout passes first.
//!
//! While the AOF is being switched on at runtime (Redis writes to a temporary file that is not
//! in the manifest until its first rewrite ends), or when a write or fsync fails, nothing is
//! confirmed: the timeouts decide.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, OnceLock};

use redis_module::Context;

use crate::host;
use crate::host::server::{aof_written, config_text};
use crate::lock::locked;
use crate::metrics;

/// The current event-loop turn (counted from 1 in the after-sleep hook).
static TURN: AtomicU64 = AtomicU64::new(1);
/// The latest turn a waiting reply needs fsynced.
static WANTED: AtomicU64 = AtomicU64::new(0);
/// Every change made up to this turn is fsynced.
static FSYNCED: AtomicU64 = AtomicU64::new(0);
/// The worker is fsyncing.
static IN_FLIGHT: AtomicBool = AtomicBool::new(false);
/// After a failed fsync, none is tried before this time (`metrics::monotonic_us`).
static RETRY_AT: AtomicU64 = AtomicU64::new(0);
/// How long a failed fsync waits before the next try, in µs.
const RETRY_US: u64 = 10_000;

/// Where the AOF is: its directory (relative to the server's working directory, its `dir`) and
/// its file name's stem, both fixed for the life of the server.
#[derive(Clone, Debug)]
struct AofFiles {
    dir: PathBuf,
    name: String,
}

struct Job {
    through: u64,
    files: AofFiles,
}

static WORKER: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

/// The event loop was asked, in this turn, not to sleep after it.
static WAKE_ASKED: AtomicBool = AtomicBool::new(false);

/// The turn a change made now belongs to; a reply waiting for it is answered once
/// [`fsynced_through`] reaches it. The event loop is asked (once per turn) not to sleep after
/// this turn, so that the after-sleep hook looks at once, not at the next client's command or
/// timer.
pub fn tag() -> u64 {
    let turn = TURN.load(Ordering::Relaxed);
    WANTED.fetch_max(turn, Ordering::Relaxed);
    if !WAKE_ASKED.swap(true, Ordering::Relaxed) {
        host::events::wake_event_loop();
    }
    turn
}

/// Every change made up to this turn is fsynced to the AOF.
pub fn fsynced_through() -> u64 {
    FSYNCED.load(Ordering::Acquire)
}

/// Just after each event-loop sleep: the previous turn's AOF write has happened (or been put
/// off); when a waiting reply needs it, and the AOF buffer is empty, the worker fsyncs.
pub fn after_sleep(ctx: &Context) {
    let written = TURN.fetch_add(1, Ordering::Relaxed);
    WAKE_ASKED.store(false, Ordering::Relaxed);
    if WANTED.load(Ordering::Relaxed) <= fsynced_through()
        || IN_FLIGHT.load(Ordering::Acquire)
        || metrics::monotonic_us() < RETRY_AT.load(Ordering::Relaxed)
    {
        return;
    }
    let Some(state) = aof_written(ctx) else {
        return;
    };
    if !state.enabled || !state.buffer_empty || !state.write_ok {
        return;
    }
    let Some(files) = aof_files(ctx) else {
        return;
    };
    let Some(worker) = worker() else {
        return;
    };
    IN_FLIGHT.store(true, Ordering::Release);
    if locked(worker)
        .send(Job {
            through: written,
            files,
        })
        .is_err()
    {
        IN_FLIGHT.store(false, Ordering::Release);
    }
}

/// The AOF's directory and name, read once from the configuration (both are immutable).
fn aof_files(ctx: &Context) -> Option<AofFiles> {
    static FILES: OnceLock<AofFiles> = OnceLock::new();
    if let Some(files) = FILES.get() {
        return Some(files.clone());
    }
    let files = AofFiles {
        dir: PathBuf::from(config_text(ctx, "appenddirname")?),
        name: config_text(ctx, "appendfilename")?,
    };
    Some(FILES.get_or_init(|| files).clone())
}

/// The worker thread's queue, started at the first use.
fn worker() -> Option<&'static Mutex<Sender<Job>>> {
    if let Some(worker) = WORKER.get() {
        return Some(worker);
    }
    let (send, receive) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("lock-fsync".into())
        .spawn(move || {
            for job in receive {
                let result = std::panic::catch_unwind(|| fsync_files(&job.files));
                let done = matches!(result, Ok(Ok(())));
                if done {
                    metrics::FSYNCS.incr();
                    FSYNCED.fetch_max(job.through, Ordering::AcqRel);
                } else {
                    // Tried again later (the timeouts decide meanwhile), not in a busy loop.
                    metrics::FSYNC_ERRORS.incr();
                    RETRY_AT.store(metrics::monotonic_us() + RETRY_US, Ordering::Relaxed);
                }
                IN_FLIGHT.store(false, Ordering::Release);
                if done {
                    host::events::wake_event_loop();
                }
            }
        })
        .ok()?;
    Some(WORKER.get_or_init(|| Mutex::new(send)))
}

/// Why the files could not be confirmed fsynced.
#[derive(Debug)]
enum NotDurable {
    /// The AOF is being switched on: its writes go to a file outside the manifest.
    Switching,
    Io,
}

/// fdatasyncs every incremental file the manifest lists. A file gone meanwhile was folded into
/// a new base by a rewrite (which fsynced it): the manifest is read again.
fn fsync_files(files: &AofFiles) -> Result<(), NotDurable> {
    let temporary = files.dir.join(format!("temp-{}.incr", files.name));
    if temporary.exists() {
        return Err(NotDurable::Switching);
    }
    let manifest = files.dir.join(format!("{}.manifest", files.name));
    for _ in 0..3 {
        let text = std::fs::read_to_string(&manifest).map_err(|_| NotDurable::Io)?;
        let mut all = true;
        for name in incremental_files(&text) {
            match std::fs::File::open(files.dir.join(name)) {
                Ok(file) => file.sync_data().map_err(|_| NotDurable::Io)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    all = false;
                    break;
                }
                Err(_) => return Err(NotDurable::Io),
            }
        }
        if all {
            return Ok(());
        }
    }
    Err(NotDurable::Io)
}

/// The names of the incremental files (`type i`) in an AOF manifest: one file per line, as
/// `file <name> seq <n> type <b|h|i>` (the name may be quoted when it has spaces; the server's
/// own names have none, and a quoted one is skipped, never guessed at).
fn incremental_files(manifest: &str) -> impl Iterator<Item = &str> {
    manifest.lines().filter_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut name = None;
        let mut kind = None;
        for pair in words.chunks(2) {
            match pair {
                ["file", value] => name = Some(*value),
                ["type", value] => kind = Some(*value),
                _ => {}
            }
        }
        name.filter(|n| !n.starts_with('"') && kind == Some("i"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_names_its_incremental_files() {
        let manifest = "file appendonly.aof.3.base.rdb seq 3 type b\n\
                        file appendonly.aof.4.incr.aof seq 4 type h\n\
                        file appendonly.aof.5.incr.aof seq 5 type i\n\
                        file appendonly.aof.6.incr.aof seq 6 type i\n\
                        file \"with space.incr\" seq 7 type i\n";
        let names: Vec<&str> = incremental_files(manifest).collect();
        assert_eq!(
            names,
            ["appendonly.aof.5.incr.aof", "appendonly.aof.6.incr.aof"]
        );
        assert_eq!(incremental_files("").count(), 0);
    }

    #[test]
    fn a_missing_manifest_or_a_switch_in_progress_confirms_nothing() {
        let dir = std::env::temp_dir().join(format!("lock-fsync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = AofFiles {
            dir: dir.clone(),
            name: "appendonly.aof".into(),
        };
        assert!(matches!(fsync_files(&files), Err(NotDurable::Io)));
        std::fs::write(
            dir.join("appendonly.aof.manifest"),
            "file appendonly.aof.1.incr.aof seq 1 type i\n",
        )
        .unwrap();
        std::fs::write(dir.join("appendonly.aof.1.incr.aof"), "*1\r\n").unwrap();
        assert!(fsync_files(&files).is_ok());
        std::fs::write(dir.join("temp-appendonly.aof.incr"), "").unwrap();
        assert!(matches!(fsync_files(&files), Err(NotDurable::Switching)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
