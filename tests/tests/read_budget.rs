//! A caller's count reads are bounded across function instances (issue
//! 36): `GET /likes` of 100 never-seen ids, sent again and again by one
//! caller through several instances (separate `App`s over the same
//! tables, as Lambda runs them), is refused once the caller's minute is
//! past `CALLER_READ_UNITS_PER_MIN`, in every instance, while another
//! caller is still served. Before, nothing bounded a caller's reads: every
//! request was answered 200 and read ~200 units.

mod common;

use common::TestStack;
use likes::App;
use likes::http::Function;
use likes::store::dynamodb::DynamoStore;
use serde_json::Value;

/// Another function instance over the stack's tables, caches empty.
fn instance(t: &TestStack) -> App {
    let config = t.stack.config.clone();
    App::new(
        config.clone(),
        DynamoStore::new(t.stack.client.clone(), &config),
    )
}

/// `GET /likes?reel_ids=…` of 100 ids never liked, by `user`.
async fn counts(app: &App, user: &str, round: usize) -> u16 {
    let mut event: Value =
        serde_json::from_str(&std::fs::read_to_string("../events/batch-read.json").unwrap())
            .unwrap();
    let ids: Vec<String> = (0..100).map(|i| format!("n{round}x{i}")).collect();
    let ids = ids.join(",");
    event["rawQueryString"] = Value::String(format!("reel_ids={ids}"));
    event["queryStringParameters"]["reel_ids"] = Value::String(ids);
    let claims = &mut event["requestContext"]["authorizer"]["jwt"]["claims"];
    claims["sub"] = Value::String(user.into());
    claims["username"] = Value::String(user.into());
    let req = lambda_http::request::from_str(&event.to_string()).unwrap();
    likes::http::handle(app, Function::Read, req)
        .await
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_past_its_read_units_is_refused_by_every_instance() {
    let t = TestStack::start(&[
        ("COUNTING", "transactional"),
        ("CALLER_READ_UNITS_PER_MIN", "1000"),
    ])
    .await;
    let instances: Vec<App> = (0..4).map(|_| instance(&t)).collect();
    // Round robin over four instances, as a flood spread by the
    // route's load balancing would be. Each request reads 100 reels from
    // the tables (2 units each, as charged): 200 units.
    let mut served = 0u32;
    let mut refused = 0u32;
    let mut round = 0;
    // Bounded by the minute the shared item counts in: this loop takes a
    // second or two; should it cross a minute boundary, the next minute's
    // bound applies anew, so allow for two minutes' worth.
    while refused < 8 && round < 200 {
        let app = &instances[round % instances.len()];
        match counts(app, "flooder", round).await {
            200 => served += 1,
            429 => refused += 1,
            other => panic!("status {other}"),
        }
        round += 1;
    }
    assert!(refused >= 8, "never refused: {served} served");
    // The bound (1,000 units = 5 requests) plus, per instance, up to one
    // request past it before it learns the total: at most 9 a minute here,
    // twice that if the loop straddled a minute.
    assert!(served <= 18, "{served} requests served past the bound");
    // Every instance refuses the flooder now, and serves someone else.
    for app in &instances {
        assert_eq!(counts(app, "flooder", 1_000).await, 429);
        assert_eq!(counts(app, "reader", 1_001).await, 200);
    }
    t.stop().await;
}
