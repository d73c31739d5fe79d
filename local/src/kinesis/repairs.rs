//! The OnFailure queue of the views event source as an SQS event source of
//! the same function, as the template makes it (`ViewsOnFailureQueue`, the
//! `SQS` event of `ViewAggregateFunction`): the invocation records the
//! source gives up ([`KinesisSourceStats::on_failure`]) are the queue's
//! messages, delivered to the function as Lambda's SQS events:
//!
//! * up to `BatchSize` visible messages an event, up to
//!   `ScalingConfig.MaximumConcurrency` events at once;
//! * a message delivered is invisible for the queue's `VisibilityTimeout`
//!   (`LOCAL_VIEWS_REPAIR_VISIBILITY_SECS` scales it down for tests);
//! * the answer's `batchItemFailures` (`ReportBatchItemFailures`) name the
//!   messages to deliver again once visible; the others are deleted. A
//!   function error, or an identifier that is no message of the event (an
//!   empty one included), fails the event whole;
//! * a message about to be received more than the `RedrivePolicy`'s
//!   `maxReceiveCount` times goes to the dead-letter queue instead
//!   ([`KinesisSourceStats::dead_letters`]).
//!
//! A loop of its own beside the shards' readers: the messages are the
//! source's, its deliveries are not tied to any shard.

use super::event::{ACCOUNT, REGION};
use super::{Handler, KinesisSourceStats};
use crate::template::QueueSourceDef;
use futures::future::join_all;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often the queue is looked at for messages newly given up or
/// visible again: Lambda's pollers long-poll, so a message waits little.
const POLL: Duration = Duration::from_millis(100);

/// One message of the queue.
struct Message {
    id: String,
    body: String,
    sent_ms: i64,
    /// Deliveries so far (SQS's `ApproximateReceiveCount`).
    receives: u32,
    /// When it may be delivered (again).
    visible_at: Instant,
}

/// The queue and its event source, running until `stopped`: takes the
/// records given up from `stats`, hands them to `handler` with `def`'s
/// rules, and its visibility timeout `visibility`.
pub(super) async fn run(
    def: QueueSourceDef,
    visibility: Duration,
    handler: Handler,
    stats: Arc<KinesisSourceStats>,
    mut stopped: watch::Receiver<bool>,
) {
    let arn = format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{}", def.queue);
    let mut queue: Vec<Message> = Vec::new();
    // The records of `stats.on_failure` already taken in.
    let mut taken = 0;
    loop {
        if *stopped.borrow() {
            return;
        }
        if let Ok(all) = stats.on_failure.lock() {
            for r in &all[taken.min(all.len())..] {
                queue.push(Message {
                    id: format!("local-{:016x}", fastrand::u64(..)),
                    body: r.to_string(),
                    sent_ms: now_ms(),
                    receives: 0,
                    visible_at: Instant::now(),
                });
            }
            taken = all.len();
        }
        let events = receive(&def, visibility, &mut queue, &stats);
        if events.is_empty() {
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(POLL) => {}
            }
            continue;
        }
        let answers = join_all(events.iter().map(|ids| {
            stats.repair_invocations.fetch_add(1, Ordering::Relaxed);
            handler(event(&arn, &queue, ids))
        }))
        .await;
        for (ids, answer) in events.iter().zip(answers) {
            let again = again(&def, ids, answer);
            stats
                .repair_retries
                .fetch_add(again.len() as u64, Ordering::Relaxed);
            let before = queue.len();
            queue.retain(|m| !ids.contains(&m.id) || again.contains(&m.id));
            stats
                .repaired
                .fetch_add((before - queue.len()) as u64, Ordering::Relaxed);
        }
    }
}

