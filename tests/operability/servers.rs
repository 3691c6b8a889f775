//! What each server gives the module. The module decides every optional feature by whether the
//! server's module API has the function (never by version: Valkey says `redis_version:7.2.4`);
//! these tests hold the expected outcome per server, from the server's own name and version.
//!
//! | server        | command ACL categories | `@lock` category | ACL CAT lock lists | COMMANDLOG | atomic slot migration |
//! |---------------|------------------------|------------------|--------------------|------------|-----------------------|
//! | Redis 7.0     | no                     | no               | (no category)      | no         | no                    |
//! | Redis 7.2     | yes                    | no               | (no category)      | no         | no                    |
//! | Redis 7.4, 8  | yes                    | yes              | the commands       | no         | no (8.2 tested)       |
//! | Valkey 8.0    | yes                    | yes              | nothing            | no         | no                    |
//! | Valkey 9      | yes                    | yes              | the commands       | yes        | yes                   |
//!
//! Redis 7.0.15, 8.2.3 and Valkey 8.0.1, 9.1.2 are tested (`make test-matrix`).

use crate::common::*;
use crate::texts;

fn yes_no(present: bool) -> &'static str {
    if present {
        "yes"
    } else {
        "no"
    }
}

/// At load the module logs the server it runs on and the optional API it found there.
#[test]
fn the_module_logs_the_server_and_the_optional_api_it_found() {
    let server = Server::start();
    let identity = server.identity();
    let product = match identity.product {
        Product::Redis => "redis",
        Product::Valkey => "valkey",
    };
    let (major, minor, patch) = identity.version;
    let expected = format!(
        "lock module {} (MODULE LIST ver 200): on {product} {major}.{minor}.{patch}; command ACL \
         categories: {}, @lock \
         category: {}, replica traffic check: yes, atomic slot migration: {}",
        env!("CARGO_PKG_VERSION"),
        yes_no(identity.command_acl_categories()),
        yes_no(identity.module_acl_category()),
        yes_no(identity.atomic_slot_migration()),
    );
    let log = server.log();
    assert!(
        log.contains(&expected),
        "{expected:?} not in the log:\n{log}"
    );
}

/// ACL CAT lists `lock` exactly where the module could add it, and the commands' categories in
/// COMMAND INFO follow (the other tests in acl.rs and command_docs.rs check the details).
#[test]
fn acl_categories_follow_the_servers_module_api() {
    let server = Server::start();
    let identity = server.identity();
    let mut c = server.conn();
    let categories = texts(&c.call(&["ACL", "CAT"]));
    assert_eq!(
        categories.iter().any(|c| c == "lock"),
        identity.module_acl_category(),
        "{identity:?}: {categories:?}"
    );
    let info = c.call(&["COMMAND", "INFO", "lock.forcerelease"]);
    let listed = texts(&info.items()[0].items()[6]);
    assert_eq!(
        listed.iter().any(|c| c == "@dangerous"),
        identity.command_acl_categories(),
        "{identity:?}: {listed:?}"
    );
}
