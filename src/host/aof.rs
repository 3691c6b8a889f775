//! The server's append-only files as the server itself names them: its manifest, read with the
//! server's own rules (its quoting of file names included), and the file it is appending to now,
//! found among the process' own open descriptors. Nothing here calls the module API: the worker
//! thread that fsyncs the AOF for `FSYNC` uses it.

use std::io;
use std::path::Path;

/// One file the manifest lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedFile {
    pub name: Vec<u8>,
    pub seq: i64,
    pub kind: FileKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// `type b`: the snapshot of the last rewrite.
    Base,
    /// `type h`: replaced by a rewrite, to be deleted.
    History,
    /// `type i`: writes since the base; the last one is the one being appended to.
    Incremental,
}

/// Why a manifest was not understood; the server would refuse to load it too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestError {
    Empty,
    /// A line longer than the server reads (1024 bytes) or without its newline.
    LongLine,
    /// A line the server's argument splitter refuses, or without name, seq and type.
    Format,
    /// A file name with a path in it (a `/` or a `\\`, as the server checks).
    Path,
    DuplicateBase,
    /// Incremental files out of order.
    Sequence,
}

/// The longest manifest line the server reads.
const MAX_LINE: usize = 1024;

/// The files a manifest lists, in its order, read as the server reads it: `#` lines skipped,
/// every other line `file <name> seq <n> type <b|h|i>` (more pairs allowed, in any order), split
/// into words by the server's own rules (`sdssplitargs`: double quotes with `\n`, `\r`, `\t`,
/// `\b`, `\a`, `\xHH` and `\<c>` escapes, single quotes with `\'`), the last line included only
/// when it ends with a newline.
pub fn parse_manifest(text: &[u8]) -> Result<Vec<ListedFile>, ManifestError> {
    if text.is_empty() {
        return Err(ManifestError::Empty);
    }
    let mut files = Vec::new();
    let mut rest = text;
    let mut last_incremental = 0;
    while !rest.is_empty() {
        let (line, after) = match rest.iter().position(|&b| b == b'\n') {
            Some(end) if end < MAX_LINE => (&rest[..end], &rest[end + 1..]),
            // The server reads at most 1024 bytes per line; a comment longer than that goes on
            // as the next line, anything else is refused.
            _ if rest.first() == Some(&b'#') && rest.len() > MAX_LINE => {
                (&rest[..MAX_LINE], &rest[MAX_LINE..])
            }
            _ if rest.first() == Some(&b'#') => (rest, &rest[rest.len()..]),
            _ => return Err(ManifestError::LongLine),
        };
        rest = after;
        if line.first() == Some(&b'#') {
            continue;
        }
        let words = split_args(trim(line)).ok_or(ManifestError::Format)?;
        if words.len() < 6 || words.len() % 2 != 0 {
            return Err(ManifestError::Format);
        }
        let (mut name, mut seq, mut kind) = (None, 0, None);
        for pair in words.chunks_exact(2) {
            let (key, value) = (&pair[0], &pair[1]);
            if key.eq_ignore_ascii_case(b"file") {
                if value.iter().any(|&b| b == b'/' || b == b'\\') {
                    return Err(ManifestError::Path);
                }
                name = Some(value.clone());
            } else if key.eq_ignore_ascii_case(b"seq") {
                seq = leading_integer(value);
            } else if key.eq_ignore_ascii_case(b"type") {
                kind = value.first().copied();
            }
        }
        let kind = match kind {
            Some(b'b') => FileKind::Base,
            Some(b'h') => FileKind::History,
            Some(b'i') => FileKind::Incremental,
            _ => return Err(ManifestError::Format),
        };
        let Some(name) = name.filter(|n| !n.is_empty() && seq != 0) else {
            return Err(ManifestError::Format);
        };
        match kind {
            FileKind::Base if files.iter().any(|f: &ListedFile| f.kind == FileKind::Base) => {
                return Err(ManifestError::DuplicateBase)
            }
            FileKind::Incremental if seq <= last_incremental => {
                return Err(ManifestError::Sequence)
            }
            FileKind::Incremental => last_incremental = seq,
            _ => {}
        }
        files.push(ListedFile { name, seq, kind });
    }
    Ok(files)
}

/// C's `isspace` in the "C" locale.
fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

/// The line without the blanks the server trims (`sdstrim(line, " \t\r\n")`).
fn trim(line: &[u8]) -> &[u8] {
    let blank = |b: &u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let start = line.iter().position(|b| !blank(b)).unwrap_or(line.len());
    let end = line
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |e| e + 1);
    &line[start..end]
}

