//! `FSYNC timeout-ms`: replies that wait until their change is fsynced to this server's AOF.
//!
//! No server tells a module how far its AOF is fsynced (no INFO field, API or event; WAITAOF
//! through `RM_Call` measures the call's own fake client, which never wrote), so the module
//! fsyncs the AOF files itself, for many waiting replies at once (a group commit), and confirms
//! a turn only on positive evidence:
//! - every change waiting for it is tagged with the event-loop turn that made it; its effect is
//!   in the AOF buffer that Redis writes at the end of that turn (after the module's
//!   before-sleep hook);
//! - right after the next sleep, before any command of the new turn runs, an empty AOF buffer
//!   with no write error means that write happened (with `appendfsync everysec` Redis may put a
//!   write off for up to 2 s while its own fsync runs); then a worker thread reads the AOF
//!   manifest with the server's own rules (`host::aof`), checks that the file the server is
//!   appending to *is* the last incremental file the manifest names (it is not while the AOF is
//!   being switched on: the server then writes nowhere, or to a temporary file it names only
//!   when the first rewrite ends), and fdatasyncs every incremental file the manifest names (a
//!   rewrite that began after the write moved appending to a new one). Only when all of that
//!   succeeded does it hand over the turn it covers;
//! - back on the main thread, the turn is confirmed if the server still reports its own AOF
//!   writes and fsyncs as ok (`aof_last_write_status`), and the waiting replies up to it are
//!   answered in the next before-sleep hook (`acks`), with the take-back rule of SYNC when the
//!   timeout passes first.
//!
//! Anything else (no manifest, one the server would not load, no incremental file, the server
//! appending elsewhere, a file missing, a failed fsync) confirms nothing: the timeouts decide,
//! `lock_fsync_errors` counts the tries and the log says why. A stray temporary file left by a
//! crash is named by no manifest and plays no part.
//!
//! Writeback errors: the kernel reports a failed writeback once to each open file description
//! that was open when it happened, and to a description opened later only while nobody has seen
//! it yet. The worker opens the files afresh each time, so an error the server's own fsync saw
//! first would be missed by it; the server then reports `aof_last_write_status:err` until its
//! next successful fsync (about a second later with `everysec`; `always` stops the server), which
//! is why that status is read both before the worker starts and after it finished, and why a
//! job that took 0.9 s or more between the two reads confirms nothing. An error the worker sees
//! itself marks the file: the data in it may be lost in the middle, so nothing is confirmed
//! again until a rewrite has replaced that file (its data then lives in the new base).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, OnceLock};

use redis_module::Context;

use crate::host;
use crate::host::aof::{self, FileId, FileKind};
use crate::host::server::{aof_written, config_text};
use crate::lock::locked;
use crate::metrics;

/// The current event-loop turn (counted from 1 in the after-sleep hook).
static TURN: AtomicU64 = AtomicU64::new(1);
/// The latest turn a waiting reply needs fsynced.
static WANTED: AtomicU64 = AtomicU64::new(0);
/// Every change made up to this turn is fsynced.
static FSYNCED: AtomicU64 = AtomicU64::new(0);
/// The worker's last fsync, not yet confirmed by the main thread.
static WORKER_DONE: Mutex<Option<Done>> = Mutex::new(None);
/// [`WORKER_DONE`] holds one (so the main thread looks at the mutex only then).
static WORKER_DONE_READY: AtomicBool = AtomicBool::new(false);

/// What a finished job fsynced, and when it was handed over.
#[derive(Clone, Copy)]
struct Done {
    /// Every change made up to this turn is in the files it fsynced.
    through: u64,
    /// When the main thread read the server's AOF status as fine and sent the job
    /// (`metrics::monotonic_us`).
    sent_us: u64,
}
/// The longest a job may take, from the status read before it to the one after, and still be
/// confirmed: the server reports a failed fsync of its own for about a second (until its next
/// fsync succeeds, with `appendfsync everysec`), so within this the two reads cannot both miss
/// it.
const JOB_WITHIN_US: u64 = 900_000;
/// The worker is fsyncing.
static IN_FLIGHT: AtomicBool = AtomicBool::new(false);
/// After a failed try, none is made before this time (`metrics::monotonic_us`).
static RETRY_AT: AtomicU64 = AtomicU64::new(0);
/// How long a failed try waits before the next, in µs.
const RETRY_US: u64 = 10_000;
/// Why the last try confirmed nothing ([`NotDurable`] as a number; 0: it confirmed).
static REFUSAL: AtomicU8 = AtomicU8::new(0);