/// The events to deliver now: the visible messages, oldest first, in
/// batches; each made invisible for `visibility`. A message past its
/// receives goes to the dead letters instead.
fn receive(
    def: &QueueSourceDef,
    visibility: Duration,
    queue: &mut Vec<Message>,
    stats: &KinesisSourceStats,
) -> Vec<Vec<String>> {
    let now = Instant::now();
    let (dead, kept): (Vec<Message>, Vec<Message>) =
        std::mem::take(queue).into_iter().partition(|m| {
            m.visible_at <= now && def.max_receives.is_some_and(|max| m.receives >= max)
        });
    *queue = kept;
    if !dead.is_empty() {
        tracing::error!(
            messages = dead.len(),
            "views repairs out of receives: moved to the dead-letter queue"
        );
        if let Ok(mut letters) = stats.dead_letters.lock() {
            letters.extend(
                dead.iter()
                    .map(|m| serde_json::from_str(&m.body).unwrap_or(Value::Null)),
            );
        }
    }
    let mut events: Vec<Vec<String>> = Vec::new();
    for m in queue.iter_mut().filter(|m| m.visible_at <= now) {
        if events
            .last()
            .is_none_or(|e| e.len() >= def.batch_size as usize)
        {
            if events.len() >= def.max_concurrency as usize {
                break;
            }
            events.push(Vec::new());
        }
        m.receives += 1;
        m.visible_at = now + visibility;
        if let Some(e) = events.last_mut() {
            e.push(m.id.clone());
        }
    }
    events
}

