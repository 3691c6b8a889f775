//! Cluster hash slots, and the slots this node is importing by atomic slot migration (Valkey 9's
//! `CLUSTER MIGRATESLOTS`). While a slot is being imported its keys belong to the source node:
//! the locks arriving in it must not expire, be reclaimed or be replicated from here until the
//! import completes (and if it is aborted, the server deletes them).

use std::collections::BTreeMap;

/// How many hash slots a cluster has.
pub const SLOTS: u16 = 16384;

/// CRC16 as Redis Cluster uses it (XMODEM: polynomial 0x1021, initial value 0).
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of `key`: of its hash tag (the part between the first `{` and the next `}`)
/// when that is not empty, else of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// The slot ranges of the imports in progress, by job name.
#[derive(Debug, Default)]
pub struct Imports {
    jobs: BTreeMap<Vec<u8>, Vec<(u16, u16)>>,
}

impl Imports {
    pub const fn new() -> Self {
        Imports {
            jobs: BTreeMap::new(),
        }
    }

    /// An import of the inclusive `ranges` started.
    pub fn started(&mut self, job: &[u8], ranges: Vec<(u16, u16)>) {
        self.jobs.insert(job.to_vec(), ranges);
    }

    /// The import `job` completed or was aborted.
    pub fn ended(&mut self, job: &[u8]) {
        self.jobs.remove(job);
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// True while `slot` is being imported.
    pub fn contains(&self, slot: u16) -> bool {
        self.jobs
            .values()
            .flatten()
            .any(|&(start, end)| start <= slot && slot <= end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_cluster_specification() {
        // The specification's CRC16 check value, and slots any cluster reports.
        assert_eq!(crc16(b"123456789"), 0x31C3);
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
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"no{close"), crc16(b"no{close") % SLOTS);
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
}
