//! Bad input for the fuzzer: LOCK.* commands with random and mutated arguments, and corrupted
//! DUMP payloads of the lock type.

use crate::common::*;
use crate::Rng;

const NAMES: &[&str] = &[
    "LOCK.ACQUIRE",
    "LOCK.RELEASE",
    "LOCK.RENEW",
    "LOCK.FENCE",
    "LOCK.WAIT",
    "LOCK.INFO",
    "LOCK.FORCERELEASE",
    "LOCK.GUARD",
    "LOCK.MACQUIRE",
    "LOCK.MRELEASE",
    "LOCK.APPLY",
    "LOCK.FLOOR",
    "LOCK.WHO",
    "LOCK.LONGHOLDS",
    "LOCK.LIST",
    "LOCK.POLICY",
    "lock.acquire",
    "Lock.Release",
    "lock.renew",
    "LOCK.BOGUS",
    "LOCK.",
];
pub const LOCK_KEYS: &[&str] = &["fz:0", "fz:1", "fz:2", "fz:3"];
/// Keys of other types, created before fuzzing and checked unchanged after.
pub const OTHER_KEYS: &[(&str, &[&str])] = &[
    ("fz:str", &["SET", "fz:str", "a string"]),
    ("fz:list", &["RPUSH", "fz:list", "a", "b"]),
    ("fz:hash", &["HSET", "fz:hash", "f", "v"]),
    ("fz:set", &["SADD", "fz:set", "m"]),
    ("fz:zset", &["ZADD", "fz:zset", "1", "m"]),
    ("fz:stream", &["XADD", "fz:stream", "1-1", "f", "v"]),
    ("keep:1", &["SET", "keep:1", "unrelated data"]),
    (
        "keep:2",
        &["HSET", "keep:2", "field", "value", "other", "1"],
    ),
];
const TOKENS: &[&str] = &["t1", "t2", "t3"];
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "5",
    "20",
    "50",
    "51",
    "-1",
    "-0",
    "00",
    "01",
    "+1",
    " 1",
    "1 ",
    "1.5",
    "1e3",
    "0x1f",
    "",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "35184372088832",
    "35184372088833",
    "86400000",
    "31536000000",
    "99999999999999999999999999",
    "\u{0}1",
];
const WORDS: &[&str] = &[
    "WAIT",
    "wait",
    "Wait",
    "REENTRANT",
    "reentrant",
    "SESSION",
    "session",
    "WAITS",
    "REENTRAN",
    "SESSION\u{0}",
    "SHARED",
    "shared",
    "LIMIT",
    "limit",
    "--",
    "acquire",
    "release",
    "sync",
    "expired",
    "drophold",
    "LABEL",
    "label",
    "COUNT",
    "CLIENT",
    "GET",
    "LEN",
    "RESET",
];

fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next() as u8).collect()
}

fn fuzz_arg(rng: &mut Rng, fences: &[i64]) -> Vec<u8> {
    match rng.below(12) {
        0 | 1 => {
            let all: Vec<&str> = LOCK_KEYS
                .iter()
                .copied()
                .chain(OTHER_KEYS.iter().map(|(k, _)| *k))
                .chain(["fz:none", "", "{fz}:x"])
                .collect();
            rng.pick(&all).as_bytes().to_vec()
        }
        2 | 3 => rng.pick(TOKENS).as_bytes().to_vec(),
        4 => {
            let len = match rng.below(20) {
                0 => 65 + rng.below(300) as usize,
                1 => 70_000,
                _ => rng.below(40) as usize,
            };
            random_bytes(rng, len)
        }
        5 | 6 => rng.pick(NUMBERS).as_bytes().to_vec(),
        7 => rng.pick(WORDS).as_bytes().to_vec(),
        8 => (rng.next() as i64).to_string().into_bytes(),
        9 if !fences.is_empty() => {
            let f = *rng.pick(fences) + rng.range(0, 2) as i64 - 1;
            f.to_string().into_bytes()
        }
        _ => {
            let mut arg = rng.pick(NUMBERS).as_bytes().to_vec();
            let n = rng.below(3) as usize;
            arg.extend(random_bytes(rng, n));
            if !arg.is_empty() && rng.chance(50) {
                let i = rng.below(arg.len() as u64) as usize;
                arg[i] ^= 1 << rng.below(8);
            }
            arg
        }
    }
}