/// Lambda's SQS event of the messages `ids` of `queue` (on `arn`).
fn event(arn: &str, queue: &[Message], ids: &[String]) -> Value {
    let records: Vec<Value> = ids
        .iter()
        .filter_map(|id| queue.iter().find(|m| &m.id == id))
        .map(|m| {
            json!({
                "messageId": m.id,
                "receiptHandle": format!("local-{}-{}", m.id, m.receives),
                "body": m.body,
                "attributes": {
                    "ApproximateReceiveCount": m.receives.to_string(),
                    "SentTimestamp": m.sent_ms.to_string(),
                    "SenderId": ACCOUNT,
                    "ApproximateFirstReceiveTimestamp": m.sent_ms.to_string(),
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": arn,
                "awsRegion": REGION,
            })
        })
        .collect();
    json!({ "Records": records })
}

/// The messages of an event (`ids`) to deliver again, by the function's
/// `answer`: all of them after a function error, an identifier that is
/// none of theirs, or (without `ReportBatchItemFailures`) any answer but
/// success; else those its `batchItemFailures` name.
fn again(def: &QueueSourceDef, ids: &[String], answer: anyhow::Result<Value>) -> HashSet<String> {
    let all = || ids.iter().cloned().collect();
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "views repair invocation failed; its messages are delivered again");
            return all();
        }
    };
    if !def.report_failures {
        return HashSet::new();
    }
    let mut out = HashSet::new();
    for f in answer["batchItemFailures"].as_array().into_iter().flatten() {
        match f["itemIdentifier"].as_str() {
            Some(id) if ids.iter().any(|i| i == id) => {
                out.insert(id.to_owned());
            }
            _ => {
                tracing::warn!(failure = %f, "a batchItemFailures entry names no message of the event: all delivered again");
                return all();
            }
        }
    }
    out
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn def(batch_size: u32, max_receives: Option<u32>) -> QueueSourceDef {
        QueueSourceDef {
            queue: "ViewsOnFailureQueue".into(),
            batch_size,
            max_concurrency: 2,
            report_failures: true,
            visibility: Duration::from_secs(360),
            max_receives,
        }
    }

    /// Issue 35: the queue delivers given-up records as SQS events,
    /// again after the visibility timeout while the function names them
    /// in `batchItemFailures`, and moves a message past its receives to the
    /// dead letters. The function here fails the record of shard "b"
    /// always, and "a"'s the first two times.
    #[tokio::test]
    async fn messages_come_back_until_done_or_out_of_receives() {
        let stats = Arc::new(KinesisSourceStats::default());
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let log = seen.clone();
        let handler: Handler = Arc::new(move |event: Value| {
            let log = log.clone();
            Box::pin(async move {
                let mut failed = Vec::new();
                for r in event["Records"].as_array().unwrap() {
                    assert_eq!(r["eventSource"], "aws:sqs");
                    let body: Value = serde_json::from_str(r["body"].as_str().unwrap())?;
                    let shard = body["shard"].as_str().unwrap().to_owned();
                    let count = r["attributes"]["ApproximateReceiveCount"]
                        .as_str()
                        .unwrap()
                        .to_owned();
                    log.lock().unwrap().push((shard.clone(), count.clone()));
                    if shard == "b" || count != "3" {
                        failed.push(json!({"itemIdentifier": r["messageId"]}));
                    }
                }
                Ok(json!({ "batchItemFailures": failed }))
            })
        });
        for shard in ["a", "b"] {
            stats
                .on_failure
                .lock()
                .unwrap()
                .push(json!({ "shard": shard }));
        }
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(
            def(1, Some(4)),
            Duration::from_millis(50),
            handler,
            stats.clone(),
            stopped,
        ));
        let until = Instant::now() + Duration::from_secs(10);
        while stats.dead_letters.lock().unwrap().is_empty() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.send(true).unwrap();
        task.await.unwrap();
        let seen = seen.lock().unwrap().clone();
        let of = |s: &str| -> Vec<String> {
            seen.iter()
                .filter(|(x, _)| x == s)
                .map(|(_, c)| c.clone())
                .collect()
        };
        assert_eq!(of("a"), ["1", "2", "3"], "done on its third delivery");
        assert_eq!(of("b"), ["1", "2", "3", "4"], "maxReceiveCount 4");
        assert_eq!(
            *stats.dead_letters.lock().unwrap(),
            vec![json!({"shard": "b"})]
        );
        assert_eq!(KinesisSourceStats::get(&stats.repaired), 1);
        assert_eq!(KinesisSourceStats::get(&stats.repair_retries), 6);
        assert_eq!(KinesisSourceStats::get(&stats.repair_invocations), 7);
    }

    #[test]
    fn a_foreign_identifier_or_an_error_fails_the_event_whole() {
        let ids = vec!["m1".to_owned(), "m2".to_owned()];
        let d = def(10, None);
        let both: HashSet<String> = ids.iter().cloned().collect();
        assert_eq!(again(&d, &ids, Err(anyhow::anyhow!("boom"))), both);
        let answer = |failures: Value| Ok(json!({ "batchItemFailures": failures }));
        assert_eq!(
            again(&d, &ids, answer(json!([{"itemIdentifier": "m9"}]))),
            both
        );
        assert_eq!(
            again(&d, &ids, answer(json!([{"itemIdentifier": ""}]))),
            both
        );
        assert_eq!(
            again(&d, &ids, answer(json!([{"itemIdentifier": "m2"}]))),
            HashSet::from(["m2".to_owned()])
        );
        assert!(again(&d, &ids, answer(json!([]))).is_empty());
        assert!(again(&d, &ids, Ok(json!({"repair": {}}))).is_empty());
    }

    #[test]
    fn the_local_settings_switch_and_scale_the_queue() {
        use super::super::KinesisSettings;
        let with = |k: &'static str, v: &'static str| {
            KinesisSettings::from_lookup(move |n| (n == k).then(|| v.to_owned()))
        };
        let unset = KinesisSettings::from_lookup(|_| None).unwrap();
        assert!(!unset.hold_repairs);
        assert_eq!(unset.repair_visibility, None, "the template's");
        assert!(with("LOCAL_VIEWS_REPAIRS", "off").unwrap().hold_repairs);
        assert!(!with("LOCAL_VIEWS_REPAIRS", "on").unwrap().hold_repairs);
        assert!(with("LOCAL_VIEWS_REPAIRS", "maybe").is_err());
        assert_eq!(
            with("LOCAL_VIEWS_REPAIR_VISIBILITY_SECS", "0.5")
                .unwrap()
                .repair_visibility,
            Some(Duration::from_millis(500))
        );
        for bad in ["-1", "x", "50000"] {
            assert!(
                with("LOCAL_VIEWS_REPAIR_VISIBILITY_SECS", bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn batches_hold_up_to_batch_size_and_concurrency_events() {
        let stats = KinesisSourceStats::default();
        let mut queue: Vec<Message> = (0..7)
            .map(|i| Message {
                id: format!("m{i}"),
                body: "{}".into(),
                sent_ms: 0,
                receives: 0,
                visible_at: Instant::now(),
            })
            .collect();
        let events = receive(&def(3, None), Duration::from_secs(60), &mut queue, &stats);
        assert_eq!(events, vec![vec!["m0", "m1", "m2"], vec!["m3", "m4", "m5"]]);
        // In flight: invisible until the timeout; m6 waits its turn.
        let next = receive(&def(3, None), Duration::from_secs(60), &mut queue, &stats);
        assert_eq!(next, vec![vec!["m6"]]);
        assert!(receive(&def(3, None), Duration::from_secs(60), &mut queue, &stats).is_empty());
    }
}