/// `atoll`: the optional sign and digits at the start, 0 when there are none.
fn leading_integer(text: &[u8]) -> i64 {
    let text = &text[text.iter().take_while(|&&b| is_space(b)).count()..];
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let value = digits
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0i64, |v, d| {
            v.saturating_mul(10).saturating_add(i64::from(d - b'0'))
        });
    if negative {
        -value
    } else {
        value
    }
}

fn hex_value(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// The server's argument splitter (`sdssplitargs`); `None` where it reports an error (an
/// unterminated quote, a closing quote followed by something other than a blank). A NUL byte
/// ends the line, as it ends the server's C string.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let line = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
    let at = |i: usize| line.get(i).copied().unwrap_or(0);
    let mut words = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i >= line.len() {
            return Some(words);
        }
        let mut word = Vec::new();
        let (mut double, mut single) = (false, false);
        loop {
            let c = at(i);
            if double {
                if c == b'\\' && at(i + 1) == b'x' {
                    if let (Some(high), Some(low)) = (hex_value(at(i + 2)), hex_value(at(i + 3))) {
                        word.push(high * 16 + low);
                        i += 4;
                        continue;
                    }
                }
                if c == b'\\' && at(i + 1) != 0 {
                    word.push(match at(i + 1) {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => b'\x08',
                        b'a' => b'\x07',
                        other => other,
                    });
                    i += 2;
                    continue;
                }
                match c {
                    b'"' if at(i + 1) != 0 && !is_space(at(i + 1)) => return None,
                    b'"' => {
                        i += 1;
                        break;
                    }
                    0 => return None,
                    _ => word.push(c),
                }
            } else if single {
                if c == b'\\' && at(i + 1) == b'\'' {
                    word.push(b'\'');
                    i += 2;
                    continue;
                }
                match c {
                    b'\'' if at(i + 1) != 0 && !is_space(at(i + 1)) => return None,
                    b'\'' => {
                        i += 1;
                        break;
                    }
                    0 => return None,
                    _ => word.push(c),
                }
            } else {
                match c {
                    b' ' | b'\n' | b'\r' | b'\t' | 0 => {
                        if c != 0 {
                            i += 1;
                        }
                        break;
                    }
                    b'"' => double = true,
                    b'\'' => single = true,
                    _ => word.push(c),
                }
            }
            i += 1;
        }
        words.push(word);
    }
}

/// A file's identity: its device and inode.
pub type FileId = (u64, u64);

/// The identity of the file at `path` (following links).
pub fn file_id(path: &Path) -> io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

/// The descriptor of this process that is open for writing on the file `id`, if any: the file
/// the server appends to. `hint` (the descriptor found last time) is looked at first. On a
/// system without `/proc/self/fd` the answer is always "none" (FSYNC then confirms nothing).
pub fn writer_of(id: FileId, hint: Option<i32>) -> io::Result<Option<i32>> {
    if let Some(fd) = hint {
        if writes_to(fd, id) {
            return Ok(Some(fd));
        }
    }
    let entries = match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let Some(fd) = entry?
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        if Some(fd) != hint && writes_to(fd, id) {
            return Ok(Some(fd));
        }
    }
    Ok(None)
}