/// Where the AOF is: its directory (relative to the server's working directory, its `dir`) and
/// its file name's stem, both fixed for the life of the server.
#[derive(Clone, Debug)]
struct AofFiles {
    dir: PathBuf,
    name: String,
}

struct Job {
    done: Done,
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

/// Just after each event-loop sleep: confirms what the worker fsynced if the server's own AOF
/// writes are still fine; then, when a waiting reply needs the previous turn's write and the
/// AOF buffer is empty, hands the worker the next fsync.
pub fn after_sleep(ctx: &Context) {
    let written = TURN.fetch_add(1, Ordering::Relaxed);
    WAKE_ASKED.store(false, Ordering::Relaxed);
    let worker_done = WORKER_DONE_READY
        .swap(false, Ordering::AcqRel)
        .then(|| locked(&WORKER_DONE).take())
        .flatten()
        .filter(|done| done.through > fsynced_through());
    let start = WANTED.load(Ordering::Relaxed) > fsynced_through()
        && !IN_FLIGHT.load(Ordering::Acquire)
        && metrics::monotonic_us() >= RETRY_AT.load(Ordering::Relaxed);
    if worker_done.is_some() || start {
        let state = aof_written(ctx);
        let server_ok = state.is_some_and(|s| s.enabled && s.write_ok);
        if let Some(done) = worker_done {
            let took = metrics::monotonic_us().saturating_sub(done.sent_us);
            if !server_ok {
                refused(NotDurable::ServerWriteError);
            } else if took >= JOB_WITHIN_US {
                refused(NotDurable::Slow);
            } else {
                FSYNCED.fetch_max(done.through, Ordering::AcqRel);
            }
        }
        if start && server_ok && state.is_some_and(|s| s.buffer_empty) {
            send(ctx, written);
        }
    }
    log_refusal();
}

/// Hands the worker the fsync that covers turn `through`.
fn send(ctx: &Context, through: u64) {
    let (Some(files), Some(worker)) = (aof_files(ctx), worker()) else {
        return;
    };
    IN_FLIGHT.store(true, Ordering::Release);
    let done = Done {
        through,
        sent_us: metrics::monotonic_us(),
    };
    if locked(worker).send(Job { done, files }).is_err() {
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

/// What the worker keeps from one fsync to the next.
#[derive(Default)]
struct WorkerState {
    /// The server's descriptor for the file it appends to, as found last time.
    writer: Option<i32>,
    /// Files an fsync of the worker failed on, while the manifest still names them.
    failed: Vec<(FileId, Vec<u8>)>,
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
            let mut state = WorkerState::default();
            for job in receive {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    fsync_files(&job.files, &mut state)
                }));
                let outcome = result.unwrap_or(Err(NotDurable::Io));
                if outcome.is_ok() {
                    metrics::FSYNCS.incr();
                    // A later job covers what an earlier one did, timed from its own start.
                    let mut slot = locked(&WORKER_DONE);
                    if slot.is_none_or(|earlier| earlier.through < job.done.through) {
                        *slot = Some(job.done);
                    }
                    drop(slot);
                    WORKER_DONE_READY.store(true, Ordering::Release);
                    REFUSAL.store(0, Ordering::Relaxed);
                } else if let Err(why) = outcome {
                    refused(why);
                }
                IN_FLIGHT.store(false, Ordering::Release);
                if outcome.is_ok() {
                    host::events::wake_event_loop();
                }
            }
        })
        .ok()?;
    Some(WORKER.get_or_init(|| Mutex::new(send)))
}

/// Why a turn could not be confirmed fsynced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum NotDurable {
    NoManifest = 1,
    BadManifest,
    NoIncrementalFile,
    /// The server does not append to the manifest's last incremental file.
    NotAppending,
    FileMissing,
    Io,
    /// An earlier fsync of a file still in the manifest failed.
    FailedBefore,
    /// The server reports a failed AOF write or fsync of its own.
    ServerWriteError,
    /// The fsync took too long for the server's own status, read before and after, to be
    /// sure to show a failure meanwhile.
    Slow,
}

