//! COMMAND DOCS / INFO / GETKEYS for every lock command.

use crate::common::*;
use crate::{command_table, texts};

use std::collections::BTreeMap;

#[test]
fn command_docs_describe_every_lock_command() {
    let server = Server::start();
    let mut c = server.conn();
    for (name, arg_names, _) in command_table() {
        let reply = c.call(&["COMMAND", "DOCS", name]);
        let items = reply.items();
        assert_eq!(items.len(), 2, "{name}: {reply:?}");
        assert_eq!(items[0].text(), name);
        let doc = fields_map(&items[1]);
        assert!(!doc["summary"].text().is_empty(), "{name}");
        assert_eq!(doc["since"].text(), "0.1.0", "{name}");
        assert_eq!(doc["group"].text(), "module", "{name}");
        assert_eq!(doc["module"].text(), "lock", "{name}");
        assert_eq!(
            doc["complexity"].text(),
            "O(1), or O(N) for a key with N shared or permit holders",
            "{name}"
        );
        let args: Vec<BTreeMap<String, Reply>> =
            doc["arguments"].items().iter().map(fields_map).collect();
        let names: Vec<String> = args.iter().map(|a| a["name"].text()).collect();
        assert_eq!(names, arg_names, "{name}");
        assert_eq!(args[0]["type"].text(), "key", "{name}");
        assert_eq!(args[0]["key_spec_index"], Reply::Int(0), "{name}");
    }
    // The options of LOCK.ACQUIRE are optional and introduced by their token.
    let reply = c.call(&["COMMAND", "DOCS", "lock.acquire"]);
    let doc = fields_map(&reply.items()[1]);
    let wait = fields_map(&doc["arguments"].items()[3]);
    assert_eq!(wait["token"].text(), "WAIT");
    assert_eq!(wait["type"].text(), "integer");
    assert_eq!(texts(&wait["flags"]), ["optional"]);
    // SYNC takes two values: a block of numreplicas and timeout-ms.
    let sync = fields_map(&doc["arguments"].items()[6]);
    assert_eq!(sync["token"].text(), "SYNC");
    assert_eq!(sync["type"].text(), "block");
    assert_eq!(texts(&sync["flags"]), ["optional"]);
    // FSYNC takes one value.
    let fsync = fields_map(&doc["arguments"].items()[7]);
    assert_eq!(fsync["token"].text(), "FSYNC");
    assert_eq!(fsync["type"].text(), "integer");
    assert_eq!(texts(&fsync["flags"]), ["optional"]);
    let parts: Vec<String> = sync["arguments"]
        .items()
        .iter()
        .map(|a| fields_map(a)["name"].text())
        .collect();
    assert_eq!(parts, ["numreplicas", "timeout-ms"]);
    // SHARED or LIMIT n: one of two.
    let mode = fields_map(&doc["arguments"].items()[9]);
    assert_eq!(mode["type"].text(), "oneof");
    assert_eq!(texts(&mode["flags"]), ["optional"]);
    let choices: Vec<(String, String)> = mode["arguments"]
        .items()
        .iter()
        .map(|a| {
            let a = fields_map(a);
            (a["token"].text(), a["type"].text())
        })
        .collect();
    assert_eq!(
        choices,
        [
            ("SHARED".to_string(), "pure-token".to_string()),
            ("LIMIT".to_string(), "integer".to_string())
        ]
    );
}

#[test]
fn command_info_gives_arity_flags_key_specs_and_acl_categories() {
    let server = Server::start();
    let identity = server.identity();
    let mut c = server.conn();
    let arity = |name: &str| match name {
        "lock.acquire" => -4,
        "lock.renew" => -4,
        "lock.release" | "lock.fence" | "lock.wait" => 3,
        _ => 2,
    };
    for (name, _, _) in command_table() {
        let reply = c.call(&["COMMAND", "INFO", name]);
        let info = reply.items()[0].items();
        assert_eq!(info[0].text(), name);
        assert_eq!(info[1], Reply::Int(arity(name)), "{name}");
        let flags = texts(&info[2]);
        let read_only = matches!(name, "lock.fence" | "lock.info" | "lock.wait");
        assert!(flags.contains(&"module".to_string()), "{name}: {flags:?}");
        assert_eq!(
            flags.contains(&"readonly".to_string()),
            read_only,
            "{name}: {flags:?}"
        );
        assert_eq!(
            flags.contains(&"write".to_string()),
            !read_only,
            "{name}: {flags:?}"
        );
        assert_eq!(
            info[3..6],
            [Reply::Int(1), Reply::Int(1), Reply::Int(1)],
            "{name}"
        );

        let mut categories = texts(&info[6]);
        categories.sort();
        let mut expected = Vec::new();
        if name == "lock.forcerelease" && identity.command_acl_categories() {
            expected.push("@dangerous".to_string());
        }
        if identity.module_acl_category() {
            expected.push("@lock".to_string());
        }
        assert_eq!(categories, expected, "{name} on {identity:?}");

        let specs = info[8].items();
        assert_eq!(specs.len(), 1, "{name}: {specs:?}");
        let spec = fields_map(&specs[0]);
        let key_flags = texts(&spec["flags"]);
        let (want, not) = if read_only {
            ("RO", "RW")
        } else {
            ("RW", "RO")
        };
        assert!(
            key_flags.iter().any(|f| f == want) && !key_flags.iter().any(|f| f == not),
            "{name}: {key_flags:?}"
        );
        let begin = fields_map(&spec["begin_search"]);
        assert_eq!(begin["type"].text(), "index", "{name}");
        assert_eq!(fields_map(&begin["spec"])["index"], Reply::Int(1), "{name}");
    }
}

#[test]
fn command_getkeys_returns_the_key_of_every_lock_command() {
    let server = Server::start();
    let mut c = server.conn();
    for (name, _, sample) in command_table() {
        let mut call = vec!["COMMAND", "GETKEYS", name];
        call.extend_from_slice(sample);
        assert_eq!(
            c.call(&call),
            Reply::Array(vec![Reply::bulk(sample[0])]),
            "{name}"
        );
    }
}
