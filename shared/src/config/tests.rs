//! The configuration's tests (kept out of `config.rs`, which holds the
//! readers).

use super::*;
use std::collections::HashMap;

fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| map.get(k).cloned())
}

#[test]
fn defaults_apply_with_only_table_names() {
    let c = cfg(&[("COUNTERS_TABLE", "c"), ("LIKES_TABLE", "l")]).unwrap();
    assert_eq!(c.cache_ttl, Duration::from_millis(2000));
    assert_eq!(c.settings_ttl, Duration::from_millis(5000));
    assert_eq!(c.auth_mode, AuthMode::Jwt);
    assert_eq!(c.resize.max_shards, 100);
    assert_eq!(
        c.resize_wait(),
        Duration::from_millis(5000 + 12000 + 3000 + 2000)
    );
}

#[test]
fn missing_table_and_bad_numbers_are_refused() {
    assert!(cfg(&[("LIKES_TABLE", "l")]).is_err());
    let base = [("COUNTERS_TABLE", "c"), ("LIKES_TABLE", "l")];
    for bad in [
        ("CACHE_TTL_MS", "-1"),
        ("CACHE_TTL_MS", "2s"),
        ("TX_MAX_ATTEMPTS", "0"),
        ("MAX_SHARDS", "101"),
        ("SATURATED_GROWTH", "1"),
        ("HOT_LIKES_PER_SEC", "0"),
        ("SHARD_HEADROOM", "NaN"),
        ("COOL_LIKES_PER_SEC", "500"),
        ("AUTO_RESHARD", "maybe"),
    ] {
        let mut pairs = base.to_vec();
        pairs.push(bad);
        assert!(cfg(&pairs).is_err(), "{bad:?} accepted");
    }
}

/// Issue 35: two batches of one stream shard at once (a
/// `ParallelizationFactor` above 1) make the aggregators skip records
/// (the checkpoint is a high-water mark), so a function told so does
/// not start. Before, the variable did not exist and nothing refused it.
#[test]
fn more_than_one_batch_per_stream_shard_is_refused() {
    let base = [("COUNTERS_TABLE", "c"), ("LIKES_TABLE", "l")];
    for ok in ["1", " 1 ", ""] {
        let mut pairs = base.to_vec();
        pairs.push(("BATCHES_PER_STREAM_SHARD", ok));
        assert!(cfg(&pairs).is_ok(), "{ok:?} refused");
    }
    for bad in ["2", "10", "0", "one"] {
        let mut pairs = base.to_vec();
        pairs.push(("BATCHES_PER_STREAM_SHARD", bad));
        let err = cfg(&pairs).unwrap_err();
        assert!(
            err.0.contains("high-water mark") && err.0.contains("ParallelizationFactor"),
            "{bad}: {err}"
        );
    }
}

/// Issue 35: a views record age past 12 hours leaves a given-up range
/// too little of the stream's 24 hours to be repaired in. Before, every
/// age up to 86400 (none left) was accepted.
#[test]
fn a_views_record_age_that_leaves_no_time_to_repair_is_refused() {
    let base = [("COUNTERS_TABLE", "c"), ("LIKES_TABLE", "l")];
    for ok in ["1", "60", "3600", "43200"] {
        let mut pairs = base.to_vec();
        pairs.push(("VIEWS_MAX_RECORD_AGE_SECS", ok));
        assert!(cfg(&pairs).is_ok(), "{ok} refused");
    }
    for bad in ["43201", "86400", "0", "-1"] {
        let mut pairs = base.to_vec();
        pairs.push(("VIEWS_MAX_RECORD_AGE_SECS", bad));
        let err = cfg(&pairs).unwrap_err();
        assert!(err.0.contains("repair"), "{bad}: {err}");
    }
}

#[test]
fn dev_mode_only_when_asked_for_exactly() {
    let base = [("COUNTERS_TABLE", "c"), ("LIKES_TABLE", "l")];
    let mut dev = base.to_vec();
    dev.push(("AUTH_MODE", "dev"));
    assert_eq!(cfg(&dev).unwrap().auth_mode, AuthMode::Dev);
    let mut odd = base.to_vec();
    odd.push(("AUTH_MODE", "DEV-please"));
    assert!(cfg(&odd).is_err());
    // Inside Lambda, dev mode (anyone is whoever their header says) is
    // refused: the function does not start. (Before, it was honoured
    // wherever the variable was set.)
    let mut in_lambda = dev.clone();
    in_lambda.push(("AWS_LAMBDA_FUNCTION_NAME", "likes-LikeFunction-abc"));
    let err = cfg(&in_lambda).unwrap_err();
    assert!(err.0.contains("refused inside Lambda"), "{err:?}");
    let mut jwt_in_lambda = base.to_vec();
    jwt_in_lambda.push(("AWS_LAMBDA_FUNCTION_NAME", "likes-LikeFunction-abc"));
    // Inside Lambda the shard key must be the deployment's own.
    let err = cfg(&jwt_in_lambda).unwrap_err();
    assert!(err.0.contains("SHARD_KEY must be set"), "{err:?}");
    jwt_in_lambda.push(("SHARD_KEY", "short"));
    assert!(cfg(&jwt_in_lambda).unwrap_err().0.contains("at least 32"));
    jwt_in_lambda.pop();
    jwt_in_lambda.push(("SHARD_KEY", "0123456789abcdef0123456789abcdef-deployment"));
    assert_eq!(cfg(&jwt_in_lambda).unwrap().auth_mode, AuthMode::Jwt);
}

/// Issue 36: nobody may use the admin routes or erase unless listed, a bad
/// entry stops the function at its cold start, and inside Lambda a user's
/// token needs the scope even when `JWT_SCOPE` is missing.
#[test]
fn access_is_closed_by_default_and_read_strictly() {
    let base = [("COUNTERS_TABLE", "c"), ("LIKES_TABLE", "l")];
    let c = cfg(&base).unwrap();
    assert!(c.access.admin.is_empty() && c.access.erasure.is_empty());
    assert_eq!(c.access.jwt_scope, None, "outside Lambda: no scope check");
    let mut lambda = base.to_vec();
    lambda.push(("AWS_LAMBDA_FUNCTION_NAME", "likes-LikeFunction-abc"));
    lambda.push(("SHARD_KEY", "0123456789abcdef0123456789abcdef-deployment"));
    let c = cfg(&lambda).unwrap();
    assert_eq!(c.access.jwt_scope.as_deref(), Some("likes/api"));
    let mut off = lambda.clone();
    off.push(("JWT_SCOPE", ""));
    assert_eq!(cfg(&off).unwrap().access.jwt_scope, None);
    let mut listed = lambda.clone();
    listed.push((
        "ADMIN_PRINCIPALS",
        "arn:aws:iam::123456789012:role/likes-operators",
    ));
    let c = cfg(&listed).unwrap();
    assert!(
        c.access
            .admin
            .admits("arn:aws:sts::123456789012:assumed-role/likes-operators/me")
    );
    assert!(c.access.erasure.is_empty());
    for (var, bad) in [
        ("ADMIN_PRINCIPALS", "arn:aws:iam::123456789012:role/*"),
        ("ERASURE_PRINCIPALS", "arn:aws:iam::123456789012:root"),
        ("JWT_SCOPE", "likes/api openid"),
    ] {
        let mut v = lambda.clone();
        v.push((var, bad));
        let err = cfg(&v).unwrap_err();
        assert!(err.0.contains(var), "{err:?}");
    }
}
