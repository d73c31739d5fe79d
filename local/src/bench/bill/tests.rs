//! The bill's arithmetic: prices × quantities, the aggregators' batches
//! shared by their records, the shapes, and the template's facts.

use super::*;
use crate::bench::costs::tests::cell;
use crate::meter::FunctionStats;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * a.abs().max(1.0)
}

fn facts() -> Facts {
    Facts::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml"))
        .expect("the workspace's template")
}

fn invoked(invocations: u64, billed_ms: f64, records: u64, record_bytes: u64) -> Invoked {
    Invoked {
        meter: FunctionStats {
            invocations,
            seconds: billed_ms / 2000.0,
            billed_ms,
            records,
            record_bytes,
            log_bytes: 300 * invocations,
        },
        emf_bytes: 700 * invocations,
        emf_records: invocations,
        ..Invoked::default()
    }
}

#[test]
fn the_template_gives_memory_level_tracing_and_the_access_log() {
    let f = facts();
    // Globals' 256 MB, reconcile its own 1,024.
    assert_eq!(f.memory_mb["like"], 256.0);
    assert_eq!(f.memory_mb["aggregate-views"], 256.0);
    assert_eq!(f.memory_mb["reconcile"], 1024.0);
    assert!(close(f.memory_gb("read").unwrap(), 0.25));
    assert!(f.memory_gb("nope").is_err());
    assert_eq!(f.log_level, "INFO");
    assert!(f.tracing);
    assert_eq!(f.views_stream_mode, "ON_DEMAND");
    // Every variable replaced, the line a few hundred bytes.
    let n = f.access_log_bytes();
    assert!((250..600).contains(&n), "{n}");
    let plain = Facts::parse(
        "Parameters:\n  L:\n    Default: DEBUG\nGlobals:\n  Function:\n    MemorySize: 512\n    LoggingConfig:\n      ApplicationLogLevel: !Ref L\nResources:\n  F:\n    Type: AWS::Serverless::Function\n    Properties:\n      CodeUri: functions/like/\n  A:\n    Type: AWS::Serverless::HttpApi\n    Properties:\n      AccessLogSettings:\n        Format: '{\"s\":\"$context.status\"}'\n",
    )
    .unwrap();
    assert_eq!(plain.memory_mb["like"], 512.0);
    assert_eq!(plain.log_level, "DEBUG");
    assert!(!plain.tracing);
    assert_eq!(plain.access_log_bytes(), r#"{"s":"200"}"#.len() as u64 + 1);
}

#[test]
fn a_batch_is_shared_by_the_operations_of_its_records() {
    // 2 batches of 500 records over 1,000 likes, 10 ms billed each, at
    // 0.25 GB: 0.002 invocations and 0.000005 GB-s a like.
    let u = function_usage(&invoked(2, 20.0, 1000, 0), 0.25, true, 1000.0);
    assert!(close(u.invocations, 0.002));
    assert!(close(u.gb_seconds, 0.020 * 0.25 / 1000.0));
    assert!(close(u.traces, 0.002 * XRAY_SAMPLED));
    // DynamoDB stream records are not Kinesis records.
    assert_eq!(u.kinesis_records, 0.0);
    assert!(close(
        u.lambda_log_bytes,
        2.0 * (300.0 + 700.0 + PLATFORM_BYTES) / 1000.0
    ));
    // Kinesis: 100 records of 1,100 bytes are 2 KB each on demand, one
    // PUT payload unit each; over 1,000 views.
    let v = function_usage(&invoked(1, 5.0, 100, 110_000), 0.25, false, 1000.0);
    assert!(close(v.kinesis_records, 0.1));
    assert!(close(v.kinesis_kb, 0.2));
    assert!(close(v.put_units, 0.1));
    assert_eq!(v.traces, 0.0);
}

#[test]
fn each_line_is_its_quantity_times_its_price() {
    let p = Prices::of("us-east-1").unwrap();
    let u = Usage {
        api_requests: 1.0,
        invocations: 1.5,
        gb_seconds: 0.25 * 0.003,
        wru: 4.0,
        rru: 2.0,
        lambda_log_bytes: 1024.0,
        ..Usage::default()
    };
    let l = lines(&u, &p, true);
    let get = |item| l.iter().find(|x| x.item == item).unwrap();
    assert!(close(get(Item::HttpApiMillion).dollars, 1.00));
    assert!(close(get(Item::LambdaMillion).dollars, 0.30));
    assert!(close(get(Item::LambdaArmGbSecond).quantity, 750.0));
    assert!(close(
        get(Item::LambdaArmGbSecond).dollars,
        750.0 * 0.000_013_333_4
    ));
    assert!(close(get(Item::WruMillion).dollars, 2.5));
    assert!(close(get(Item::RruMillion).dollars, 0.25));
    // A KB a like is a million KB, 0.000954 GB... × $0.50.
    let logs = get(Item::LambdaLogsGb);
    assert!(close(logs.quantity, 1e6 * 1024.0 / GB));
    assert!(close(logs.dollars, logs.quantity * 0.5));
    for x in &l {
        assert!(close(x.dollars, x.quantity * p.get(x.item)), "{x:?}");
    }
    // The total adds what is in it, and leaves the other stream mode out.
    let k = Usage {
        kinesis_records: 1.0,
        kinesis_kb: 1.0,
        put_units: 1.0,
        ..Usage::default()
    };
    let od = lines(&k, &p, true);
    let prov = lines(&k, &p, false);
    let gb = 1e6 * 1024.0 / GB;
    assert!(close(total(&od), gb * (0.08 + 0.04)));
    // One record a view: a million records, 277.8 shard-hours at 1,000 a
    // second, and a million PUT payload units.
    assert!(close(total(&prov), 1e6 / 3.6e6 * 0.015 + 0.014));
    assert!(close(total(&l), l.iter().map(|x| x.dollars).sum::<f64>()));
}

#[test]
fn regions_have_every_price_and_unknown_ones_are_refused() {
    for region in ["us-east-1", "eu-west-1"] {
        let p = Prices::of(region).unwrap();
        assert_eq!(p.all().len(), 14, "{region}");
        assert!(p.all().iter().all(|r| r.dollars > 0.0));
    }
    let e = Prices::of("mars-1").unwrap_err().to_string();
    assert!(e.contains("us-east-1, eu-west-1"), "{e}");
    // Unconfirmed prices say so.
    let eu = Prices::of("eu-west-1").unwrap();
    assert!(eu.all().iter().all(|r| !r.note.is_empty()));
}

#[test]
fn a_shape_sums_its_operations_and_the_feed_adds_its_reads() {
    let f = facts();
    let mut like = cell(Mode::Transactional, Op::Like, Spread::Breadth);
    like.request_invoked
        .insert("like".into(), invoked(1000, 3000.0, 0, 0));
    let mut read = cell(Mode::Transactional, Op::Read, Spread::Breadth);
    read.request_invoked
        .insert("read".into(), invoked(1000, 2000.0, 0, 0));
    let cells = vec![like.clone(), read];
    let tail = Shape::LongTail
        .like(&cells, Mode::Transactional, &f)
        .unwrap()
        .unwrap();
    let feed = Shape::FeedHeavy
        .like(&cells, Mode::Transactional, &f)
        .unwrap()
        .unwrap();
    // One request and one invocation a like; 21 with 20 reads.
    assert!(close(tail.api_requests, 1.0));
    assert!(close(tail.invocations, 1.0));
    assert!(close(feed.api_requests, 21.0));
    assert!(close(feed.invocations, 21.0));
    assert!(close(tail.gb_seconds, 0.003 * 0.25));
    assert!(close(feed.gb_seconds, 0.003 * 0.25 + 20.0 * 0.002 * 0.25));
    assert!(close(feed.wru, tail.wru * 21.0));
    // Cells not measured: no column.
    assert!(
        Shape::Viral
            .like(&cells, Mode::Transactional, &f)
            .unwrap()
            .is_none()
    );
    assert!(Shape::Viral.view(&cells, &f).unwrap().is_none());
    // The section renders every shape, the price table and the log line.
    let p = Prices::of("us-east-1").unwrap();
    let s = render::section(&cells, &f, &p).unwrap();
    assert!(s.starts_with("\n## The whole bill\n"), "{s}");
    for h in ["### One viral reel", "### Long tail", "### Feed-heavy"] {
        assert!(s.contains(h), "{h}");
    }
    assert!(s.contains("| HTTP API requests | 1.00 | — | — |"), "{s}");
    assert!(s.contains("| HTTP API requests | 21.00 | — | — |"), "{s}");
    assert!(
        s.contains("**Log bytes per request, a like at the default level (measured):** 1000 bytes")
    );
    assert!(s.contains("<https://aws.amazon.com/lambda/pricing/>"));
    assert_eq!(render::money(0.00012), "0.0001");
    assert_eq!(render::money(0.5), "0.500");
    assert_eq!(render::money(12.345), "12.35");
}
