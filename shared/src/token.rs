//! The `ClientRequestToken` of a like/unlike transaction, and its shard.
//!
//! DynamoDB treats a second `TransactWriteItems` with the same token (within
//! ten minutes) as a replay: it answers success without writing again, or
//! `IdempotentParameterMismatch` if the request differs. So the token must be
//! the same for every retry of one client request and different for every
//! other request:
//!
//! * with an `Idempotency-Key` header, it is derived from (user, reel,
//!   action, key): the client's promise that those are one request;
//! * without one, from (user, reel, action, API Gateway request id), which
//!   is unique per HTTP request. A like → unlike → like sequence therefore
//!   gets three different tokens and is never swallowed as a replay.
//!
//! The shard is derived from the token as well: a retry picks the same shard,
//! so the retried request is byte-identical to the first one.

use crate::keys::{Action, ReelId, UserId};
use sha2::{Digest, Sha256};

/// Longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 64;

/// What makes one client request unique.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestIdentity<'a> {
    /// The client's `Idempotency-Key` header.
    ClientKey(&'a str),
    /// The API Gateway request id.
    RequestId(&'a str),
}

/// A derived token: 32 lowercase hex characters (128 bits of SHA-256),
/// within DynamoDB's 36-character limit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestToken(String);

impl RequestToken {
    /// The token of one client request: the same for every retry of it
    /// (same key or request id), different for any other request.
    pub fn derive(user: &UserId, reel: &ReelId, action: Action, id: &RequestIdentity<'_>) -> Self {
        let mut h = Sha256::new();
        // Length-prefixed fields: no two different tuples hash the same bytes,
        // whatever characters the user id holds.
        h.update(b"likes/token/v1");
        let (kind, value) = match id {
            RequestIdentity::ClientKey(k) => ("key", *k),
            RequestIdentity::RequestId(r) => ("req", *r),
        };
        for field in [user.as_str(), reel.as_str(), action.as_str(), kind, value] {
            h.update((field.len() as u64).to_be_bytes());
            h.update(field.as_bytes());
        }
        Self::from_digest(&h.finalize())
    }

    /// A token for a request that carries no request id at all (an event not
    /// from API Gateway). Exactly-once still holds through the like row's
    /// condition; only retries of that request cannot be recognised.
    pub fn random() -> Self {
        let mut h = Sha256::new();
        h.update(fastrand::u128(..).to_be_bytes());
        Self::from_digest(&h.finalize())
    }

    /// A follow-up token for a fresh attempt after the original token turned
    /// out to be bound to a different request (IdempotentParameterMismatch).
    pub fn follow_up(&self, round: u32) -> Self {
        let mut h = Sha256::new();
        h.update(b"likes/token/follow-up/v1");
        h.update(self.0.as_bytes());
        h.update(round.to_be_bytes());
        Self::from_digest(&h.finalize())
    }

    /// A token for an internal transaction (a fold), derived from every
    /// field that defines it: a retry sends the same token, another fold
    /// a different one.
    pub fn for_fields(domain: &str, fields: &[&str]) -> Self {
        let mut h = Sha256::new();
        h.update(b"likes/token/");
        h.update(domain.as_bytes());
        for field in fields {
            h.update((field.len() as u64).to_be_bytes());
            h.update(field.as_bytes());
        }
        Self::from_digest(&h.finalize())
    }

    fn from_digest(d: &[u8]) -> Self {
        let mut s = String::with_capacity(32);
        for b in &d[..16] {
            s.push_str(&format!("{b:02x}"));
        }
        RequestToken(s)
    }

    /// The 32 hex characters, as sent in `ClientRequestToken`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The write shard for this request, uniform over `0..write_shards`.
    pub fn shard(&self, write_shards: u32) -> u32 {
        let n = write_shards.max(1) as u64;
        // The token is hex; its first 16 characters are 64 uniform bits.
        let bits = u64::from_str_radix(&self.0[..16], 16).unwrap_or(0);
        (bits % n) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (UserId, ReelId) {
        (
            UserId::parse("user-42").unwrap(),
            ReelId::parse("reel-1").unwrap(),
        )
    }

    #[test]
    fn same_request_same_token_and_shard() {
        let (u, r) = ids();
        let a = RequestToken::derive(&u, &r, Action::Like, &RequestIdentity::ClientKey("k1"));
        let b = RequestToken::derive(&u, &r, Action::Like, &RequestIdentity::ClientKey("k1"));
        assert_eq!(a, b);
        assert_eq!(a.shard(20), b.shard(20));
        assert!(a.as_str().len() <= 36);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn every_field_changes_the_token() {
        let (u, r) = ids();
        let base = RequestToken::derive(&u, &r, Action::Like, &RequestIdentity::RequestId("r1"));
        let others = [
            RequestToken::derive(&u, &r, Action::Unlike, &RequestIdentity::RequestId("r1")),
            RequestToken::derive(&u, &r, Action::Like, &RequestIdentity::RequestId("r2")),
            RequestToken::derive(&u, &r, Action::Like, &RequestIdentity::ClientKey("r1")),
            RequestToken::derive(
                &UserId::parse("user-43").unwrap(),
                &r,
                Action::Like,
                &RequestIdentity::RequestId("r1"),
            ),
            RequestToken::derive(
                &u,
                &ReelId::parse("reel-2").unwrap(),
                Action::Like,
                &RequestIdentity::RequestId("r1"),
            ),
        ];
        for o in &others {
            assert_ne!(&base, o);
        }
        assert_ne!(base.follow_up(1), base);
        assert_ne!(base.follow_up(1), base.follow_up(2));
    }

    #[test]
    fn field_boundaries_cannot_be_shifted() {
        // "ab"+"c" and "a"+"bc" must not collide.
        let r = ReelId::parse("c").unwrap();
        let r2 = ReelId::parse("bc").unwrap();
        let a = RequestToken::derive(
            &UserId::parse("ab").unwrap(),
            &r,
            Action::Like,
            &RequestIdentity::RequestId("x"),
        );
        let b = RequestToken::derive(
            &UserId::parse("a").unwrap(),
            &r2,
            Action::Like,
            &RequestIdentity::RequestId("x"),
        );
        assert_ne!(a, b);
    }

    #[test]
    fn shards_spread_over_all_write_shards() {
        let (u, r) = ids();
        let mut seen = vec![0u32; 20];
        for i in 0..4000 {
            let id = format!("req-{i}");
            let t = RequestToken::derive(&u, &r, Action::Like, &RequestIdentity::RequestId(&id));
            seen[t.shard(20) as usize] += 1;
        }
        // 200 expected per shard; a shard outside 120..280 would mean a bias.
        assert!(seen.iter().all(|&c| (120..280).contains(&c)), "{seen:?}");
        assert_ne!(RequestToken::random(), RequestToken::random());
    }
}
