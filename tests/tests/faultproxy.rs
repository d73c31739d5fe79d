//! The fault-injection proxy itself, through the real SDK against embedded
//! dynoxide: each fault class answers the way DynamoDB does (so the SDK
//! parses it into the error the functions handle), a lost answer means the
//! write *did* happen, a retry with the same token is replayed by the
//! emulator and one with another body is refused, the capacity model
//! throttles a key at its cap and counts 2 units per transactional item,
//! `UnprocessedKeys` are well formed, the conflict model cancels a
//! transaction on an item another one holds (and answers a single write
//! and a same-token retry the way DynamoDB does), and the statistics say
//! what happened.

mod common;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, TransactWriteItem, Update};
use common::TestStack;
use faultproxy::{Faults, Proxy};
use std::time::Duration;

/// A client with no SDK retries, so every injected fault is seen.
fn raw_client(endpoint: &str) -> Client {
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("local", "local", None, None, "test"))
        .endpoint_url(endpoint)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(Duration::from_millis(400))
                .build(),
        )
        .build();
    Client::from_conf(conf)
}

struct Rig {
    t: TestStack,
    proxy: Proxy,
    client: Client,
    table: String,
}

async fn rig(spec: &str) -> Rig {
    let t = TestStack::start(&[("LOCAL_SCHEDULE_SECS", "0")]).await;
    let faults = Faults::parse(spec).expect("spec");
    let proxy = Proxy::start("127.0.0.1:0", &t.stack.dynamo_endpoint, faults)
        .await
        .expect("proxy");
    let client = raw_client(&proxy.url);
    let table = t.stack.config.counters_table.clone();
    Rig {
        t,
        proxy,
        client,
        table,
    }
}

fn add_one(table: &str, pk: &str) -> TransactWriteItem {
    TransactWriteItem::builder()
        .update(
            Update::builder()
                .table_name(table)
                .key("pk", AttributeValue::S(pk.into()))
                .update_expression("ADD n :one")
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .build()
                .unwrap(),
        )
        .build()
}

