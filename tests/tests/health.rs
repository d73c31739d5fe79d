//! `GET /healthz` through the fault proxy: a burst of probes costs a few
//! data-plane reads and no control-plane call (`DescribeTable` is
//! rate-limited per account and shared with deployments); a throttled
//! DynamoDB makes readiness 503, as documented, never 429; it recovers once
//! the tables answer again. `DDB_RETRY_QUOTA` bounds the SDK's retries
//! (0: every attempt; below one retry's cost: none).

mod common;

use common::TestStack;
use faultproxy::Faults;
use likes::service::HEALTH_TTL;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_a_cached_data_plane_probe_and_throttling_is_503() {
    // A proxy that fails nothing the probe does (latency on scans only), so
    // that its counts show what the probes cost.
    let t = TestStack::start(&[
        ("FAULTS", "Scan.latency=0.01,max_latency_ms=1"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("DDB_MAX_ATTEMPTS", "2"),
    ])
    .await;
    let proxy = t.stack.proxy.clone().expect("a proxy");
    proxy.reset_stats();
    for _ in 0..50 {
        let r = t.send("GET", "/healthz", None, &[], None).await;
        assert_eq!(
            (r.status, r.body["status"].as_str()),
            (200, Some("ok")),
            "{}",
            r.body
        );
    }
    let stats = proxy.stats();
    assert_eq!(
        stats.requests.get("DescribeTable"),
        None,
        "{:?}",
        stats.requests
    );
    let gets = stats.requests.get("GetItem").copied().unwrap_or(0);
    // One probe (a read of each table) answers checks for HEALTH_TTL; 50
    // checks take far less than that, unless this machine stalls.
    assert!((2..=6).contains(&gets), "{gets} GetItem for 50 checks");

    // Every read throttled: readiness says unavailable (503), not 429.
    proxy.set_faults(Faults::parse("GetItem.throttle=1,DescribeTable.throttle=1").unwrap());
    tokio::time::sleep(HEALTH_TTL + Duration::from_millis(100)).await;
    let r = t.send("GET", "/healthz", None, &[], None).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{}",
        r.body
    );

    // Answering again: ready once the cached failure has expired.
    proxy.set_faults(Faults::parse("off").unwrap());
    tokio::time::sleep(HEALTH_TTL + Duration::from_millis(100)).await;
    let r = t.send("GET", "/healthz", None, &[], None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    t.stop().await;
}

/// GetItem calls the proxy received for one readiness probe with every read
/// throttled, under `env`.
async fn probe_attempts(env: &[(&str, &str)]) -> u64 {
    let mut all = vec![
        ("FAULTS", "GetItem.throttle=1"),
        ("LOCAL_SCHEDULE_SECS", "0"),
        ("AUTO_RESHARD", "off"),
        ("DDB_MAX_ATTEMPTS", "3"),
        ("RETRY_BASE_MS", "1"),
        ("RETRY_MAX_MS", "2"),
    ];
    all.extend_from_slice(env);
    let t = TestStack::start(&all).await;
    let proxy = t.stack.proxy.clone().expect("a proxy");
    proxy.reset_stats();
    let r = t.send("GET", "/healthz", None, &[], None).await;
    assert_eq!(r.status, 503, "{}", r.body);
    let n = proxy.stats().requests.get("GetItem").copied().unwrap_or(0);
    t.stop().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_retry_quota_is_a_setting() {
    // No quota: each of the probe's two reads is tried DDB_MAX_ATTEMPTS times.
    assert_eq!(probe_attempts(&[("DDB_RETRY_QUOTA", "0")]).await, 2 * 3);
    // A quota below the cost of one retry: the SDK does not retry at all.
    assert_eq!(probe_attempts(&[("DDB_RETRY_QUOTA", "4")]).await, 2);
    // The default (the SDK's 500) retries as usual.
    assert_eq!(probe_attempts(&[]).await, 2 * 3);
}
