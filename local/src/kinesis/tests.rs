//! The event source against a real kinesis-mock: one emulator for the
//! whole test binary (it takes seconds to start), a stream of its own per
//! test. Without Node.js the tests are skipped with a message, except
//! under `CI=true`, where a missing emulator is a failure.

use super::emulator::package_dir;
use super::*;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use std::cmp::Ordering as Cmp;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shared emulator's endpoint; `None`: skip (no Node.js, not in CI).
fn emulator() -> Option<String> {
    static ENDPOINT: OnceLock<Option<String>> = OnceLock::new();
    ENDPOINT
        .get_or_init(|| {
            if skip_without_node() {
                return None;
            }
            let dir = package_dir(|k| std::env::var(k).ok()).expect("installing kinesis-mock");
            let (tx, rx) = std::sync::mpsc::channel();
            // The emulator lives on a runtime of its own, as long as the
            // test binary: each test's runtime ends with the test.
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                rt.block_on(async move {
                    let started = Instant::now();
                    let e = KinesisEmulator::start(&dir)
                        .await
                        .expect("starting kinesis-mock");
                    eprintln!(
                        "kinesis-mock ready on {} in {:?}",
                        e.endpoint,
                        started.elapsed()
                    );
                    let _ = tx.send(e.endpoint.clone());
                    futures::future::pending::<()>().await;
                    drop(e);
                });
            });
            Some(rx.recv().expect("the emulator's endpoint"))
        })
        .clone()
}

/// A stream of `shards` shards, with a name no other test uses.
async fn stream(endpoint: &str, name: &str, shards: u32) -> (Client, String) {
    let client = kinesis_client(endpoint);
    let name = format!("{name}-{}", fastrand::u32(..));
    create_stream(&client, &name, shards).await.unwrap();
    (client, name)
}

/// Puts `n` records with payloads `"{tag}-{i}"` and varied partition keys.
async fn put(client: &Client, stream: &str, tag: &str, n: usize) {
    let entries: Vec<PutRecordsRequestEntry> = (0..n)
        .map(|i| {
            PutRecordsRequestEntry::builder()
                .data(Blob::new(format!("{tag}-{i}")))
                .partition_key(format!("reel-{}", i % 97))
                .build()
                .unwrap()
        })
        .collect();
    for chunk in entries.chunks(500) {
        let out = client
            .put_records()
            .stream_name(stream)
            .set_records(Some(chunk.to_vec()))
            .send()
            .await
            .unwrap();
        assert_eq!(out.failed_record_count(), Some(0));
    }
}

/// One invocation as the recording handler saw it: (shard, sequence,
/// data) per record.
type Seen = Vec<(String, String, String)>;

/// A handler that records every event, and answers with `answer` (given
/// the invocation's number, from 0, and its records).
fn recording(
    answer: impl Fn(usize, &Seen) -> anyhow::Result<Value> + Send + Sync + 'static,
) -> (Handler, Arc<Mutex<Vec<Seen>>>) {
    let log: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let (l, answer) = (log.clone(), Arc::new(answer));
    let handler: Handler = Arc::new(move |event: Value| {
        let seen: Seen = event["Records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let id = r["eventID"].as_str().unwrap();
                let seq = r["kinesis"]["sequenceNumber"].as_str().unwrap();
                assert_eq!(id.split_once(':').unwrap().1, seq, "eventID is shard:seq");
                let data = base64::Engine::decode(
                    &base64::engine::general_purpose::STANDARD,
                    r["kinesis"]["data"].as_str().unwrap(),
                )
                .unwrap();
                let shard = id.split_once(':').unwrap().0.to_owned();
                (shard, seq.to_owned(), String::from_utf8(data).unwrap())
            })
            .collect();
        let mut log = l.lock().unwrap();
        let n = log.len();
        let a = answer(n, &seen);
        log.push(seen);
        Box::pin(async move { a })
    });
    (handler, log)
}

fn def(stream: &str, batch_size: u32) -> KinesisSourceDef {
    KinesisSourceDef {
        stream: stream.to_owned(),
        batch_size,
        batching_window: Duration::from_millis(100),
        ..KinesisSourceDef::default()
    }
}

