//! What the server tests share beside the repository's harness (`tests/common`, included by
//! each test file): a client for a test server and the server's command counts.

use crate::common::Server;

/// A `redis` crate client for `server`.
pub fn client(server: &Server) -> redis::Client {
    redis::Client::open(format!("redis://127.0.0.1:{}/", server.port)).expect("client")
}

/// `calls` of a command in INFO commandstats (0 before its first call).
pub fn calls(server: &Server, command: &str) -> i64 {
    server
        .info_field("commandstats", &format!("cmdstat_{command}"))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// LOCK.RENEW calls the server ran.
pub fn renews(server: &Server) -> i64 {
    calls(server, "lock.renew")
}
