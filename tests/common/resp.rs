//! A small RESP2/RESP3 client for the tests: binary-safe arguments, byte-exact replies (error
//! text included), and every read bounded by a timeout so no test can hang. It connects over TCP
//! on loopback or over a Unix domain socket.
//!
//! Lines are read as bytes: an error or status line that is not UTF-8 (an error may quote the
//! arguments it refuses, which can be any bytes) arrives as [`Reply::ErrorBytes`] or
//! [`Reply::StatusBytes`] with its bytes as sent, never as a failed read; every other error and
//! status line is [`Reply::Error`] or [`Reply::Status`] with its exact text. A reply that breaks
//! the protocol is an `InvalidData` error from [`Conn::try_read`], not a panic.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// A reply exactly as the server sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+`: a status line that is UTF-8.
    Status(String),
    /// `+`: a status line that is not UTF-8, as sent.
    StatusBytes(Vec<u8>),
    /// `-` (and RESP3 `!` blob errors): an error that is UTF-8.
    Error(String),
    /// `-` or `!`: an error that is not UTF-8, as sent.
    ErrorBytes(Vec<u8>),
    /// `:`
    Int(i64),
    /// `$`
    Bulk(Vec<u8>),
    /// `$-1`, `*-1` and RESP3 `_`.
    Nil,
    /// `*`
    Array(Vec<Reply>),
    /// `%`
    Map(Vec<(Reply, Reply)>),
    /// `~`
    Set(Vec<Reply>),
    /// `>`
    Push(Vec<Reply>),
    /// `#`
    Bool(bool),
    /// `,`, as the server wrote it (`inf`, `-inf` and `nan` included).
    Double(String),
    /// `(`, as the server wrote it.
    BigNumber(String),
    /// `=`: the three-letter format (`txt`, `mkd`) and the text after it.
    Verbatim { format: String, data: Vec<u8> },
    /// `|`: attributes, and the reply they belong to (which follows them on the wire).
    Attribute(Vec<(Reply, Reply)>, Box<Reply>),
}

impl Reply {
    pub fn bulk(s: &str) -> Reply {
        Reply::Bulk(s.as_bytes().to_vec())
    }
    pub fn status(s: &str) -> Reply {
        Reply::Status(s.to_string())
    }
    pub fn error(s: &str) -> Reply {
        Reply::Error(s.to_string())
    }

    /// The integer, panicking with the reply when it is something else.
    pub fn int(&self) -> i64 {
        match self {
            Reply::Int(v) => *v,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// Text of a bulk, status, verbatim or number reply.
    pub fn text(&self) -> String {
        match self {
            Reply::Bulk(b) | Reply::Verbatim { data: b, .. } => {
                String::from_utf8_lossy(b).into_owned()
            }
            Reply::Status(s) | Reply::Double(s) | Reply::BigNumber(s) => s.clone(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }

    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(v) | Reply::Set(v) | Reply::Push(v) => v,
            other => panic!("expected an array reply, got {other:?}"),
        }
    }

    /// The bytes of an error reply (UTF-8 or not), `None` for any other reply.
    pub fn error_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Error(s) => Some(s.as_bytes()),
            Reply::ErrorBytes(b) => Some(b),
            _ => None,
        }
    }

    pub fn is_int(&self) -> bool {
        matches!(self, Reply::Int(_))
    }

    pub fn is_error(&self) -> bool {
        self.error_bytes().is_some()
    }

    /// True when any string inside this reply (attributes included) contains `needle`.
    pub fn contains_bytes(&self, needle: &[u8]) -> bool {
        let has = |hay: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
        let in_pairs = |pairs: &[(Reply, Reply)]| {
            pairs
                .iter()
                .any(|(k, v)| k.contains_bytes(needle) || v.contains_bytes(needle))
        };
        match self {
            Reply::Bulk(b) | Reply::StatusBytes(b) | Reply::ErrorBytes(b) => has(b),
            Reply::Verbatim { format, data } => has(format.as_bytes()) || has(data),
            Reply::Status(s) | Reply::Error(s) | Reply::Double(s) | Reply::BigNumber(s) => {
                has(s.as_bytes())
            }
            Reply::Array(v) | Reply::Set(v) | Reply::Push(v) => {
                v.iter().any(|r| r.contains_bytes(needle))
            }
            Reply::Map(m) => in_pairs(m),
            Reply::Attribute(attrs, reply) => in_pairs(attrs) || reply.contains_bytes(needle),
            Reply::Int(_) | Reply::Nil | Reply::Bool(_) => false,
        }
    }
}

/// The connection under a [`Conn`]: TCP or a Unix domain socket.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Unix(s) => s.set_read_timeout(timeout),
        }
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(timeout),
            Stream::Unix(s) => s.set_write_timeout(timeout),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// `text` of the bytes when they are UTF-8, else `bytes` of them.
fn text_or_bytes(raw: Vec<u8>, text: fn(String) -> Reply, bytes: fn(Vec<u8>) -> Reply) -> Reply {
    match String::from_utf8(raw) {
        Ok(s) => text(s),
        Err(e) => bytes(e.into_bytes()),
    }
}

pub struct Conn {
    reader: BufReader<Stream>,
    writer: Stream,
}

