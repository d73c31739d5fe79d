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
//! so the retried request is byte-identical to the first one. Since every
//! field of the token is the client's to choose, the shard is a keyed hash
//! of it under the deployment's secret ([`ShardKey`]): a client grinding
//! `Idempotency-Key`s offline cannot pin its writes to one shard.

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
        (self.as_u64() % n) as u32
    }

    /// 64 uniform bits of it (its first 16 hex characters).
    pub fn as_u64(&self) -> u64 {
        u64::from_str_radix(&self.0[..16], 16).unwrap_or(0)
    }
}

/// The deployment's secret that picks a like's shard from its token
/// (`SHARD_KEY`): HMAC-SHA-256 of the token under it. Never printed: its
/// `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct ShardKey(Vec<u8>);

impl std::fmt::Debug for ShardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardKey(..)")
    }
}

/// The shard key of the local stack and tests, where no secret is set
/// (refused inside Lambda: see [`crate::config`]).
pub const LOCAL_SHARD_KEY: &str = "likes-local-stack-shard-key-not-a-secret";

impl ShardKey {
    /// Shortest `SHARD_KEY` accepted, in bytes.
    pub const MIN_LEN: usize = 32;

    /// A key from its secret text.
    pub fn new(secret: &str) -> Self {
        ShardKey(secret.as_bytes().to_vec())
    }

    /// The shard, of `write_shards`, that a request with `token` writes:
    /// the same for every retry of it, unpredictable without the key.
    pub fn shard(&self, token: &RequestToken, write_shards: u32) -> u32 {
        let mac = self.hmac(token.as_str().as_bytes());
        let bits = u64::from_be_bytes(mac[..8].try_into().unwrap_or([0; 8]));
        (bits % u64::from(write_shards.max(1))) as u32
    }

    /// HMAC-SHA-256 (RFC 2104) of `message` under the key.
    fn hmac(&self, message: &[u8]) -> [u8; 32] {
        const BLOCK: usize = 64;
        let mut key = [0u8; BLOCK];
        if self.0.len() > BLOCK {
            key[..32].copy_from_slice(&Sha256::digest(&self.0));
        } else {
            key[..self.0.len()].copy_from_slice(&self.0);
        }
        let pad = |byte: u8| key.map(|k| k ^ byte);
        let inner = Sha256::new()
            .chain_update(pad(0x36))
            .chain_update(message)
            .finalize();
        Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize()
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shard_key_is_hmac_sha256_and_is_never_printed() {
        // RFC 4231, test case 2.
        let mac = ShardKey::new("Jefe").hmac(b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // A key longer than a block is hashed first (RFC 4231, case 6).
        let long = ShardKey(vec![0xaa; 131]);
        let mac = long.hmac(b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(mac[..4], [0x60, 0xe4, 0x31, 0x59], "{mac:02x?}");
        let key = ShardKey::new("a secret that must never reach a log line");
        assert_eq!(format!("{key:?}"), "ShardKey(..)");
    }

    #[test]
    fn keys_ground_for_one_shard_without_the_secret_spread_over_all() {
        // A client grinds keys until the unkeyed derivation puts them all on
        // shard 0 of 8 (what the shard was before: the token's own bits).
        let (user, reel) = ids();
        let ground: Vec<RequestToken> = (0..)
            .map(|i| {
                RequestToken::derive(
                    &user,
                    &reel,
                    Action::Like,
                    &RequestIdentity::ClientKey(&format!("k{i}")),
                )
            })
            .filter(|t| t.shard(8) == 0)
            .take(64)
            .collect();
        let key = ShardKey::new(LOCAL_SHARD_KEY);
        let mut seen = [0u32; 8];
        for t in &ground {
            seen[key.shard(t, 8) as usize] += 1;
            // Stable: a retry of the request picks the same shard.
            assert_eq!(key.shard(t, 8), key.shard(&t.clone(), 8));
        }
        assert!(seen.iter().filter(|n| **n > 0).count() >= 6, "{seen:?}");
        // Another deployment's secret, another spread.
        let other = ShardKey::new("another deployment's secret, 32+ bytes long");
        assert!(ground.iter().any(|t| other.shard(t, 8) != key.shard(t, 8)));
    }

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
