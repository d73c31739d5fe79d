//! `GET /healthz` through the fault proxy: a burst of probes costs a few
//! data-plane reads and no control-plane call (`DescribeTable` is
//! rate-limited per account and shared with deployments); a throttled
//! DynamoDB makes readiness 503, as documented, never 429; it recovers once
//! the tables answer again.

mod common;

use common::TestStack;
use faultproxy::Faults;
use likes::http::HEALTH_TTL;
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