async fn n_of(r: &Rig, pk: &str) -> i64 {
    r.t.stack
        .client
        .get_item()
        .table_name(&r.table)
        .key("pk", AttributeValue::S(pk.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .and_then(|i| i.get("n").and_then(|v| v.as_n().ok()).cloned())
        .map(|n| n.parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_lost_answer_was_committed_and_its_retry_is_replayed_once() {
    let r = rig("seed=1,TransactWriteItems.lost=1,stall_ms=1000").await;
    let send = |pk: &str, token: &str| {
        r.client
            .transact_write_items()
            .transact_items(add_one(&r.table, pk))
            .client_request_token(token)
            .send()
    };
    // Three lost answers (the schedule picks drop, stall or 500): each is
    // an error to the client, yet each transaction committed.
    for i in 0..3 {
        let pk = format!("lost{i}");
        let err = send(&pk, &format!("token-{i}"))
            .await
            .expect_err("answer lost");
        drop(err);
        assert_eq!(
            n_of(&r, &pk).await,
            1,
            "{pk}: committed although the answer was lost"
        );
    }
    r.proxy.set_faults(Faults::default());
    for i in 0..3 {
        let pk = format!("lost{i}");
        send(&pk, &format!("token-{i}")).await.expect("replayed");
        assert_eq!(
            n_of(&r, &pk).await,
            1,
            "{pk}: the retry was not applied again"
        );
    }
    // The same token with another body.
    let e = send("other", "token-0").await.expect_err("mismatch");
    assert_eq!(e.code(), Some("IdempotentParameterMismatchException"));
    assert_eq!(n_of(&r, "other").await, 0);

    let s = r.proxy.stats();
    let lost: u64 = ["lost_dropped", "lost_stalled", "lost_500"]
        .iter()
        .map(|c| s.injected_of(c))
        .sum();
    assert_eq!(lost, 3);
    assert_eq!(s.tokens.replayed_after_commit, 3, "{:?}", s.tokens);
    assert_eq!(s.tokens.mismatch_after_commit, 1, "{:?}", s.tokens);
    assert_eq!(s.tokens.reused_with_other_body, 1, "{:?}", s.tokens);
    r.t.stop().await;
}

#[tokio::test]
async fn refusals_are_dynamodb_errors_and_change_nothing() {
    let r = rig("seed=2,throttle=1").await;
    for _ in 0..6 {
        let e = r
            .client
            .transact_write_items()
            .transact_items(add_one(&r.table, "refused"))
            .send()
            .await
            .expect_err("throttled");
        let code = e.code().unwrap_or_default().to_owned();
        let ok = match e.as_service_error() {
            Some(aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(c)) => {
                c.cancellation_reasons().iter().any(|r| r.code() == Some("ThrottlingError"))
            }
            _ => matches!(code.as_str(), "ProvisionedThroughputExceededException" | "ThrottlingException"),
        };
        assert!(ok, "{e:?}");
    }
    r.proxy
        .set_faults(Faults::parse("seed=3,conflict=1").unwrap());
    let e = r
        .client
        .transact_write_items()
        .transact_items(add_one(&r.table, "refused"))
        .transact_items(add_one(&r.table, "refused2"))
        .send()
        .await
        .expect_err("conflict");
    let Some(aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(c)) = e.as_service_error() else {
        panic!("{e:?}")
    };
    let codes: Vec<_> = c
        .cancellation_reasons()
        .iter()
        .filter_map(|r| r.code())
        .collect();
    assert_eq!(codes.len(), 2);
    assert_eq!(
        codes
            .iter()
            .filter(|c| **c == "TransactionConflict")
            .count(),
        1,
        "{codes:?}"
    );
    r.proxy.set_faults(Faults::parse("seed=4,error=1").unwrap());
    for _ in 0..4 {
        let e = r
            .client
            .get_item()
            .table_name(&r.table)
            .key("pk", AttributeValue::S("refused".into()))
            .send()
            .await
            .expect_err("5xx");
        let status = e.raw_response().map(|r| r.status().as_u16());
        assert!(matches!(status, Some(500 | 503)), "{e:?}");
    }
    assert_eq!(n_of(&r, "refused").await, 0);
    assert_eq!(n_of(&r, "refused2").await, 0);
    let s = r.proxy.stats();
    assert_eq!(s.injected_of("throttle"), 6);
    assert_eq!(s.injected_of("conflict"), 1);
    assert_eq!(s.injected_of("server_error"), 4);
    assert_eq!(
        s.forwarded.values().sum::<u64>(),
        0,
        "nothing refused was forwarded"
    );
    r.t.stop().await;
}

#[tokio::test]
async fn the_capacity_model_throttles_one_hot_key_at_its_cap() {
    // 10 write units per key per second; a transactional item costs 2.
    let r = rig("seed=5,write_cap=10").await;
    let (mut ok, mut throttled) = (0, 0);
    for _ in 0..12 {
        let res = r
            .client
            .transact_write_items()
            .transact_items(add_one(&r.table, "hot"))
            .send()
            .await;
        match res {
            Ok(_) => ok += 1,
            Err(e) => {
                let Some(aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError::TransactionCanceledException(c)) = e.as_service_error() else {
                    panic!("{e:?}")
                };
                assert_eq!(c.cancellation_reasons()[0].code(), Some("ThrottlingError"));
                throttled += 1;
            }
        }
    }
    // Twelve quick calls fit in one or two one-second windows: 5 per window.
    assert!((5..=10).contains(&ok), "{ok} committed");
    assert_eq!(ok + throttled, 12);
    assert_eq!(
        n_of(&r, "hot").await,
        ok as i64,
        "only what was accepted was applied"
    );
    // Another key is not held back by the hot one.
    r.client
        .update_item()
        .table_name(&r.table)
        .key("pk", AttributeValue::S("cool".into()))
        .update_expression("ADD n :one")
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .send()
        .await
        .expect("a cool key is under its cap");
    let s = r.proxy.stats();
    let hot = &s.hot_keys[0];
    assert_eq!(
        hot.partition,
        format!("{}/hot", r.table),
        "schema learned: {s:?}"
    );
    assert!(hot.max_write_units_per_sec <= 10.0, "{hot:?}");
    assert_eq!(hot.write_units, 2.0 * ok as f64);
    assert_eq!(hot.throttled, throttled);
    assert_eq!(s.injected_of("capacity_throttle"), throttled);
    // Every key's load, not only the hottest (the benchmark attributes
    // units with it): the two keys, with what each took.
    let mut loads: Vec<(String, f64)> = r
        .proxy
        .key_loads()
        .into_iter()
        .map(|k| (k.partition, k.write_units))
        .collect();
    loads.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        loads,
        vec![
            (format!("{}/cool", r.table), 1.0),
            (format!("{}/hot", r.table), 2.0 * ok as f64)
        ]
    );
    r.t.stop().await;
}

#[tokio::test]
async fn the_conflict_model_cancels_a_transaction_on_a_held_item() {
    // dynoxide answers in well under a millisecond: the hold is what makes
    // the next requests overlap the first transaction.
    // Under the test client's attempt timeout (400 ms), as the answer waits.
    let hold = Duration::from_millis(300);
    let r = rig(&format!("seed=8,conflict_hold_ms={}", hold.as_millis())).await;
    let first = || {
        r.client
            .transact_write_items()
            .transact_items(add_one(&r.table, "held"))
            .client_request_token("first")
    };
    // The first transaction reaches the emulator at once; its answer is
    // held back for the hold, and its item held until the answer goes out.
    let started = std::time::Instant::now();
    let (answer, ()) = tokio::join!(first().send(), async {
        while n_of(&r, "held").await != 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Another transaction on the held item: cancelled at that item only.
        let e = r
            .client
            .transact_write_items()
            .transact_items(add_one(&r.table, "free"))
            .transact_items(add_one(&r.table, "held"))
            .send()
            .await
            .expect_err("conflict");
        let Some(TransactWriteItemsError::TransactionCanceledException(c)) = e.as_service_error()
        else {
            panic!("{e:?}")
        };
        let codes: Vec<_> = c.cancellation_reasons().iter().map(|r| r.code()).collect();
        assert_eq!(codes, [Some("None"), Some("TransactionConflict")]);
        // A single write to it: TransactionConflictException.
        let e = r
            .client
            .update_item()
            .table_name(&r.table)
            .key("pk", AttributeValue::S("held".into()))
            .update_expression("ADD n :one")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
            .await
            .expect_err("conflict");
        assert!(
            matches!(
                e.as_service_error(),
                Some(UpdateItemError::TransactionConflictException(_))
            ),
            "{e:?}"
        );
        // A read of it goes through.
        let got = r
            .client
            .get_item()
            .table_name(&r.table)
            .key("pk", AttributeValue::S("held".into()))
            .send()
            .await
            .expect("a GetItem does not conflict");
        assert!(got.item.is_some());
        // The first transaction's retry while it holds: still in progress.
        let e = first().send().await.expect_err("in progress");
        assert!(
            matches!(
                e.as_service_error(),
                Some(TransactWriteItemsError::TransactionInProgressException(_))
            ),
            "{e:?}"
        );
        assert!(started.elapsed() < hold, "the checks ran inside the hold");
    });
    answer.expect("the first transaction commits");
    assert!(started.elapsed() >= hold, "its answer was held back");
    // Its retry once answered reaches the emulator, which replays it.
    first().send().await.expect("replayed");
    assert_eq!(n_of(&r, "held").await, 1, "applied once");
    assert_eq!(
        n_of(&r, "free").await,
        0,
        "the cancelled one changed nothing"
    );

    let s = r.proxy.stats();
    let m = &s.modeled_conflicts;
    assert_eq!(m.refused.get("TransactWriteItems"), Some(&1), "{m:?}");
    assert_eq!(m.refused.get("UpdateItem"), Some(&1), "{m:?}");
    assert_eq!(m.in_progress, 1, "{m:?}");
    assert_eq!(s.injected_of("conflict"), 0, "the random class stayed off");
    assert_eq!(s.tokens.replayed_after_commit, 1, "{:?}", s.tokens);
    let http: serde_json::Value = reqwest::get(format!("{}/__proxy/stats", r.proxy.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        http["modeled_conflicts"]["refused"]["TransactWriteItems"],
        1
    );
    r.t.stop().await;
}

#[tokio::test]
async fn batch_reads_come_back_partly_unprocessed() {
    let r = rig("seed=6,BatchGetItem.unprocessed=1").await;
    let keys: Vec<String> = (0..20).map(|i| format!("b{i}")).collect();
    for k in &keys {
        r.t.stack
            .client
            .put_item()
            .table_name(&r.table)
            .item("pk", AttributeValue::S(k.clone()))
            .item("n", AttributeValue::N("1".into()))
            .send()
            .await
            .unwrap();
    }
    let mut ka = KeysAndAttributes::builder().consistent_read(true);
    for k in &keys {
        ka = ka.keys([("pk".to_owned(), AttributeValue::S(k.clone()))].into());
    }
    let out = r
        .client
        .batch_get_item()
        .request_items(&r.table, ka.build().unwrap())
        .send()
        .await
        .expect("batch");
    let got = out
        .responses()
        .and_then(|m| m.get(&r.table))
        .map_or(0, |v| v.len());
    let left = out
        .unprocessed_keys()
        .and_then(|m| m.get(&r.table))
        .map(|k| {
            assert_eq!(
                k.consistent_read(),
                Some(true),
                "the request's options are kept"
            );
            k.keys().len()
        })
        .unwrap_or(0);
    assert!(left > 0 && got > 0, "got {got}, unprocessed {left}");
    assert_eq!(got + left, keys.len());
    assert_eq!(r.proxy.stats().injected_of("unprocessed"), 1);

    // The statistics over HTTP, and changing the faults at run time.
    let http = reqwest::Client::new();
    let stats: serde_json::Value = http
        .get(format!("{}/__proxy/stats", r.proxy.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["injected"]["unprocessed"]["BatchGetItem"], 1);
    let set = http
        .put(format!("{}/__proxy/faults", r.proxy.url))
        .body("seed=9,lost=0.5")
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let bad = http
        .put(format!("{}/__proxy/faults", r.proxy.url))
        .body("lost=7")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert_eq!(r.proxy.stats().faults.unwrap().rates.lost, 0.5);
    r.t.stop().await;
}
