//! A token as the server keeps it: a digest, never the token itself.
//!
//! The token is the holder's secret: whoever presents it may release or renew. The module needs
//! only to recognise it, so it keeps a 128-bit digest (SHA-256 of a fixed prefix and the token,
//! cut to 16 bytes), the way a password store keeps hashes. Values, RDB and AOF files, DUMP
//! payloads, the replication stream and MONITOR on a replica carry the digest, from which the
//! token cannot be recovered (for tokens of 16 random bytes or more, as the README asks:
//! a short guessable token can be guessed from its digest as from anything else).
//!
//! Every comparison (release, renew, the same-token retry, a shared holder's search) compares
//! digests; a shared holder's fingerprint is the digest's first four bytes.

use sha2::{Digest, Sha256};

/// The bytes of a digest.
pub const DIGEST_LEN: usize = 16;

/// What comes before the token in the hash: a digest of this module's tokens is not the plain
/// SHA-256 of the token that another system may have published.
const DOMAIN: &[u8] = b"redis-lock token digest v1\0";

/// The digest of a token.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenDigest([u8; DIGEST_LEN]);

impl TokenDigest {
    /// The digest of `token` (the secret a client presents).
    pub fn of(token: &[u8]) -> TokenDigest {
        let hash = Sha256::new()
            .chain_update(DOMAIN)
            .chain_update(token)
            .finalize();
        let mut digest = [0; DIGEST_LEN];
        digest.copy_from_slice(&hash[..DIGEST_LEN]);
        TokenDigest(digest)
    }

    /// A digest as stored or replicated (exactly [`DIGEST_LEN`] bytes).
    pub fn from_stored(bytes: &[u8]) -> Option<TokenDigest> {
        bytes.try_into().ok().map(TokenDigest)
    }

    pub fn as_bytes(&self) -> &[u8; DIGEST_LEN] {
        &self.0
    }

    /// A 32-bit fingerprint, for searches among many holders: equal digests have equal ones.
    pub fn print(&self) -> u32 {
        u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }
}

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenDigest(")?;
        for byte in &self.0[..4] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_tokens_have_equal_digests_and_different_ones_differ() {
        let a = TokenDigest::of(b"client-a-7f3e9c");
        assert_eq!(a, TokenDigest::of(b"client-a-7f3e9c"));
        assert_ne!(a, TokenDigest::of(b"client-a-7f3e9d"));
        assert_ne!(TokenDigest::of(b""), TokenDigest::of(b"\0"));
        assert_eq!(TokenDigest::from_stored(a.as_bytes()), Some(a));
        assert_eq!(TokenDigest::from_stored(&[0; 15]), None);
        assert_eq!(TokenDigest::from_stored(&[0; 17]), None);
    }

    #[test]
    fn the_digest_is_the_documented_one() {
        // SHA-256("redis-lock token digest v1\0" || "t"), first 16 bytes: what tests/common
        // computes too, so a crafted DUMP payload can hold a digest.
        let mut hasher = Sha256::new();
        hasher.update(b"redis-lock token digest v1\0t");
        let full = hasher.finalize();
        assert_eq!(TokenDigest::of(b"t").as_bytes()[..], full[..16]);
        assert_eq!(
            format!("{:?}", TokenDigest::of(b"t")),
            format!(
                "TokenDigest({:02x}{:02x}{:02x}{:02x}..)",
                full[0], full[1], full[2], full[3]
            )
        );
    }
}
