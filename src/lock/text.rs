//! Short byte strings kept inside their owner: a grant's `addr name label` is a few dozen bytes
//! almost always, and a separate allocation for it cost a third of a grant's allocations.

/// How many bytes a [`Text`] keeps inline: with its length and tag it takes 24 bytes, 8 more
/// than the boxed slice it replaces, and a grant record with it is 64 bytes, the allocator's
/// size class the record took before. A connection's `addr ` with no
/// name and no label (an IPv4 address and port with its space is at most 22 bytes) then costs
/// no allocation of its own; a longer text is as it was, one exactly sized allocation.
const INLINE: usize = 22;

/// Bytes kept inline up to [`INLINE`] of them, in one exactly sized allocation beyond.
#[derive(Clone)]
pub enum Text {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Text {
    /// The pieces put together, in that order.
    pub fn of_pieces(pieces: &[&[u8]]) -> Text {
        let len = pieces.iter().map(|piece| piece.len()).sum::<usize>();
        match u8::try_from(len) {
            Ok(short) if len <= INLINE => {
                let mut bytes = [0; INLINE];
                let mut at = 0;
                for piece in pieces {
                    bytes[at..at + piece.len()].copy_from_slice(piece);
                    at += piece.len();
                }
                Text::Inline { len: short, bytes }
            }
            _ => Text::Heap(pieces.concat().into_boxed_slice()),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Text::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Text::Heap(bytes) => bytes,
        }
    }

    /// The bytes it owns outside itself, for MEMORY USAGE.
    pub fn heap_len(&self) -> usize {
        match self {
            Text::Inline { .. } => 0,
            Text::Heap(bytes) => bytes.len(),
        }
    }
}

impl Default for Text {
    fn default() -> Text {
        Text::Inline {
            len: 0,
            bytes: [0; INLINE],
        }
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Text) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Text {}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_texts_stay_inline_and_long_ones_go_to_the_heap() {
        let empty = Text::of_pieces(&[]);
        assert_eq!(empty.as_bytes(), b"");
        assert_eq!(empty, Text::default());
        assert_eq!(empty.heap_len(), 0);

        let who = Text::of_pieces(&[b"127.0.0.1:51234 w7", b" ", b"a"]);
        assert_eq!(who.as_bytes(), b"127.0.0.1:51234 w7 a");
        assert!(matches!(who, Text::Inline { .. }));
        assert_eq!(who.heap_len(), 0);

        let full = [b'a'; INLINE];
        let at_limit = Text::of_pieces(&[&full[..20], &full[20..]]);
        assert_eq!(at_limit.as_bytes(), &full[..]);
        assert!(matches!(at_limit, Text::Inline { .. }));

        let over = [b'b'; INLINE + 1];
        let long = Text::of_pieces(&[&over[..1], &over[1..]]);
        assert_eq!(long.as_bytes(), &over[..]);
        assert_eq!(long.heap_len(), INLINE + 1);
        assert_ne!(long, at_limit);

        let huge = vec![b'c'; 300];
        assert_eq!(Text::of_pieces(&[&huge]).as_bytes(), &huge[..]);
    }

    #[test]
    fn a_text_takes_24_bytes() {
        assert_eq!(std::mem::size_of::<Text>(), 24);
    }
}
