//! The fenced store: the oracle every client writes to with its fence.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct WriteRecord {
    pub resource: String,
    pub fence: u64,
    pub accepted: bool,
}

#[derive(Default)]
pub struct Oracle {
    state: Mutex<(HashMap<String, u64>, Vec<WriteRecord>)>,
}

impl Oracle {
    /// Accepts the write when `fence` is at least the largest fence accepted for `resource`.
    pub fn write(&self, resource: &str, fence: u64) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (max, log) = &mut *state;
        let highest = max.entry(resource.to_string()).or_insert(0);
        let accepted = fence >= *highest;
        if accepted {
            *highest = fence;
        }
        log.push(WriteRecord {
            resource: resource.to_string(),
            fence,
            accepted,
        });
        accepted
    }

    pub fn highest(&self, resource: &str) -> u64 {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0.get(resource).copied().unwrap_or(0)
    }

    pub fn log(&self) -> Vec<WriteRecord> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.1.clone()
    }
}

/// The oracle on a loopback port, for client processes: `W resource fence\n` answers `OK\n` or
/// `STALE\n`.
pub struct OracleServer {
    pub port: u16,
    pub stop: AtomicBool,
}

impl OracleServer {
    pub fn serve<'s>(
        scope: &'s thread::Scope<'s, '_>,
        oracle: &'s Oracle,
        me: &'s OracleServer,
        listener: TcpListener,
    ) {
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        scope.spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(1800);
            while !me.stop.load(Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        scope.spawn(move || serve_oracle_conn(oracle, stream));
                    }
                    Err(_) => sleep(Duration::from_millis(2)),
                }
            }
        });
    }
}

fn serve_oracle_conn(oracle: &Oracle, stream: TcpStream) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut lines = BufReader::new(stream);
    let mut line = String::new();
    while matches!(lines.read_line(&mut line), Ok(n) if n > 0) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let answer = match parts.as_slice() {
            ["W", resource, fence] => match fence.parse::<u64>() {
                Ok(fence) if oracle.write(resource, fence) => "OK\n",
                Ok(_) => "STALE\n",
                Err(_) => "BAD\n",
            },
            _ => "BAD\n",
        };
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
        line.clear();
    }
}

/// A write to the oracle over TCP (from a client process).
pub fn oracle_write_tcp(port: u16, resource: &str, fence: u64) -> Option<bool> {
    let stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut out = stream.try_clone().ok()?;
    out.write_all(format!("W {resource} {fence}\n").as_bytes())
        .ok()?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).ok()?;
    match answer.trim() {
        "OK" => Some(true),
        "STALE" => Some(false),
        _ => None,
    }
}