impl Conn {
    /// Connects to 127.0.0.1:`port`; `timeout` bounds the connect and every read and write.
    pub fn connect(port: u16, timeout: Duration) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
        stream.set_nodelay(true)?;
        Conn::over(Stream::Tcp(stream), timeout)
    }

    /// Connects to the Unix domain socket at `path` (a server's `unixsocket`); `timeout` bounds
    /// every read and write.
    pub fn connect_unix(path: &Path, timeout: Duration) -> io::Result<Conn> {
        Conn::over(Stream::Unix(UnixStream::connect(path)?), timeout)
    }

    fn over(stream: Stream, timeout: Duration) -> io::Result<Conn> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let writer = stream.try_clone()?;
        Ok(Conn {
            reader: BufReader::new(stream),
            writer,
        })
    }

    pub fn set_timeout(&self, timeout: Duration) {
        self.writer
            .set_read_timeout(Some(timeout))
            .expect("set read timeout");
    }

    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) {
        self.try_send(args).expect("write command");
    }

    /// Sends a command; an error when the connection is gone.
    pub fn try_send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<()> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            let arg = arg.as_ref();
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&out)
    }

    /// Sends a command and reads its reply.
    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        self.send(args);
        self.read()
    }

    /// Reads raw bytes up to and including the next `\n` (for streams that are not replies).
    pub fn read_raw_line(&mut self) -> io::Result<Vec<u8>> {
        let mut line = Vec::new();
        if self.reader.read_until(b'\n', &mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        Ok(line)
    }

    /// Reads exactly `len` raw bytes.
    pub fn read_raw(&mut self, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.reader.read_exact(&mut buf)?;
        Ok(buf)
    }

    /// Reads one reply; panics on timeout (no test waits forever).
    pub fn read(&mut self) -> Reply {
        self.try_read().expect("read reply")
    }

    /// Reads one reply: an error when the connection closed, the read timed out, or the server
    /// sent something that is not RESP.
    pub fn try_read(&mut self) -> io::Result<Reply> {
        let mut line = Vec::new();
        if self.reader.read_until(b'\n', &mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        if !line.ends_with(b"\r\n") {
            return Err(invalid(format!(
                "truncated line {:?}",
                String::from_utf8_lossy(&line)
            )));
        }
        line.truncate(line.len() - 2);
        let Some((&kind, rest)) = line.split_first() else {
            return Err(invalid("empty line".into()));
        };
        let text = |what: &str| -> io::Result<String> {
            String::from_utf8(rest.to_vec()).map_err(|_| {
                invalid(format!(
                    "{what} is not UTF-8: {:?}",
                    String::from_utf8_lossy(rest)
                ))
            })
        };
        let number = || -> io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| invalid(format!("bad number {:?}", String::from_utf8_lossy(rest))))
        };
        // The length of a string or aggregate: `None` for the RESP2 null (-1).
        let length = || -> io::Result<Option<usize>> {
            match number()? {
                -1 => Ok(None),
                n => usize::try_from(n)
                    .map(Some)
                    .map_err(|_| invalid(format!("bad length {n}"))),
            }
        };
        Ok(match kind {
            b'+' => text_or_bytes(rest.to_vec(), Reply::Status, Reply::StatusBytes),
            b'-' => text_or_bytes(rest.to_vec(), Reply::Error, Reply::ErrorBytes),
            b':' => Reply::Int(number()?),
            b'_' => Reply::Nil,
            b'#' => match rest {
                b"t" => Reply::Bool(true),
                b"f" => Reply::Bool(false),
                _ => return Err(invalid(format!("bad boolean {:?}", text("boolean")?))),
            },
            b',' => Reply::Double(text("double")?),
            b'(' => Reply::BigNumber(text("big number")?),
            b'$' | b'=' | b'!' => {
                let Some(len) = length()? else {
                    return Ok(Reply::Nil);
                };
                let mut buf = vec![0; len + 2];
                self.reader.read_exact(&mut buf)?;
                if !buf.ends_with(b"\r\n") {
                    return Err(invalid("string not followed by CRLF".into()));
                }
                buf.truncate(len);
                match kind {
                    b'$' => Reply::Bulk(buf),
                    b'!' => text_or_bytes(buf, Reply::Error, Reply::ErrorBytes),
                    _ => {
                        if len < 4 || buf[3] != b':' {
                            return Err(invalid("verbatim string without a format".into()));
                        }
                        let data = buf.split_off(4);
                        buf.truncate(3);
                        let format = String::from_utf8(buf)
                            .map_err(|_| invalid("verbatim format is not UTF-8".into()))?;
                        Reply::Verbatim { format, data }
                    }
                }
            }
            b'*' | b'~' | b'>' => {
                let Some(len) = length()? else {
                    return Ok(Reply::Nil);
                };
                let items = (0..len)
                    .map(|_| self.try_read())
                    .collect::<io::Result<Vec<_>>>()?;
                match kind {
                    b'*' => Reply::Array(items),
                    b'~' => Reply::Set(items),
                    _ => Reply::Push(items),
                }
            }
            b'%' | b'|' => {
                let Some(len) = length()? else {
                    return Err(invalid("null map".into()));
                };
                let mut pairs = Vec::with_capacity(len.min(1024));
                for _ in 0..len {
                    let k = self.try_read()?;
                    let v = self.try_read()?;
                    pairs.push((k, v));
                }
                if kind == b'%' {
                    Reply::Map(pairs)
                } else {
                    Reply::Attribute(pairs, Box::new(self.try_read()?))
                }
            }
            other => {
                return Err(invalid(format!(
                    "unexpected RESP type {:?} in line {:?}",
                    other as char,
                    String::from_utf8_lossy(&line)
                )))
            }
        })
    }
}