impl NotDurable {
    const ALL: [NotDurable; 9] = [
        NotDurable::NoManifest,
        NotDurable::BadManifest,
        NotDurable::NoIncrementalFile,
        NotDurable::NotAppending,
        NotDurable::FileMissing,
        NotDurable::Io,
        NotDurable::FailedBefore,
        NotDurable::ServerWriteError,
        NotDurable::Slow,
    ];

    fn describe(self) -> &'static str {
        match self {
            NotDurable::NoManifest => "the AOF manifest cannot be read",
            NotDurable::BadManifest => "the AOF manifest is not in the server's format",
            NotDurable::NoIncrementalFile => "the AOF manifest names no incremental file",
            NotDurable::NotAppending => {
                "the server is not appending to the incremental file its AOF manifest names \
                 last (the AOF is being switched on until its first rewrite ends, or the \
                 server's dir changed and no rewrite has run since)"
            }
            NotDurable::FileMissing => "an AOF file the manifest names is missing",
            NotDurable::Io => "an AOF file could not be opened or fsynced",
            NotDurable::FailedBefore => {
                "an fsync of an AOF file the manifest still names failed: nothing written to \
                 it is confirmed until an AOF rewrite (BGREWRITEAOF) replaces it"
            }
            NotDurable::ServerWriteError => {
                "the server reports a failed AOF write or fsync (aof_last_write_status:err)"
            }
            NotDurable::Slow => {
                "an fsync of the AOF took 0.9 s or more, long enough for a failed fsync of the \
                 server's own to go unseen"
            }
        }
    }
}

/// A try that confirmed nothing: counted, noted for the log, and not repeated for a while.
fn refused(why: NotDurable) {
    metrics::FSYNC_ERRORS.incr();
    REFUSAL.store(why as u8, Ordering::Relaxed);
    RETRY_AT.store(metrics::monotonic_us() + RETRY_US, Ordering::Relaxed);
}

/// On the main thread: a line in the server log when the reason FSYNC confirms nothing
/// changes, and when it confirms again (at most one line a second).
fn log_refusal() {
    static LOGGED: AtomicU8 = AtomicU8::new(0);
    static LOGGED_AT: AtomicU64 = AtomicU64::new(0);
    let now = REFUSAL.load(Ordering::Relaxed);
    let before = LOGGED.load(Ordering::Relaxed);
    let at = metrics::monotonic_us();
    if now == before || at < LOGGED_AT.load(Ordering::Relaxed) + 1_000_000 {
        return;
    }
    LOGGED.store(now, Ordering::Relaxed);
    LOGGED_AT.store(at, Ordering::Relaxed);
    match NotDurable::ALL.iter().find(|why| **why as u8 == now) {
        Some(why) => host::log_warning(&format!(
            "lock FSYNC: confirms nothing for now: {}; FSYNC replies wait for their timeout",
            why.describe()
        )),
        None => host::log_notice("lock FSYNC: the AOF is fsynced again; FSYNC confirms"),
    }
}