/// Waits until the source has handed over `n` records for good.
async fn wait_done(source: &KinesisSource, client: &Client, n: u64) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let read = KinesisSourceStats::get(&source.stats.read);
        if read >= n && source.drained(client).await.unwrap() {
            return;
        }
        assert!(Instant::now() < until, "not drained: {:?}", source.stats);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ok() -> anyhow::Result<Value> {
    Ok(serde_json::json!({ "batchItemFailures": [] }))
}

fn sorted(seqs: &[&str]) -> bool {
    seqs.windows(2)
        .all(|w| compare_sequences(w[0], w[1]) == Some(Cmp::Less))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_once_and_in_order_per_shard() {
    let Some(endpoint) = emulator() else { return };
    let (client, name) = stream(&endpoint, "once", 4).await;
    let started = Instant::now();
    put(&client, &name, "v", 2000).await;
    eprintln!("2,000 records put in {:?}", started.elapsed());
    let (handler, log) = recording(|_, _| ok());
    let (stop, stopped) = watch::channel(false);
    let source = KinesisSource::spawn(
        client.clone(),
        def(&name, 250),
        KinesisSettings::default(),
        handler,
        stopped,
    );
    wait_done(&source, &client, 2000).await;
    eprintln!("2,000 records delivered in {:?}", started.elapsed());
    let log = log.lock().unwrap().clone();
    let all: Vec<&(String, String, String)> = log.iter().flatten().collect();
    assert_eq!(all.len(), 2000, "each record once");
    let mut data: Vec<&str> = all.iter().map(|r| r.2.as_str()).collect();
    data.sort_unstable();
    data.dedup();
    assert_eq!(data.len(), 2000, "every record");
    let shards: std::collections::BTreeSet<&str> = all.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(shards.len(), 4, "{shards:?}");
    for shard in shards {
        let seqs: Vec<&str> = all
            .iter()
            .filter(|r| r.0 == shard)
            .map(|r| r.1.as_str())
            .collect();
        assert!(sorted(&seqs), "{shard} in order");
    }
    assert!(log.iter().all(|b| !b.is_empty() && b.len() <= 250));
    let stats = &source.stats;
    assert_eq!(KinesisSourceStats::get(&stats.delivered), 2000);
    assert_eq!(KinesisSourceStats::get(&stats.retries), 0);
    assert_eq!(stats.done.lock().unwrap().len(), 4);
    let _ = stop.send(true);
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_failure_delivers_the_tail_again() {
    let Some(endpoint) = emulator() else { return };
    let (client, name) = stream(&endpoint, "tail", 1).await;
    put(&client, &name, "t", 20).await;
    // The first invocation fails its 6th record: from there on, again.
    let (handler, log) = recording(|n, seen| {
        Ok(match n {
            0 => serde_json::json!({ "batchItemFailures": [{ "itemIdentifier": seen[5].1 }] }),
            _ => serde_json::json!({}),
        })
    });
    let (stop, stopped) = watch::channel(false);
    let source = KinesisSource::spawn(
        client.clone(),
        def(&name, 100),
        KinesisSettings::default(),
        handler,
        stopped,
    );
    wait_done(&source, &client, 20).await;
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0].len(), 20);
    assert_eq!(log[1], log[0][5..], "the tail, from the failed record on");
    assert_eq!(KinesisSourceStats::get(&source.stats.partial), 1);
    assert_eq!(KinesisSourceStats::get(&source.stats.retries), 1);
    let _ = stop.send(true);
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_error_delivers_the_batch_again_then_on_failure() {
    let Some(endpoint) = emulator() else { return };
    let (client, name) = stream(&endpoint, "error", 1).await;
    put(&client, &name, "e", 10).await;
    let (handler, log) = recording(|n, _| match n {
        0 => Err(anyhow::anyhow!("a function error")),
        _ => ok(),
    });
    let (stop, stopped) = watch::channel(false);
    let source = KinesisSource::spawn(
        client.clone(),
        def(&name, 100),
        KinesisSettings::default(),
        handler,
        stopped,
    );
    wait_done(&source, &client, 10).await;
    {
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(log[0], log[1], "the same batch, whole, again");
    }
    let _ = stop.send(true);
    source.stop().await;

    // A function that always fails: after MaximumRetryAttempts the batch
    // goes to OnFailure and the shard moves on to what follows.
    let (client, name) = stream(&endpoint, "onfailure", 1).await;
    put(&client, &name, "a", 5).await;
    let (handler, log) = recording(|_, seen| {
        if seen.iter().any(|r| r.2.starts_with("a-")) {
            Err(anyhow::anyhow!("always"))
        } else {
            ok()
        }
    });
    let (stop, stopped) = watch::channel(false);
    let retried = KinesisSourceDef {
        max_retries: 2,
        ..def(&name, 100)
    };
    let source = KinesisSource::spawn(
        client.clone(),
        retried,
        KinesisSettings::default(),
        handler,
        stopped,
    );
    wait_done(&source, &client, 5).await;
    put(&client, &name, "b", 5).await;
    wait_done(&source, &client, 10).await;
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 4, "three tries, then the next batch: {log:?}");
    assert!(log[3].iter().all(|r| r.2.starts_with("b-")));
    assert_eq!(KinesisSourceStats::get(&source.stats.discarded), 5);
    let _ = stop.send(true);
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_shards_children_come_after_its_parent() {
    let Some(endpoint) = emulator() else { return };
    let (client, name) = stream(&endpoint, "split", 1).await;
    put(&client, &name, "p", 300).await;
    // A slow function, so that the split lands while the parent is still
    // being delivered.
    let (handler, log) = recording(|_, _| {
        std::thread::sleep(Duration::from_millis(30));
        ok()
    });
    let (stop, stopped) = watch::channel(false);
    let source = KinesisSource::spawn(
        client.clone(),
        def(&name, 20),
        KinesisSettings::default(),
        handler,
        stopped,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let parent = mapping::list_shards(&client, &name).await.unwrap()[0]
        .id
        .clone();
    // The middle of the hash key range: 2^127.
    client
        .split_shard()
        .stream_name(&name)
        .shard_to_split(&parent)
        .new_starting_hash_key("170141183460469231731687303715884105728")
        .send()
        .await
        .unwrap();
    // Until the split is done: the parent closed, both children listed.
    let until = Instant::now() + Duration::from_secs(30);
    while mapping::list_shards(&client, &name).await.unwrap().len() < 3 {
        assert!(Instant::now() < until, "the split never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    create_stream(&client, &name, 1).await.unwrap(); // waits for ACTIVE
    put(&client, &name, "c", 300).await;
    wait_done(&source, &client, 600).await;
    let log = log.lock().unwrap().clone();
    let all: Vec<&(String, String, String)> = log.iter().flatten().collect();
    assert_eq!(all.len(), 600);
    let last_parent = all.iter().rposition(|r| r.0 == parent).unwrap();
    let first_child = all.iter().position(|r| r.0 != parent).unwrap();
    assert!(last_parent < first_child, "{last_parent} {first_child}");
    assert!(all[..=last_parent].iter().all(|r| r.2.starts_with("p-")));
    assert!(all[first_child..].iter().all(|r| r.2.starts_with("c-")));
    let shards = source.stats.shards.lock().unwrap().clone();
    assert_eq!(shards.len(), 3, "{shards:?}");
    assert!(
        shards[1..]
            .iter()
            .all(|(_, p)| p == std::slice::from_ref(&parent))
    );
    assert!(source.stats.finished.lock().unwrap().contains(&parent));
    let _ = stop.send(true);
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merged_shards_child_comes_after_both_parents() {
    let Some(endpoint) = emulator() else { return };
    let (client, name) = stream(&endpoint, "merge", 2).await;
    let mut listed: Vec<String> = mapping::list_shards(&client, &name)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    listed.sort();
    let (first, second) = (listed[0].clone(), listed[1].clone());
    put(&client, &name, "p", 300).await;
    // The adjacent parent is delivered slowly, so that the merge's child
    // appears while it still is. Before: the child knew (and waited for)
    // its first parent only (the last assertion failed).
    let slow = second.clone();
    let (handler, log) = recording(move |_, seen| {
        let ms = if seen.iter().any(|r| r.0 == slow) {
            40
        } else {
            5
        };
        std::thread::sleep(Duration::from_millis(ms));
        ok()
    });
    let (stop, stopped) = watch::channel(false);
    let source = KinesisSource::spawn(
        client.clone(),
        def(&name, 10),
        KinesisSettings::default(),
        handler,
        stopped,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    client
        .merge_shards()
        .stream_name(&name)
        .shard_to_merge(&first)
        .adjacent_shard_to_merge(&second)
        .send()
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while mapping::list_shards(&client, &name).await.unwrap().len() < 3 {
        assert!(Instant::now() < until, "the merge never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    create_stream(&client, &name, 2).await.unwrap(); // waits for ACTIVE
    put(&client, &name, "c", 100).await;
    wait_done(&source, &client, 400).await;
    let log = log.lock().unwrap().clone();
    let all: Vec<&(String, String, String)> = log.iter().flatten().collect();
    assert_eq!(all.len(), 400);
    let parents = [first.as_str(), second.as_str()];
    let first_child = all
        .iter()
        .position(|r| !parents.contains(&r.0.as_str()))
        .unwrap();
    for p in parents {
        let last = all.iter().rposition(|r| r.0 == p).unwrap();
        assert!(last < first_child, "{p}: {last} >= {first_child}");
    }
    assert!(all[first_child..].iter().all(|r| r.2.starts_with("c-")));
    let shards = source.stats.shards.lock().unwrap().clone();
    let child = shards
        .iter()
        .find(|(id, _)| !parents.contains(&id.as_str()))
        .unwrap();
    assert_eq!(child.1, [first.clone(), second.clone()], "{shards:?}");
    let _ = stop.send(true);
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reorder_and_duplicate_faults_change_the_batches() {
    let Some(endpoint) = emulator() else { return };
    let (client, name) = stream(&endpoint, "faults", 1).await;
    put(&client, &name, "f", 30).await;
    // Each first try fails, so that every batch is handed over again.
    let (handler, log) = recording(|n, _| {
        if n % 2 == 0 {
            Err(anyhow::anyhow!("first try"))
        } else {
            ok()
        }
    });
    let settings = KinesisSettings::from_lookup(|k| {
        (k == "LOCAL_VIEWS_FAULTS").then(|| "seed=5,reorder=1,duplicate=1".to_owned())
    })
    .unwrap();
    let (stop, stopped) = watch::channel(false);
    let source = KinesisSource::spawn(client.clone(), def(&name, 10), settings, handler, stopped);
    wait_done(&source, &client, 30).await;
    let log = log.lock().unwrap().clone();
    // A batch's records in the order they first appear in it (a
    // duplicate comes after its original).
    let firsts = |b: &Seen| {
        let mut seen: Vec<&str> = Vec::new();
        for r in b {
            if !seen.contains(&r.1.as_str()) {
                seen.push(&r.1);
            }
        }
        seen.into_iter().map(str::to_owned).collect::<Vec<String>>()
    };
    let reordered = log.iter().filter(|b| {
        let f = firsts(b);
        !sorted(&f.iter().map(String::as_str).collect::<Vec<_>>())
    });
    assert!(reordered.count() >= 1, "{log:?}");
    let duplicated = log.iter().filter(|b| {
        let mut s: Vec<&str> = b.iter().map(|r| r.1.as_str()).collect();
        s.sort_unstable();
        s.windows(2).any(|w| w[0] == w[1])
    });
    assert_eq!(duplicated.count(), log.len(), "duplicate=1: every batch");
    // Each batch's first try (in order: "Records are always processed in
    // order the first time") is in order, apart from its duplicate.
    assert!(KinesisSourceStats::get(&source.stats.reordered) >= 3);
    let _ = stop.send(true);
    source.stop().await;
}

#[test]
fn faults_come_from_either_variable() {
    let views = KinesisSettings::from_lookup(|k| {
        (k == "LOCAL_STREAM_FAULTS").then(|| "seed=3,reorder=0.5".to_owned())
    })
    .unwrap();
    assert_eq!(
        views.faults,
        SourceFaults::parse("seed=3,reorder=0.5").unwrap()
    );
    assert!(KinesisSettings::from_lookup(|_| Some("drop=1".to_owned())).is_err());
    assert_eq!(
        KinesisSettings::from_lookup(|_| None).unwrap(),
        KinesisSettings::default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliver_lost_and_late_commit_still_hand_every_record_over() {
    let Some(endpoint) = emulator() else { return };
    let (client, name) = stream(&endpoint, "atleast", 2).await;
    put(&client, &name, "r", 200).await;
    let (handler, log) = recording(|_, _| ok());
    let settings = KinesisSettings::from_lookup(|k| {
        (k == "LOCAL_VIEWS_FAULTS")
            .then(|| "seed=11,redeliver=0.3,lost=0.3,late_commit=0.2".to_owned())
    })
    .unwrap();
    let (stop, stopped) = watch::channel(false);
    let source = KinesisSource::spawn(client.clone(), def(&name, 25), settings, handler, stopped);
    wait_done(&source, &client, 200).await;
    let stats = &source.stats;
    for (what, counter) in [
        ("redelivered", &stats.redelivered),
        ("lost", &stats.lost),
        ("late_commits", &stats.late_commits),
    ] {
        assert!(KinesisSourceStats::get(counter) > 0, "{what}: {stats:?}");
    }
    assert_eq!(KinesisSourceStats::get(&stats.discarded), 0);
    // At least once: every record reached the function (a late commit's
    // invocation may still be running; its record was handed over again).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = log.lock().unwrap().clone();
    let mut data: Vec<&str> = log.iter().flatten().map(|r| r.2.as_str()).collect();
    assert!(data.len() > 200, "some records came more than once");
    data.sort_unstable();
    data.dedup();
    assert_eq!(data.len(), 200);
    let _ = stop.send(true);
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_past_their_maximum_age_go_to_on_failure() {
    let Some(endpoint) = emulator() else { return };
    let (client, name) = stream(&endpoint, "aged", 1).await;
    put(&client, &name, "old", 5).await;
    // Retried forever (-1), but only for a second of the records' age.
    let (handler, log) = recording(|_, _| Err(anyhow::anyhow!("always")));
    let aging = KinesisSourceDef {
        max_record_age: Some(Duration::from_secs(1)),
        ..def(&name, 100)
    };
    let (stop, stopped) = watch::channel(false);
    let source = KinesisSource::spawn(
        client.clone(),
        aging,
        KinesisSettings::default(),
        handler,
        stopped,
    );
    wait_done(&source, &client, 5).await;
    assert_eq!(KinesisSourceStats::get(&source.stats.discarded), 5);
    assert!(log.lock().unwrap().len() >= 2, "retried until too old");
    let _ = stop.send(true);
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_batch_goes_to_on_failure_with_lambdas_invocation_record() {
    let Some(endpoint) = emulator() else { return };
    let (client, name) = stream(&endpoint, "expire", 1).await;
    put(&client, &name, "x", 30).await;
    let (handler, log) = recording(|_, _| ok());
    let settings = KinesisSettings::from_lookup(|k| {
        (k == "LOCAL_VIEWS_FAULTS").then(|| "seed=1,expire=1".to_owned())
    })
    .unwrap();
    let (stop, stopped) = watch::channel(false);
    let source = KinesisSource::spawn(client.clone(), def(&name, 10), settings, handler, stopped);
    wait_done(&source, &client, 30).await;
    // Taken as too old before every hand-over: nothing reached the
    // function, everything went to OnFailure, one record per batch.
    assert!(log.lock().unwrap().is_empty());
    assert_eq!(KinesisSourceStats::get(&source.stats.discarded), 30);
    let records = source.stats.on_failure.lock().unwrap().clone();
    assert!(!records.is_empty());
    let mut named = 0;
    for r in &records {
        assert_eq!(r["requestContext"]["condition"], "RecordAgeExceeded");
        let info = &r["KinesisBatchInfo"];
        assert!(info["streamArn"].as_str().unwrap().ends_with(&name), "{r}");
        let (start, end) = (
            info["startSequenceNumber"].as_str().unwrap(),
            info["endSequenceNumber"].as_str().unwrap(),
        );
        assert_ne!(compare_sequences(start, end), Some(Cmp::Greater), "{r}");
        assert!(
            info["approximateArrivalOfFirstRecord"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
        named += info["batchSize"].as_u64().unwrap();
    }
    assert_eq!(named, 30);
    let _ = stop.send(true);
    source.stop().await;
}
