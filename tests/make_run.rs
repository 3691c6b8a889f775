//! `make run` as a user meets it: its live config is a copy in its data directory, so a
//! `CONFIG REWRITE` survives a restart and leaves the checkout alone; a busy port gets the name
//! of one that is free. The module is the debug build (`make -o release` skips the release
//! build: `cargo test` holds the build directory).

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// `make run` in the repository with `args`, its output piped.
fn make_run(args: &[String]) -> Command {
    let mut make = Command::new("make");
    make.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--no-print-directory", "-o", "release", "-o", "deps", "run"])
        .args(args)
        .arg(format!("RELEASE_MODULE={}", module_path().display()))
        .arg(format!("REDIS_SERVER={}", redis_server_binary()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    make
}

/// A server `make run` started, and its port. The child is make: its recipe's shell execs
/// redis-server, whose parent make is, so killing make alone would leave the server running.
struct Running(Child, u16);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut conn) = Conn::connect(self.1, Duration::from_secs(2)) {
            // SHUTDOWN answers by closing the connection.
            let _ = conn.try_send(&["SHUTDOWN", "NOSAVE"]);
            let _ = conn.try_read();
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(port: u16, data: &Path) -> (Running, Conn) {
    let args = [format!("PORT={port}"), format!("DATA={}", data.display())];
    let child = make_run(&args).spawn().expect("run make");
    let running = Running(child, port);
    let conn = wait_for("make run's server", || {
        let mut conn = Conn::connect(port, Duration::from_secs(2)).ok()?;
        (conn.call(&["PING"]) == Reply::status("PONG")).then_some(conn)
    });
    (running, conn)
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn example() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("redis.conf.example"))
        .expect("redis.conf.example")
}

#[test]
fn a_config_rewrite_under_make_run_survives_a_restart_and_leaves_the_example_alone() {
    let before = example();
    let data = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let (mut running, mut conn) = start(port, data.path());
    assert_eq!(
        conn.call(&["CONFIG", "SET", "lock.long-hold", "4321"]),
        Reply::status("OK")
    );
    assert_eq!(conn.call(&["CONFIG", "REWRITE"]), Reply::status("OK"));
    let live = std::fs::read_to_string(data.path().join("redis.conf")).expect("live config");
    assert!(live.contains("lock.long-hold 4321"), "{live}");
    assert_eq!(
        live.lines()
            .filter(|line| line.starts_with("loadmodule"))
            .count(),
        1,
        "{live}"
    );
    assert_eq!(example(), before, "redis.conf.example was modified");
    // SHUTDOWN answers by closing the connection.
    conn.try_send(&["SHUTDOWN", "NOSAVE"])
        .expect("send SHUTDOWN");
    let _ = conn.try_read();
    let status = running.0.wait().expect("wait for the server");
    assert!(status.success(), "make run: {status:?}");

    // Started again from its rewritten config: the module loads once, with the setting.
    let (_running, mut conn) = start(port, data.path());
    assert_eq!(
        conn.call(&["CONFIG", "GET", "lock.long-hold"]),
        Reply::Array(vec![
            Reply::Bulk(b"lock.long-hold".to_vec()),
            Reply::Bulk(b"4321".to_vec())
        ])
    );
    assert!(acquire(&mut conn, "k", "t", 10_000) > 0);
    assert_eq!(example(), before, "redis.conf.example was modified");
}

#[test]
fn a_busy_port_gets_the_name_of_a_free_one() {
    // Two ports in a row taken: the suggestion skips both.
    let (first, second) = loop {
        let first = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = first.local_addr().expect("addr").port();
        if let Ok(second) = TcpListener::bind(("127.0.0.1", port + 1)) {
            break (first, second);
        }
    };
    let port = first.local_addr().expect("addr").port();
    let data = tempfile::tempdir().expect("temp dir");
    let args = [
        format!("PORT={port}"),
        format!("DATA={}", data.path().display()),
    ];
    let out = make_run(&args).output().expect("run make");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let suggested: u16 = text
        .split("make run PORT=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no suggestion in {text:?}"));
    assert!(
        suggested >= port + 2,
        "suggested busy port {suggested}: {text}"
    );
    assert!(
        TcpListener::bind(("127.0.0.1", suggested)).is_ok(),
        "suggested port {suggested} is not free"
    );
    drop((first, second));
}

/// `make cluster PORTS=...` then `make cluster-stop` without them stops every node it started
/// (`.ci/cluster stop` finds them by their pid files when PORTS is not set).
#[test]
fn cluster_stop_without_ports_stops_the_nodes_started_on_other_ports() {
    let data = tempfile::tempdir().expect("temp dir");
    // Three free ports whose cluster bus ports (+10000) are free too.
    let mut ports = Vec::new();
    while ports.len() < 3 {
        let port = free_port();
        if port < 55_000
            && !ports.contains(&port)
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            ports.push(port);
        }
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/cluster");
    let list = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    let started = Command::new(&script)
        .args(["start", &module_path().display().to_string()])
        .env("PORTS", &list)
        .env("DATA", data.path())
        .env("REDIS_SERVER", redis_server_binary())
        .output()
        .expect("run .ci/cluster start");
    let pids: Vec<String> = ports
        .iter()
        .filter_map(|port| {
            std::fs::read_to_string(data.path().join(port.to_string()).join("redis.pid")).ok()
        })
        .map(|pid| pid.trim().to_string())
        .collect();
    let alive = |pid: &String| Path::new(&format!("/proc/{pid}")).exists();
    let stop = || {
        Command::new(&script)
            .arg("stop")
            .env_remove("PORTS")
            .env("DATA", data.path())
            .output()
            .expect("run .ci/cluster stop")
    };
    if !started.status.success() {
        stop();
        panic!("start: {}", String::from_utf8_lossy(&started.stderr));
    }
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(alive));
    let stopped = stop();
    assert!(
        String::from_utf8_lossy(&stopped.stdout).contains("stopped 3 node(s)"),
        "{stopped:?}"
    );
    wait_for("the nodes to exit", || {
        (!pids.iter().any(alive)).then_some(())
    });
}
