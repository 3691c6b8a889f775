//! A small RESP2/RESP3 client for the tests: binary-safe arguments, exact replies (error text
//! included), and every read bounded by a timeout so no test can hang.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A reply exactly as the server sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Push(Vec<Reply>),
    Bool(bool),
    Double(String),
    Verbatim(String),
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

    /// Text of a bulk, status or verbatim reply.
    pub fn text(&self) -> String {
        match self {
            Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Reply::Status(s) | Reply::Verbatim(s) | Reply::Double(s) => s.clone(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }

    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(v) | Reply::Set(v) | Reply::Push(v) => v,
            other => panic!("expected an array reply, got {other:?}"),
        }
    }

    /// True when any string inside this reply contains `needle`.
    pub fn contains_bytes(&self, needle: &[u8]) -> bool {
        let has = |hay: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
        match self {
            Reply::Bulk(b) => has(b),
            Reply::Status(s) | Reply::Error(s) | Reply::Verbatim(s) | Reply::Double(s) => {
                has(s.as_bytes())
            }
            Reply::Array(v) | Reply::Set(v) | Reply::Push(v) => {
                v.iter().any(|r| r.contains_bytes(needle))
            }
            Reply::Map(m) => m
                .iter()
                .any(|(k, v)| k.contains_bytes(needle) || v.contains_bytes(needle)),
            Reply::Int(_) | Reply::Nil | Reply::Bool(_) => false,
        }
    }
}

pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    pub fn connect(port: u16, timeout: Duration) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
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
    pub fn try_send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<()> {
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

    /// Reads one reply; panics on timeout (no test waits forever).
    pub fn read(&mut self) -> Reply {
        self.try_read().expect("read reply")
    }

    pub fn try_read(&mut self) -> std::io::Result<Reply> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at(1);
        let number = || rest.parse::<i64>().expect("length");
        Ok(match kind {
            "+" => Reply::Status(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(number()),
            "_" => Reply::Nil,
            "#" => Reply::Bool(rest == "t"),
            "," => Reply::Double(rest.to_string()),
            "$" | "=" => {
                let len = number();
                if len < 0 {
                    Reply::Nil
                } else {
                    let mut buf = vec![0; len as usize + 2];
                    self.reader.read_exact(&mut buf)?;
                    buf.truncate(len as usize);
                    if kind == "=" {
                        Reply::Verbatim(String::from_utf8_lossy(&buf[4..]).into_owned())
                    } else {
                        Reply::Bulk(buf)
                    }
                }
            }
            "*" | "~" | ">" => {
                let len = number();
                if len < 0 {
                    Reply::Nil
                } else {
                    let items = (0..len)
                        .map(|_| self.try_read())
                        .collect::<Result<Vec<_>, _>>()?;
                    match kind {
                        "*" => Reply::Array(items),
                        "~" => Reply::Set(items),
                        _ => Reply::Push(items),
                    }
                }
            }
            "%" => {
                let len = number();
                let mut pairs = Vec::new();
                for _ in 0..len {
                    let k = self.try_read()?;
                    let v = self.try_read()?;
                    pairs.push((k, v));
                }
                Reply::Map(pairs)
            }
            other => panic!("unexpected RESP type {other:?} in line {line:?}"),
        })
    }
}
