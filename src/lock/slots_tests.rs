//! Unit tests of [`super::slots`], kept apart so the tests' cluster harness can include that file
//! as it is.

use super::slots::*;

#[test]
fn slots_match_the_cluster_specification() {
    // The CRC16 check value (0x31C3), and slots any cluster reports (CLUSTER KEYSLOT).
    assert_eq!(key_slot(b"123456789"), 0x31C3);
    assert_eq!(key_slot(b"foo"), 12182);
    assert_eq!(key_slot(b"bar"), 5061);
    assert_eq!(key_slot(b""), 0);
}

#[test]
fn a_hash_tag_decides_the_slot_unless_it_is_empty() {
    assert_eq!(
        key_slot(b"{user1000}.following"),
        key_slot(b"{user1000}.followers")
    );
    assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
    assert_eq!(key_slot(b"foo{}{bar}"), 8363);
    assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    assert_eq!(key_slot(b"no{close"), 7129);
}

#[test]
fn a_name_in_the_slot_of_a_key_is_in_that_slot_or_there_is_none() {
    let suffix = b"\0waiting";
    assert_eq!(
        name_in_slot_of(b"orders", suffix).as_deref(),
        Some(b"{orders}\0waiting".as_slice())
    );
    assert_eq!(
        name_in_slot_of(b"{user1}.lock", suffix).as_deref(),
        Some(b"{user1}\0waiting".as_slice())
    );
    // A `}` without a tag before it would make the braces another tag.
    assert_eq!(name_in_slot_of(b"a}b", suffix), None);
    assert_eq!(name_in_slot_of(b"a{}b", suffix), None);
    let pieces: [&[u8]; 6] = [b"{", b"}", b"a", b"bc", b"{x}", b""];
    for a in pieces {
        for b in pieces {
            for c in pieces {
                let key = [a, b, c].concat();
                if let Some(name) = name_in_slot_of(&key, suffix) {
                    assert_eq!(key_slot(&name), key_slot(&key), "{key:?}");
                    assert_ne!(name, key);
                }
            }
        }
    }
    assert!(name_in_slot_of(b"no{close", suffix).is_some());
}

#[test]
fn imports_cover_their_ranges_until_they_end() {
    let mut imports = Imports::new();
    assert!(imports.is_empty() && !imports.contains(0));
    imports.started(b"job-a", vec![(10, 20), (100, 100)]);
    imports.started(b"job-b", vec![(16383, 16383)]);
    for slot in [10, 15, 20, 100, 16383] {
        assert!(imports.contains(slot), "{slot}");
    }
    for slot in [9, 21, 99, 101, 16382] {
        assert!(!imports.contains(slot), "{slot}");
    }
    imports.ended(b"job-a");
    assert!(!imports.contains(15) && imports.contains(16383));
    imports.ended(b"unknown");
    imports.ended(b"job-b");
    assert!(imports.is_empty() && !imports.contains(16383));
}
