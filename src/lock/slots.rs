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

/// The hash tag of `key`: the part between the first `{` and the next `}`, when that is not
/// empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    rest.iter()
        .position(|&b| b == b'}')
        .filter(|&close| close > 0)
        .map(|close| &rest[..close])
}

/// The hash slot of `key`: of its hash tag when it has one, else of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// Another name in the hash slot of `key`: `key`'s hash tag (or `key` itself as one) in braces,
/// then `suffix`. `None` for the keys whose braces make that another slot (a `}` without a tag).
pub fn name_in_slot_of(key: &[u8], suffix: &[u8]) -> Option<Vec<u8>> {
    let tag = hash_tag(key).unwrap_or(key);
    let mut name = Vec::with_capacity(tag.len() + suffix.len() + 2);
    name.push(b'{');
    name.extend_from_slice(tag);
    name.push(b'}');
    name.extend_from_slice(suffix);
    (key_slot(&name) == key_slot(key)).then_some(name)
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
