//! A hold's record: who holds a lock and until when ([`Holder`]), and what its grant keeps beside
//! the lease ([`Grant`]): its token's digest, its lock-delay, and for operators when and to which
//! connection it was granted, as one `addr name label` text, with the helpers that record a
//! connection's `addr name` and split such a text into its parts.

use std::borrow::Cow;

use crate::lock::core::Request;
use crate::lock::text::Text;
use crate::lock::token::TokenDigest;

/// Who holds a lock, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Absolute lease deadline, ms since the Unix epoch.
    pub deadline: u64,
    /// Reentrant hold count, at least 1.
    pub holds: u32,
    /// Released when the acquiring connection closes.
    pub session: bool,
    /// A grant made with SYNC that its replicas have not acknowledged yet: taken back if they do
    /// not in time, unless its token refreshed or renewed it meanwhile (that reply promised it a
    /// lease). In memory only: never stored, replicated or digested.
    pub provisional: bool,
    /// It lasted longer than `lock.long-hold`, and that was announced. In memory only: a
    /// restarted server, or a new primary, announces it once more.
    pub long: bool,
    /// The grant: its token's digest, its lock-delay, and when and to whom it was made (boxed,
    /// with the `addr name label` text in one allocation of its own: the value stays at 80
    /// bytes, a free lock's too).
    pub grant: Box<Grant>,
}

impl Holder {
    /// The digest of the token that holds.
    pub fn token(&self) -> &TokenDigest {
        &self.grant.token
    }
}

/// The longest label a client may give its hold (`LABEL`).
pub const MAX_LABEL_LEN: usize = 128;

/// What a hold keeps beside its lease: its token's digest, the lock-delay it imposes, and for
/// operators, when it was granted and to which connection. Only the token and the delay take
/// part in any rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The lock-delay this grant imposes when it ends without a release (its lease ran out or
    /// its session's connection closed), in ms; 0: none. Always 0 for a shared hold or a permit.
    pub delay: u64,
    /// When the hold was granted, ms since the epoch; 0: unknown (a hold stored by an older
    /// release). A refresh or a renewal keeps it.
    pub since: u64,
    /// The id of the client it was granted to (or last refreshed by); 0: unknown.
    pub client: u64,
    /// The digest of the token that holds (never the token itself).
    token: TokenDigest,
    /// `addr name label`, separated by single spaces (each may be empty; the address and the
    /// label have no space, a name only in the mark of a cut, see [`recorded_connection`]):
    /// that client's address and name, and the public label the hold was given (see
    /// [`Grant::who`]).
    pub(super) text: Text,
}

/// The parts of a [`Grant::who`] text: address, name, label (each empty when missing): the
/// address up to the first space, the label after the last.
pub fn split_who(who: &[u8]) -> [&[u8]; 3] {
    let [addr, rest] = split_connection(who);
    match rest.iter().rposition(|b| *b == b' ') {
        Some(at) => {
            let (name, label) = rest.split_at(at);
            [addr, name, label.get(1..).unwrap_or_default()]
        }
        None => [addr, rest, b""],
    }
}

/// The parts of a connection's `addr name` (see [`recorded_connection`]): its address, up to
/// the first space, and its name.
pub fn split_connection(connection: &[u8]) -> [&[u8]; 2] {
    match connection.iter().position(|b| *b == b' ') {
        Some(at) => {
            let (addr, name) = connection.split_at(at);
            [addr, name.get(1..).unwrap_or_default()]
        }
        None => [connection, b""],
    }
}

/// What a grant or a queued waiter records of a connection's `addr name`: the name cut to
/// `lock::KEPT_BYTES` (see `lock::kept`). A client chooses its name and Redis sets no limit,
/// while a hold's copy travels with every change of it (the AOF, replicas, RDB).
pub fn recorded_connection(mut connection: Vec<u8>) -> Vec<u8> {
    record_connection(&mut connection);
    connection
}

/// [`recorded_connection`] in place.
pub fn record_connection(connection: &mut Vec<u8>) {
    let [addr, name] = split_connection(connection);
    if let Cow::Owned(cut) = super::kept(name) {
        *connection = [addr, b" ", &cut].concat();
    }
}

/// The pieces of `who` for a connection's `addr name` (empty when not known) and a label; none
/// when both are empty. An unknown connection is an empty address and name: both separators
/// stay, so the label is never read as a name.
fn who_pieces<'a>(connection: &'a [u8], label: &'a [u8]) -> [&'a [u8]; 3] {
    if connection.is_empty() && label.is_empty() {
        return [b"", b"", b""];
    }
    let connection: &[u8] = if connection.is_empty() {
        b" "
    } else {
        connection
    };
    [connection, b" ", label]
}

impl Grant {
    /// The grant of `token`, with `who` as its `addr name label` (empty: unknown).
    pub fn new(token: TokenDigest, delay: u64, since: u64, client: u64, who: &[u8]) -> Grant {
        Grant::of_pieces(token, delay, since, client, &[who])
    }

    /// The grant `request` gets now (its token, connection and label), with lock-delay `delay`.
    pub(super) fn granted(request: &Request, delay: u64, now: u64) -> Grant {
        let who = who_pieces(request.connection, request.label);
        Grant::of_pieces(request.token, delay, now, request.client, &who)
    }

    /// The grant of `token` whose `addr name label` is the pieces of `who` put together.
    fn of_pieces(token: TokenDigest, delay: u64, since: u64, client: u64, who: &[&[u8]]) -> Grant {
        Grant {
            delay,
            since,
            client,
            token,
            text: Text::of_pieces(who),
        }
    }