/// A command that makes sense, so the lock state really changes.
fn sane_command(rng: &mut Rng, fences: &[i64]) -> Vec<Vec<u8>> {
    let key = if rng.chance(5) {
        rng.pick(OTHER_KEYS).0.to_string()
    } else {
        rng.pick(LOCK_KEYS).to_string()
    };
    let token = rng.pick(TOKENS).to_string();
    let ms = |rng: &mut Rng| rng.range(1, 60).to_string();
    let words: Vec<String> = match rng.below(10) {
        0 | 1 => {
            let mut w = vec!["LOCK.ACQUIRE".into(), key, token, ms(rng)];
            if rng.chance(40) {
                w.extend(["WAIT".into(), rng.range(1, 5).to_string()]);
            }
            if rng.chance(20) {
                w.push("REENTRANT".into());
            }
            if rng.chance(20) {
                w.push("SESSION".into());
            }
            if rng.chance(20) {
                w.extend(["LABEL".into(), format!("fz-{}", rng.below(3))]);
            }
            // Shared holds and permits on the same keys as exclusive ones: refusals included.
            match rng.below(10) {
                0 | 1 => w.push("SHARED".into()),
                2 => w.extend(["LIMIT".into(), rng.range(1, 3).to_string()]),
                _ => {}
            }
            w
        }
        2 => vec!["LOCK.RELEASE".into(), key, token],
        3 => vec!["LOCK.RENEW".into(), key, token, ms(rng)],
        4 => {
            let fence = fences.last().copied().unwrap_or(1).to_string();
            vec!["LOCK.FENCE".into(), key, fence]
        }
        5 => vec!["LOCK.WAIT".into(), key, rng.range(1, 5).to_string()],
        6 => match rng.below(6) {
            0 => vec!["LOCK.INFO".into(), key],
            1 => vec!["LOCK.WHO".into(), key],
            4 => vec![
                "LOCK.LIST".into(),
                // A cursor from a walk, or any number.
                rng.range(0, 64).to_string(),
                "COUNT".into(),
                rng.range(1, 20).to_string(),
            ],
            5 => {
                let mut w = vec!["LOCK.LIST".into(), "0".into()];
                for _ in 0..rng.below(3) {
                    match rng.below(4) {
                        0 => w.extend(["OLDER".into(), rng.range(0, 2_000).to_string()]),
                        1 => w.push("WAITING".into()),
                        2 => w.extend(["NAMESPACE".into(), "default".into()]),
                        _ => w.extend(["COUNT".into(), rng.range(1, 50).to_string()]),
                    }
                }
                w
            }
            2 => vec![
                "LOCK.WHO".into(),
                key,
                "COUNT".into(),
                rng.range(1, 3).to_string(),
                "CLIENT".into(),
                rng.range(1, 20).to_string(),
            ],
            _ => vec![
                "LOCK.LONGHOLDS".into(),
                "GET".into(),
                rng.range(0, 3).to_string(),
            ],
        },
        7 => {
            // Writes only to fz:g* keys (the fuzzer checks the others stay as they were); the
            // rest are reads and commands LOCK.GUARD refuses.
            let fence = fences.last().copied().unwrap_or(1).to_string();
            let inner: &[&str] = match rng.below(10) {
                0 => &["SET", "fz:g", "v"],
                1 => &["INCR", "fz:gn"],
                2 => &["GET", "keep:1"],
                3 => &["HGETALL", "keep:2"],
                4 => &["BLPOP", "fz:list", "0"],
                5 => &["MULTI"],
                6 => &["EVAL", "return redis.call('del', KEYS[1])", "1", "keep:1"],
                7 => &["LOCK.RELEASE", "fz:0", "t1"],
                8 => &["PING"],
                _ => &["NOSUCHCOMMAND", "fz:g"],
            };
            let mut w = vec!["LOCK.GUARD".into(), key, fence];
            w.extend(inner.iter().map(|a| a.to_string()));
            w
        }
        8 => {
            let other = rng.pick(LOCK_KEYS).to_string();
            let command = if rng.chance(60) {
                "LOCK.MACQUIRE"
            } else {
                "LOCK.MRELEASE"
            };
            let mut w = vec![command.into(), "2".into(), key, other, token];
            if command == "LOCK.MACQUIRE" {
                w.push(ms(rng));
                if rng.chance(20) {
                    w.push("SESSION".into());
                }
                if rng.chance(40) {
                    w.extend(["WAIT".into(), rng.range(1, 5).to_string()]);
                }
            }
            w
        }
        _ => vec!["LOCK.FORCERELEASE".into(), key],
    };
    words.into_iter().map(String::into_bytes).collect()
}

