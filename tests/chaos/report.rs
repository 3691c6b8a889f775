//! Reports: one line per scenario with its counts and invariant violations.

use crate::clients::{check_guarded_logs, Shared};
use crate::history::{check_i1, check_i2, check_i3, Mode};

use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

#[derive(Debug)]
pub struct Report {
    pub scenario: String,
    pub grants: usize,
    pub unconfirmed: u64,
    pub accepted: usize,
    pub rejected: usize,
    pub i: [u64; 5],
    pub checks: [u64; 5],
    pub faults: u64,
    pub module_panics: usize,
    pub secs: f64,
    pub notes: Vec<String>,
}

impl Report {
    pub fn line(&self) -> String {
        format!(
            "{:<24} grants {:>7}  accepted {:>7}  rejected {:>6}  violations I1 {} I2 {} I3 {} I4 {} I5 {}  ({} faults, {} unconfirmed, {:.0}s)",
            self.scenario,
            self.grants,
            self.accepted,
            self.rejected,
            self.i[0],
            self.i[1],
            self.i[2],
            self.i[3],
            self.i[4],
            self.faults,
            self.unconfirmed,
            self.secs
        )
    }

    /// Prints the report, appends it to `$CHAOS_REPORT`, and fails on violations of the
    /// invariants in `must_hold` (I1..I5 as 1..5) and on any module panic.
    pub fn finish(self, must_hold: &[usize]) {
        let line = self.line();
        println!("chaos: {line}");
        println!(
            "chaos:   checks: I1 {} writes, I2 {} grants, I3 {} grants, I4 {} key checks, I5 {} probes",
            self.checks[0], self.checks[1], self.checks[2], self.checks[3], self.checks[4]
        );
        for note in self.notes.iter().take(12) {
            println!("chaos:   {note}");
        }
        if let Ok(path) = std::env::var("CHAOS_REPORT") {
            if let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
            {
                let _ = writeln!(file, "{line}");
                for note in self.notes.iter().take(6) {
                    let _ = writeln!(file, "    {note}");
                }
            }
        }
        assert_eq!(self.module_panics, 0, "module panics in the server log");
        for &inv in must_hold {
            assert_eq!(
                self.i[inv - 1],
                0,
                "{}: invariant I{inv} violated: {:?}",
                self.scenario,
                self.notes
            );
        }
        assert!(self.grants > 0, "{}: no grants at all", self.scenario);
    }
}

pub fn module_panics(logs: &[String]) -> usize {
    logs.iter()
        .map(|log| log.matches("lock module bug").count())
        .sum()
}

pub fn report(name: &str, sh: &Shared, started: Instant, logs: &[String]) -> Report {
    let grants = sh
        .history
        .grants
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let log = sh.oracle.log();
    let (i2, ex2) = check_i2(&grants);
    let (i3, ex3) = check_i3(&grants);
    let mut notes = sh
        .history
        .notes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    notes.extend(ex2);
    notes.extend(ex3);
    let (guarded_entries, guarded_decreases, guarded_notes) = check_guarded_logs(sh);
    notes.extend(guarded_notes);
    let errors = sh.history.errors.lock().unwrap_or_else(|e| e.into_inner());
    if !errors.is_empty() {
        notes.push(format!("error replies seen by clients: {errors:?}"));
    }
    notes.push(format!(
        "contended (nil) acquires: {}",
        sh.history.contended.load(Relaxed)
    ));
    let shared = grants.iter().filter(|g| g.mode == Mode::Shared).count();
    let permits = grants
        .iter()
        .filter(|g| matches!(g.mode, Mode::Permit(_)))
        .count();
    notes.push(format!(
        "shared grants {shared}, permit grants {permits} (of {})",
        grants.len()
    ));
    Report {
        scenario: name.to_string(),
        grants: grants.len(),
        unconfirmed: sh.history.unconfirmed.load(Relaxed),
        accepted: log.iter().filter(|w| w.accepted).count(),
        rejected: log.iter().filter(|w| !w.accepted).count(),
        i: [
            check_i1(&log) + guarded_decreases,
            i2,
            i3,
            sh.history.i4_violations.load(Relaxed),
            sh.history.i5_violations.load(Relaxed),
        ],
        checks: [
            log.len() as u64 + guarded_entries,
            grants.len() as u64,
            grants.len() as u64,
            sh.history.i4_checks.load(Relaxed),
            sh.history.i5_attempts.load(Relaxed),
        ],
        faults: sh.history.faults.load(Relaxed),
        module_panics: module_panics(logs),
        secs: started.elapsed().as_secs_f64(),
        notes,
    }
}