    /// The grant of `token` with nothing else known (no delay, no origin).
    pub fn of_token(token: TokenDigest) -> Grant {
        Grant::new(token, 0, 0, 0, b"")
    }

    /// The digest of the token that holds.
    pub fn token(&self) -> &TokenDigest {
        &self.token
    }

    /// `addr name label` (empty: unknown).
    pub fn who(&self) -> &[u8] {
        self.text.as_bytes()
    }

    /// Its `addr name label` is now a connection's `addr name` and a label.
    fn set_who(&mut self, connection: &[u8], label: &[u8]) {
        self.text = Text::of_pieces(&who_pieces(connection, label));
    }

    fn parts(&self) -> [&[u8]; 3] {
        split_who(self.who())
    }

    pub fn addr(&self) -> &[u8] {
        self.parts()[0]
    }

    pub fn name(&self) -> &[u8] {
        self.parts()[1]
    }

    pub fn label(&self) -> &[u8] {
        self.parts()[2]
    }

    /// True when anything about the grant's origin is known (it is stored and replicated).
    pub fn is_known(&self) -> bool {
        self.since != 0 || self.client != 0 || !self.who().is_empty()
    }

    /// This grant taken by `request` (a refresh from perhaps another connection): the
    /// connection is the request's, the label too unless it gives none. A refresh whose
    /// connection is not known (a script's) keeps the connection recorded and changes only the
    /// label, if it gives one.
    pub(super) fn refreshed_by(&mut self, request: &Request) {
        let label = if request.label.is_empty() {
            self.label().to_vec()
        } else {
            request.label.to_vec()
        };
        if request.client == 0 || request.connection.is_empty() {
            if !request.label.is_empty() {
                let [addr, name, _] = self.parts();
                let connection = [addr, b" ", name].concat();
                self.set_who(&connection, &label);
            }
            return;
        }
        self.client = request.client;
        self.set_who(request.connection, &label);
    }
}

/// Whether `label` may be a hold's label: printable ASCII without spaces, within
/// [`MAX_LABEL_LEN`] bytes (so it can never be mistaken for a token, which is any binary).
pub fn valid_label(label: &[u8]) -> bool {
    label.len() <= MAX_LABEL_LEN && label.iter().all(|b| (b'!'..=b'~').contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::core::tests::{dg, granted, request, T0};
    use crate::lock::core::Lock;

    #[test]
    fn a_grant_record_is_one_64_byte_allocation_with_a_short_text() {
        // 64 bytes is one of the allocator's size classes: the record with its text inline
        // takes no more than the record alone took when its text had an allocation of its own.
        assert_eq!(std::mem::size_of::<Grant>(), 64);
        let grant = Grant::new(dg(b"a"), 0, T0, 7, b"127.0.0.1:51234  ord");
        assert_eq!(grant.text.heap_len(), 0);
        assert_eq!(grant.label(), b"ord");
        let named = Grant::new(dg(b"a"), 0, T0, 7, b"127.0.0.1:51234 worker-7 orders");
        assert_eq!(named.text.heap_len(), 31);
        assert_eq!(named.name(), b"worker-7");
    }

    #[test]
    fn a_long_client_name_is_recorded_cut_and_read_back_beside_its_address_and_label() {
        let name = vec![b'n'; 1000];
        let addr = b"10.0.0.1:5000";
        let connection = [&addr[..], b" ", &name].concat();
        let cut = [&name[..128], b"... (872 more bytes)"].concat();
        let recorded = recorded_connection(connection);
        assert_eq!(recorded, [&addr[..], b" ", &cut].concat());
        assert_eq!(split_connection(&recorded), [&addr[..], &cut[..]]);
        // A name within the limit, or none, or no connection: as it was.
        for same in [&b"10.0.0.1:5000 worker-1"[..], b"10.0.0.1:5000 ", b""] {
            assert_eq!(recorded_connection(same.to_vec()), same);
        }
        assert_eq!(recorded_connection(recorded.clone()), recorded);
        for label in [&b"batch-9"[..], b""] {
            let mut lock = Lock::default();
            let first = Request {
                client: 7,
                connection: &recorded,
                label,
                ..request(b"t", 1000, false, 0)
            };
            granted(lock.grant(&first, 0, T0));
            let grant = &lock.holder.as_ref().expect("held").grant;
            assert_eq!(
                [grant.addr(), grant.name(), grant.label()],
                [&addr[..], &cut, label]
            );
            // Refreshed from a script (no connection), with a new label: the connection stays.
            let script = Request {
                label: b"again",
                ..request(b"t", 1000, false, 0)
            };
            assert!(lock.grant(&script, 0, T0 + 1).is_ok());
            let grant = &lock.holder.as_ref().expect("held").grant;
            assert_eq!(
                [grant.addr(), grant.name(), grant.label()],
                [&addr[..], &cut, b"again"]
            );
        }
        // Texts without a cut name part as they always did.
        assert_eq!(split_who(b"a:1 w l"), [&b"a:1"[..], b"w", b"l"]);
        assert_eq!(split_who(b"a:1 w "), [&b"a:1"[..], b"w", b""]);
        assert_eq!(split_who(b"  l"), [&b""[..], b"", b"l"]);
        assert_eq!(split_who(b"a:1 w"), [&b"a:1"[..], b"w", b""]);
        assert_eq!(split_who(b""), [&b""[..], b"", b""]);
    }
}