/// fdatasyncs every incremental file the manifest names, once the server is seen appending to
/// the last of them. A file gone meanwhile was folded into a new base by a rewrite (which
/// fsynced it): the manifest is read again.
fn fsync_files(files: &AofFiles, state: &mut WorkerState) -> Result<(), NotDurable> {
    let manifest = files.dir.join(format!("{}.manifest", files.name));
    for _ in 0..3 {
        let text = std::fs::read(&manifest).map_err(|_| NotDurable::NoManifest)?;
        let listed = aof::parse_manifest(&text).map_err(|_| NotDurable::BadManifest)?;
        let incremental: Vec<&[u8]> = listed
            .iter()
            .filter(|f| f.kind == FileKind::Incremental)
            .map(|f| f.name.as_slice())
            .collect();
        state
            .failed
            .retain(|(_, name)| incremental.contains(&name.as_slice()));
        let last = incremental.last().ok_or(NotDurable::NoIncrementalFile)?;
        let path = |name: &[u8]| files.dir.join(OsStr::from_bytes(name));
        let last_id = match aof::file_id(&path(last)) {
            Ok(id) => id,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return Err(NotDurable::Io),
        };
        match aof::writer_of(last_id, state.writer) {
            Ok(Some(fd)) => state.writer = Some(fd),
            Ok(None) => return Err(NotDurable::NotAppending),
            Err(_) => return Err(NotDurable::Io),
        }
        let mut all = true;
        for name in &incremental {
            let file = match std::fs::File::open(path(name)) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    all = false;
                    break;
                }
                Err(_) => return Err(NotDurable::Io),
            };
            let id = {
                use std::os::unix::fs::MetadataExt;
                let meta = file.metadata().map_err(|_| NotDurable::Io)?;
                (meta.dev(), meta.ino())
            };
            if state.failed.iter().any(|(f, n)| *f == id && n == name) {
                return Err(NotDurable::FailedBefore);
            }
            if file.sync_data().is_err() {
                state.failed.push((id, name.to_vec()));
                return Err(NotDurable::Io);
            }
        }
        if all {
            return Ok(());
        }
    }
    Err(NotDurable::FileMissing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lock-fsync-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn files(dir: &std::path::Path) -> AofFiles {
        AofFiles {
            dir: dir.to_path_buf(),
            name: "my aof".into(),
        }
    }

    #[test]
    fn nothing_is_confirmed_without_a_manifest_that_names_the_file_being_appended_to() {
        let dir = scratch("confirm");
        let mut state = WorkerState::default();
        assert_eq!(
            fsync_files(&files(&dir), &mut state),
            Err(NotDurable::NoManifest)
        );
        let manifest = dir.join("my aof.manifest");
        std::fs::write(&manifest, "file \"my aof.1.base.rdb\" seq 1 type b\n").unwrap();
        assert_eq!(
            fsync_files(&files(&dir), &mut state),
            Err(NotDurable::NoIncrementalFile)
        );
        std::fs::write(&manifest, "file my aof.1.incr.aof seq 1 type i\n").unwrap();
        assert_eq!(
            fsync_files(&files(&dir), &mut state),
            Err(NotDurable::BadManifest)
        );
        std::fs::write(&manifest, "file \"my aof.1.incr.aof\" seq 1 type i\n").unwrap();
        assert_eq!(
            fsync_files(&files(&dir), &mut state),
            Err(NotDurable::FileMissing)
        );
        let incr = dir.join("my aof.1.incr.aof");
        std::fs::write(&incr, "*1\r\n").unwrap();
        // The file exists, but nobody is appending to it: the AOF is being switched on.
        assert_eq!(
            fsync_files(&files(&dir), &mut state),
            Err(NotDurable::NotAppending)
        );
        let writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&incr)
            .unwrap();
        // A stray temporary file named by no manifest changes nothing.
        std::fs::write(dir.join("temp-my aof.incr"), "").unwrap();
        assert_eq!(fsync_files(&files(&dir), &mut state), Ok(()));
        drop(writer);
        assert_eq!(
            fsync_files(&files(&dir), &mut state),
            Err(NotDurable::NotAppending)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_an_fsync_failed_on_confirms_nothing_until_the_manifest_drops_it() {
        let dir = scratch("failed");
        let mut state = WorkerState::default();
        let incr = dir.join("my aof.2.incr.aof");
        std::fs::write(&incr, "").unwrap();
        std::fs::write(
            dir.join("my aof.manifest"),
            "file \"my aof.2.incr.aof\" seq 2 type i\n",
        )
        .unwrap();
        let _writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&incr)
            .unwrap();
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&incr).unwrap();
        state
            .failed
            .push(((meta.dev(), meta.ino()), b"my aof.2.incr.aof".to_vec()));
        assert_eq!(
            fsync_files(&files(&dir), &mut state),
            Err(NotDurable::FailedBefore)
        );
        // A rewrite made it history and began a new incremental file.
        let next = dir.join("my aof.3.incr.aof");
        std::fs::write(&next, "").unwrap();
        let _next_writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&next)
            .unwrap();
        std::fs::write(
            dir.join("my aof.manifest"),
            "file \"my aof.2.incr.aof\" seq 2 type h\nfile \"my aof.3.incr.aof\" seq 3 type i\n",
        )
        .unwrap();
        assert_eq!(fsync_files(&files(&dir), &mut state), Ok(()));
        assert!(state.failed.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