/// True when descriptor `fd` of this process is open for writing on the file `id`.
fn writes_to(fd: i32, id: FileId) -> bool {
    // Sockets and pipes are not files in a directory: their link does not start with '/'.
    let link = match std::fs::read_link(format!("/proc/self/fd/{fd}")) {
        Ok(link) => link,
        Err(_) => return false,
    };
    if !link.is_absolute() || file_id(Path::new(&format!("/proc/self/fd/{fd}"))).ok() != Some(id) {
        return false;
    }
    // `flags:\t0102001` (octal): the access mode is its two lowest bits, 1 or 2 for writing.
    std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|flags| u32::from_str_radix(flags.trim(), 8).ok())
        })
        .is_some_and(|flags| flags & 0o3 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name as the server writes it into the manifest (`sdscatrepr` where `sdsneedsrepr`).
    fn repr(name: &[u8]) -> Vec<u8> {
        let needs = name
            .iter()
            .any(|&b| matches!(b, b'\\' | b'"') || !(0x20..0x7f).contains(&b) || is_space(b));
        if !needs {
            return name.to_vec();
        }
        let mut out = vec![b'"'];
        for &b in name {
            match b {
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'"' => out.extend_from_slice(b"\\\""),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                0x07 => out.extend_from_slice(b"\\a"),
                0x08 => out.extend_from_slice(b"\\b"),
                0x20..=0x7e => out.push(b),
                _ => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            }
        }
        out.push(b'"');
        out
    }

    fn line(name: &[u8], seq: i64, kind: char) -> Vec<u8> {
        let mut out = b"file ".to_vec();
        out.extend(repr(name));
        out.extend(format!(" seq {seq} type {kind}\n").as_bytes());
        out
    }

    #[test]
    fn names_that_need_quoting_are_read_back_exactly() {
        let names: [&[u8]; 8] = [
            b"appendonly.aof.1.incr.aof",
            b"my aof.2.incr.aof",
            b"tab\there.3.incr.aof",
            b"quote\"d.4.incr.aof",
            b"bytes\x01\xff\x7f.6.incr.aof",
            b"new\nline.7.incr.aof",
            b"bell\x07\x08.8.incr.aof",
            b" lead and trail .9.incr.aof",
        ];
        let mut manifest = line(b"my aof.1.base.rdb", 1, 'b');
        manifest.extend(b"# a comment\n");
        for (i, name) in names.iter().enumerate() {
            manifest.extend(line(name, i as i64 + 1, 'i'));
        }
        let files = parse_manifest(&manifest).unwrap();
        assert_eq!(files[0].name, b"my aof.1.base.rdb");
        assert_eq!(files[0].kind, FileKind::Base);
        let incremental: Vec<&[u8]> = files[1..].iter().map(|f| f.name.as_slice()).collect();
        assert_eq!(incremental, names);
        assert!(files[1..].iter().all(|f| f.kind == FileKind::Incremental));
    }

    #[test]
    fn the_splitter_follows_the_server() {
        let split = |s: &[u8]| split_args(s);
        assert_eq!(
            split(b"  a  \"b c\" 'd e' \"\\x41\\z\" 'it\\'s'").unwrap(),
            [&b"a"[..], b"b c", b"d e", b"Az", b"it's"]
        );
        // A quote inside a word starts quoting, as in the server.
        assert_eq!(split(b"ab\"c d\"").unwrap(), [&b"abc d"[..]]);
        assert_eq!(split(b"\"unterminated"), None);
        assert_eq!(split(b"'unterminated"), None);
        assert_eq!(split(b"\"closed\"x"), None);
        assert_eq!(split(b"'closed'x"), None);
        assert_eq!(split(b"").unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(split(b"a\0b c").unwrap(), [&b"a"[..]]);
        assert_eq!(split(b"\"\\x4\"").unwrap(), [&b"x4"[..]]);
    }

    #[test]
    fn what_the_server_would_refuse_is_refused() {
        use ManifestError::*;
        let cases: [(&[u8], ManifestError); 10] = [
            (b"", Empty),
            (b"file a seq 1 type i", LongLine),
            (b"file a seq 1\n", Format),
            (b"file a seq 1 type i extra\n", Format),
            (b"file a seq 0 type i\n", Format),
            (b"file a seq 1 type x\n", Format),
            (b"file dir/a seq 1 type i\n", Path),
            (b"file \"back\\\\slash\" seq 1 type i\n", Path),
            (b"file a seq 1 type b\nfile b seq 2 type b\n", DuplicateBase),
            (b"file a seq 2 type i\nfile b seq 2 type i\n", Sequence),
        ];
        for (text, error) in cases {
            assert_eq!(
                parse_manifest(text),
                Err(error),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
        let long = format!("file {} seq 1 type i\n", "a".repeat(MAX_LINE));
        assert_eq!(parse_manifest(long.as_bytes()), Err(LongLine));
        assert_eq!(parse_manifest(b"\n"), Err(Format));
        // Keys in any case and order, unknown pairs ignored, trailing blanks trimmed.
        let files = parse_manifest(b"TYPE i SEQ 3 FILE x.aof extra 1 \r\n# done").unwrap();
        assert_eq!(
            files,
            [ListedFile {
                name: b"x.aof".to_vec(),
                seq: 3,
                kind: FileKind::Incremental
            }]
        );
    }

    #[test]
    fn the_writer_of_a_file_is_found_among_open_descriptors() {
        use std::os::fd::AsRawFd;
        let dir = tempfile_dir();
        let path = dir.join("target");
        std::fs::write(&path, b"x").unwrap();
        let id = file_id(&path).unwrap();
        let reader = std::fs::File::open(&path).unwrap();
        // A descriptor open only for reading is not a writer.
        assert_eq!(writer_of(id, Some(reader.as_raw_fd())).unwrap(), None);
        let writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        assert_eq!(writer_of(id, None).unwrap(), Some(writer.as_raw_fd()));
        assert_eq!(
            writer_of(id, Some(writer.as_raw_fd())).unwrap(),
            Some(writer.as_raw_fd())
        );
        // Renamed, it is the same file.
        std::fs::rename(&path, dir.join("moved")).unwrap();
        assert_eq!(writer_of(id, None).unwrap(), Some(writer.as_raw_fd()));
        drop(writer);
        assert_eq!(writer_of(id, None).unwrap(), None);
        drop(reader);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "lock-aof-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