pub fn fuzz_command(rng: &mut Rng, fences: &[i64]) -> Vec<Vec<u8>> {
    match rng.below(10) {
        0..=3 => sane_command(rng, fences),
        4..=7 => {
            let mut cmd = sane_command(rng, fences);
            for _ in 0..rng.range(1, 3) {
                let i = 1 + rng.below(cmd.len() as u64) as usize;
                match rng.below(6) {
                    0 => cmd.insert(i.min(cmd.len()), fuzz_arg(rng, fences)),
                    1 if cmd.len() > 1 => {
                        cmd.remove(i.min(cmd.len() - 1).max(1));
                    }
                    2 => {
                        let j = rng.below(cmd.len() as u64) as usize;
                        let dup = cmd[j].clone();
                        cmd.insert(i.min(cmd.len()), dup);
                    }
                    3 => {
                        let word = rng
                            .pick(&["WAIT", "REENTRANT", "SESSION", "SHARED", "LIMIT", "LABEL"])
                            .as_bytes()
                            .to_vec();
                        cmd.insert(i.min(cmd.len()), word);
                    }
                    _ if i < cmd.len() => cmd[i] = fuzz_arg(rng, fences),
                    _ => cmd.push(fuzz_arg(rng, fences)),
                }
            }
            cmd
        }
        _ => {
            let mut cmd = vec![rng.pick(NAMES).as_bytes().to_vec()];
            for _ in 0..rng.below(9) {
                cmd.push(fuzz_arg(rng, fences));
            }
            cmd
        }
    }
}

/// A corrupted or odd DUMP payload of the lock type (its checksum mostly right, so it reaches the
/// module's loader).
pub fn fuzz_payload(
    rng: &mut Rng,
    format: &LockDumpFormat,
    now_fence: u64,
    extreme: bool,
) -> Vec<u8> {
    let fence = if extreme {
        *rng.pick(&[0, 1, i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX])
    } else {
        rng.range(1, now_fence + (1 << 30))
    };
    let mut fields = if rng.chance(40) {
        tombstone_fields(fence)
    } else {
        let n = rng.below(24) as usize;
        let token = random_bytes(rng, n);
        let soon = now_ms() + rng.below(60);
        let deadline = *rng.pick(&[0, 1, soon, u64::MAX, now_ms() - 1000]);
        let holds = *rng.pick(&[0, 1, 2, u64::from(u32::MAX), u64::from(u32::MAX) + 1]);
        let flags = *rng.pick(&[0, 1, 2, 3, u64::MAX]);
        held_fields(fence, &token, deadline, holds, flags)
    };
    for _ in 0..rng.below(4) {
        if fields.is_empty() {
            break;
        }
        let i = rng.below(fields.len() as u64) as usize;
        match rng.below(7) {
            0 => fields[i] ^= 1 << rng.below(8),
            1 => fields.truncate(i),
            2 => {
                let n = rng.range(1, 8) as usize;
                let extra = random_bytes(rng, n);
                fields.splice(i..i, extra);
            }
            3 => fields[i] = *rng.pick(&[0, 1, 2, 3, 4, 5, 0x80, 0x81, 0xC0, 0xFF]),
            4 => {
                let huge = rdb_len(*rng.pick(&[1 << 20, 1 << 31, u64::from(u32::MAX)]));
                fields.splice(i..i, [vec![5], huge].concat());
            }
            5 => fields.extend(rdb_uint(rng.next())),
            _ => {
                fields.pop();
            }
        }
    }
    let module_id = match rng.below(20) {
        0 => format.module_id & !1023,
        1 => (format.module_id & !1023) | 2,
        2 => (format.module_id & !1023) | 1023,
        3 => rng.next() >> 1,
        _ => format.module_id,
    };
    let mut payload = format.payload_with_id(module_id, &fields);
    if rng.chance(3) {
        let n = payload.len();
        payload[n - 1] ^= 0x55;
    }
    payload
}
