//! ACL with real users: key patterns, read-only keys, `-@dangerous` and the `lock` category.

use crate::common::*;
use crate::{assert_counts, command_table, error_text, texts, COMMANDS};

use std::collections::BTreeSet;

fn set_user(server: &Server, name: &str, rules: &[&str]) {
    let mut call = vec!["ACL", "SETUSER", name, "reset", "on", ">pw"];
    call.extend_from_slice(rules);
    assert_eq!(
        server.conn().call(&call),
        Reply::status("OK"),
        "{name} {rules:?}"
    );
}

fn login(server: &Server, name: &str) -> Conn {
    let mut conn = server.conn();
    assert_eq!(conn.call(&["AUTH", name, "pw"]), Reply::status("OK"));
    conn
}

fn assert_noperm(reply: Reply, what: &str) {
    assert!(
        error_text(&reply).starts_with("NOPERM "),
        "{what}: {reply:?}"
    );
}

#[test]
fn acl_key_patterns_limit_lock_commands_to_matching_keys() {
    let server = Server::start();
    set_user(&server, "app", &["~app:*", "+@all"]);
    let mut u = login(&server, "app");
    let fence = acquire(&mut u, "app:x", "t", 60_000);
    assert_eq!(lock_field(&mut u, "app:x", "state").text(), "held");
    assert_eq!(
        u.call(&["LOCK.FENCE", "app:x", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(
        u.call(&["LOCK.RENEW", "app:x", "t", "60000"]),
        Reply::Int(1)
    );
    assert_eq!(u.call(&["LOCK.RELEASE", "app:x", "t"]), Reply::Int(1));
    assert_eq!(u.call(&["LOCK.WAIT", "app:x", "100"]), Reply::Int(1));

    let denied: [&[&str]; 7] = [
        &["LOCK.ACQUIRE", "other:x", "t", "60000"],
        &["LOCK.RELEASE", "other:x", "t"],
        &["LOCK.RENEW", "other:x", "t", "60000"],
        &["LOCK.FENCE", "other:x", "1"],
        &["LOCK.WAIT", "other:x", "100"],
        &["LOCK.INFO", "other:x"],
        &["LOCK.FORCERELEASE", "other:x"],
    ];
    for call in denied {
        assert_noperm(u.call(call), call[0]);
    }
    assert_eq!(server.conn().call(&["EXISTS", "other:x"]), Reply::Int(0));
    assert_counts(
        &server,
        &[
            ("lock_acquired", 1),
            ("lock_renewed", 1),
            ("lock_released", 1),
            ("lock_fence_checks", 1),
            ("lock_keys", 1),
        ],
    );
}

#[test]
fn acl_read_only_key_permission_allows_info_and_fence_only() {
    let server = Server::start();
    let mut admin = server.conn();
    let fence = acquire(&mut admin, "app:x", "t", 60_000);
    set_user(&server, "reader", &["%R~app:*", "+@all"]);
    let mut u = login(&server, "reader");
    assert_eq!(lock_field(&mut u, "app:x", "state").text(), "held");
    assert_eq!(
        u.call(&["LOCK.FENCE", "app:x", &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(u.call(&["LOCK.WAIT", "app:none", "100"]), Reply::Int(1));
    let denied: [&[&str]; 4] = [
        &["LOCK.ACQUIRE", "app:x", "t", "60000"],
        &["LOCK.RELEASE", "app:x", "t"],
        &["LOCK.RENEW", "app:x", "t", "60000"],
        &["LOCK.FORCERELEASE", "app:x"],
    ];
    for call in denied {
        assert_noperm(u.call(call), call[0]);
    }
    assert_noperm(u.call(&["LOCK.INFO", "other:x"]), "LOCK.INFO other:x");
    assert_eq!(lock_field(&mut admin, "app:x", "holds"), Reply::Int(1));
    assert_eq!(fence_of(&mut admin, "app:x"), fence);
}

/// The LOCK.* commands other than FORCERELEASE all work for `u` on key `k`.
fn assert_everyday_commands_allowed(u: &mut Conn, k: &str) {
    let fence = acquire(u, k, "t", 60_000);
    assert_eq!(u.call(&["LOCK.RENEW", k, "t", "60000"]), Reply::Int(1));
    assert_eq!(
        u.call(&["LOCK.FENCE", k, &fence.to_string()]),
        Reply::Int(1)
    );
    assert_eq!(lock_field(u, k, "state").text(), "held");
    assert_eq!(u.call(&["LOCK.RELEASE", k, "t"]), Reply::Int(1));
    assert_eq!(u.call(&["LOCK.WAIT", k, "100"]), Reply::Int(1));
}

#[test]
fn acl_minus_dangerous_denies_forcerelease_where_commands_have_categories() {
    let server = Server::start();
    let identity = server.identity();
    let mut admin = server.conn();
    acquire(&mut admin, "held", "owner", 60_000);
    set_user(&server, "app", &["~*", "&*", "+@all", "-@dangerous"]);
    let mut u = login(&server, "app");
    assert_everyday_commands_allowed(&mut u, "mine");
    let reply = u.call(&["LOCK.FORCERELEASE", "held"]);
    if identity.command_acl_categories() {
        assert_eq!(
            reply,
            Reply::error(
                "NOPERM User app has no permissions to run the 'lock.forcerelease' command"
            )
        );
        assert_eq!(state_of(&mut admin, "held"), "held");
    } else {
        // Redis 7.0 cannot put module commands in categories: the README names the command
        // instead (see the next test).
        assert_eq!(reply, Reply::Int(1), "on {identity:?}");
    }
}

/// The rules of a user the README sets up, word for word: what follows the password in its
/// `ACL SETUSER <user> on >secret ...` line.
fn readme_rules(user: &str) -> Vec<&'static str> {
    let readme = include_str!("../../README.md");
    let start = format!("ACL SETUSER {user} on >");
    let line = readme
        .lines()
        .find(|line| line.starts_with(&start))
        .unwrap_or_else(|| panic!("no `{start}` line in README.md"));
    line.split_whitespace().skip(5).collect()
}

/// A server whose long-hold log has one entry (a hold longer than 500 ms, still held).
fn server_with_a_long_hold() -> Server {
    let server = Server::start_with(Config::default().module_arg("long-hold").module_arg("500"));
    acquire(&mut server.conn(), "slow", "owner", 60_000);
    wait_for("the long hold to be logged", || {
        (server.conn().call(&["LOCK.LONGHOLDS", "LEN"]) == Reply::Int(1)).then_some(())
    });
    server
}

/// Every LOCK.LONGHOLDS subcommand is refused to `user` on `u` (the command as a whole is
/// denied). Redis 7.0 words the error without the user's name.
fn assert_longholds_denied(server: &Server, u: &mut Conn, user: &str) {
    let who = if server.identity().command_acl_categories() {
        format!("User {user}")
    } else {
        "this user".to_string()
    };
    for call in [
        &["LOCK.LONGHOLDS", "GET"][..],
        &["LOCK.LONGHOLDS", "GET", "-1"],
        &["LOCK.LONGHOLDS", "LEN"],
        &["LOCK.LONGHOLDS", "RESET"],
    ] {
        assert_eq!(
            u.call(call),
            Reply::Error(format!(
                "NOPERM {who} has no permissions to run the 'lock.longholds' command"
            )),
            "{call:?}"
        );
    }
}

/// The README's application rules (the ACL section's and LOCK.FORCERELEASE's) deny both
/// operator's commands on every server, and its operator rule allows them.
#[test]
fn acl_documented_application_rules_deny_forcerelease_and_longholds_on_every_version() {
    let server = server_with_a_long_hold();
    let mut admin = server.conn();
    for (user, prefix) in [("orders-app", "orders:"), ("app", "")] {
        set_user(&server, user, &readme_rules(user));
        let mut u = login(&server, user);
        assert_everyday_commands_allowed(&mut u, &format!("{prefix}mine"));
        acquire(&mut admin, &format!("{prefix}held"), "owner", 60_000);
        assert_noperm(
            u.call(&["LOCK.FORCERELEASE", &format!("{prefix}held")]),
            "LOCK.FORCERELEASE",
        );
        assert_eq!(state_of(&mut admin, &format!("{prefix}held")), "held");
        // The log names keys of every application, and operators rely on it: no reading, no
        // RESET.
        assert_longholds_denied(&server, &mut u, user);
        assert_eq!(admin.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(1));
    }

    set_user(&server, "oncall", &readme_rules("oncall"));
    let mut ops = login(&server, "oncall");
    let entries = ops.call(&["LOCK.LONGHOLDS", "GET"]);
    assert_eq!(entries.items().len(), 1, "{entries:?}");
    assert_eq!(fields_map(&entries.items()[0])["key"].text(), "slow");
    assert_eq!(ops.call(&["LOCK.LONGHOLDS", "RESET"]), Reply::status("OK"));
    assert_eq!(ops.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(0));
    assert_eq!(ops.call(&["LOCK.FORCERELEASE", "held"]), Reply::Int(1));
}

/// Where module commands have ACL categories, LOCK.LONGHOLDS is in `@admin` and `@dangerous`, as
/// SLOWLOG is: `-@admin` and `-@dangerous` each deny it. (The `admin` command flag alone puts a
/// module command in no category.) On Redis 7.0 it is in none and only the name denies it.
#[test]
fn acl_minus_admin_or_dangerous_denies_longholds_where_commands_have_categories() {
    let server = server_with_a_long_hold();
    let identity = server.identity();
    let mut admin = server.conn();
    let info = admin.call(&["COMMAND", "INFO", "lock.longholds"]);
    let mut categories = texts(&info.items()[0].items()[6]);
    categories.sort();
    let mut expected: Vec<String> = Vec::new();
    if identity.command_acl_categories() {
        expected.extend(["@admin".to_string(), "@dangerous".to_string()]);
    }
    if identity.module_acl_category() {
        expected.push("@lock".to_string());
    }
    assert_eq!(categories, expected, "on {identity:?}");

    for (user, rule) in [("noadmin", "-@admin"), ("nodanger", "-@dangerous")] {
        set_user(&server, user, &["~*", "&*", "+@all", rule]);
        let mut u = login(&server, user);
        assert_everyday_commands_allowed(&mut u, "mine");
        if identity.command_acl_categories() {
            assert_longholds_denied(&server, &mut u, user);
        } else {
            assert_eq!(u.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(1), "{user}");
        }
    }
    assert_eq!(admin.call(&["LOCK.LONGHOLDS", "LEN"]), Reply::Int(1));
}

#[test]
fn acl_lock_category_lists_and_covers_lock_commands_where_modules_add_categories() {
    let server = Server::start();
    let identity = server.identity();
    let mut admin = server.conn();
    let cat = admin.call(&["ACL", "CAT", "lock"]);
    if !identity.module_acl_category() {
        assert_eq!(cat, Reply::error("ERR Unknown category 'lock'"));
        let reply = admin.call(&["ACL", "SETUSER", "u", "-@lock"]);
        assert!(error_text(&reply).starts_with("ERR "), "{reply:?}");
        return;
    }
    let listed: BTreeSet<String> = texts(&cat).into_iter().collect();
    if identity.acl_cat_lists_module_commands() {
        for name in COMMANDS {
            assert!(listed.contains(name), "{name} missing from {listed:?}");
        }
        assert!(listed.iter().all(|n| n.starts_with("lock.")), "{listed:?}");
    } else {
        assert!(listed.is_empty(), "{identity:?}: {listed:?}");
    }

    acquire(&mut admin, "held", "owner", 60_000);
    set_user(&server, "nolock", &["~*", "&*", "+@all", "-@lock"]);
    let mut u = login(&server, "nolock");
    for (name, _, sample) in command_table() {
        let mut call = vec![name];
        call.extend_from_slice(sample);
        assert_eq!(
            u.call(&call),
            Reply::Error(format!(
                "NOPERM User nolock has no permissions to run the '{name}' command"
            ))
        );
    }
    assert_eq!(u.call(&["SET", "plain", "1"]), Reply::status("OK"));

    set_user(&server, "onlylock", &["~*", "-@all", "+@lock"]);
    let mut u = login(&server, "onlylock");
    assert_everyday_commands_allowed(&mut u, "mine");
    assert_noperm(u.call(&["GET", "plain"]), "GET");
    assert_eq!(state_of(&mut admin, "held"), "held");
}
