//! An automatic grow whose settings write lands long after it was computed:
//! on Lambda the sandbox is frozen after the response,
//! so the background task that starts a grow may send its `PutItem`
//! seconds or minutes late. No such delay may shorten the resize wait:
//! `write_shards` rises only a full wait after the `growing` settings
//! became visible, whoever takes the steps.
//!
//! Through the real store against embedded dynoxide, wrapped in a store
//! whose first `growing` put is held back far past the wait, and whose
//! later puts either go through (the task resumes and finishes) or never
//! return (the sandbox stays frozen, or is gone, right after the put).

mod common;

use common::TestStack;
use likes::error::Error;
use likes::keys::{Action, ReelId, UserId};
use likes::reshard::{self, Progress, Resharder};
use likes::store::dynamodb::DynamoStore;
use likes::store::{
    CountItem, CounterStore, FoldResult, KeyRecord, KeyRecordSpec, LikeRow, LikeTx, Phase,
    ResizeStore, Settings, ShardSum, ShardValue, TxResult,
};
use likes::token::RequestToken;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Waits of about 2.1 s between steps (settings cached 100 ms, requests cut
/// at 1 s, DynamoDB calls at 1 s, no margin); nothing scheduled in the
/// background.
const FAST: &[(&str, &str)] = &[
    ("SETTINGS_TTL_MS", "100"),
    ("REQUEST_TIMEOUT_MS", "1000"),
    ("REQUEST_BUDGET_MS", "800"),
    ("RESIZE_MARGIN_MS", "0"),
    ("DDB_OPERATION_TIMEOUT_MS", "1000"),
    ("CACHE_TTL_MS", "0"),
    ("LOCAL_SCHEDULE_SECS", "0"),
    ("AUTO_RESHARD", "off"),
];

/// The settings puts a [`Delayed`] store passed on: when each was sent to
/// DynamoDB (after any hold-back), what it wrote, and whether it applied.
#[derive(Clone, Debug)]
struct Put {
    sent: Instant,
    next: Settings,
    applied: bool,
}

/// The real store; its first `growing` put waits `hold` before it is sent
/// (as a frozen sandbox would), and with `frozen_after` every later put of
/// this store never returns (the sandbox stays frozen after that put).
struct Delayed {
    inner: DynamoStore,
    hold: Duration,
    frozen_after: bool,
    held: Mutex<bool>,
    puts: Arc<Mutex<Vec<Put>>>,
}

impl CounterStore for Delayed {
    async fn settings(&self, reels: &[ReelId]) -> Result<HashMap<ReelId, Settings>, Error> {
        self.inner.settings(reels).await
    }
    async fn sum_shards(
        &self,
        reels: &[(ReelId, Settings)],
    ) -> Result<HashMap<ReelId, ShardSum>, Error> {
        self.inner.sum_shards(reels).await
    }
    async fn put_settings(&self, reel: &ReelId, v: u64, next: &Settings) -> Result<bool, Error> {
        let hold = {
            let mut held = self.held.lock().unwrap();
            if *held && self.frozen_after {
                None
            } else if !*held && next.phase == Phase::Growing {
                *held = true;
                Some(self.hold)
            } else {
                Some(Duration::ZERO)
            }
        };
        let Some(hold) = hold else {
            // Never resumed.
            return std::future::pending().await;
        };
        tokio::time::sleep(hold).await;
        let sent = Instant::now();
        let applied = self.inner.put_settings(reel, v, next).await?;
        self.puts.lock().unwrap().push(Put {
            sent,
            next: *next,
            applied,
        });
        Ok(applied)
    }
    async fn write_like(&self, tx: &LikeTx) -> Result<TxResult, Error> {
        self.inner.write_like(tx).await
    }
    async fn user_likes(
        &self,
        u: &UserId,
        limit: u32,
    ) -> Result<Vec<(ReelId, Option<i64>)>, Error> {
        self.inner.user_likes(u, limit).await
    }
    async fn like_row(&self, u: &UserId, r: &ReelId) -> Result<Option<LikeRow>, Error> {
        self.inner.like_row(u, r).await
    }
    async fn key_record(&self, t: &RequestToken) -> Result<Option<KeyRecord>, Error> {
        self.inner.key_record(t).await
    }
    async fn record_unchanged(&self, s: &KeyRecordSpec, a: Action) -> Result<KeyRecord, Error> {
        self.inner.record_unchanged(s, a).await
    }
    async fn count_items(
        &self,
        r: &ReelId,
        i: &[likes::store::CountItem],
    ) -> Result<Vec<(likes::store::CountItem, likes::store::ShardValue)>, Error> {
        self.inner.count_items(r, i).await
    }
    async fn add_caller_reads(&self, c: &str, m: i64, u: u64, e: i64) -> Result<u64, Error> {
        self.inner.add_caller_reads(c, m, u, e).await
    }
    async fn ping(&self) -> Result<(), Error> {
        self.inner.ping().await
    }
}

impl ResizeStore for Delayed {
    async fn shard(&self, reel: &ReelId, shard: u32) -> Result<Option<ShardValue>, Error> {
        self.inner.shard(reel, shard).await
    }
    async fn fold(
        &self,
        reel: &ReelId,
        shard: u32,
        seen: ShardValue,
        version: u64,
        attempt: u32,
    ) -> Result<FoldResult, Error> {
        self.inner.fold(reel, shard, seen, version, attempt).await
    }
    async fn reopen(
        &self,
        reel: &ReelId,
        shards: std::ops::Range<u32>,
        version: u64,
    ) -> Result<bool, Error> {
        self.inner.reopen(reel, shards, version).await
    }
    async fn clear_stray(
        &self,
        reel: &ReelId,
        item: CountItem,
        seen: ShardValue,
        version: u64,
    ) -> Result<FoldResult, Error> {
        self.inner.clear_stray(reel, item, seen, version).await
    }
    async fn indexed_reels(&self) -> Result<Vec<ReelId>, Error> {
        self.inner.indexed_reels().await
    }
}

/// Starts an automatic grow 1 → 4 the way the like and read paths do (a
/// background task running [`reshard::request_grow`]) through a store that
/// holds the `growing` put back for `hold`, while the scheduled run's
/// advancer (through the plain store, recording its own puts) tends the
/// reel every 20 ms; asserts that the put raising `write_shards` was sent a
/// full wait after the `growing` put was.
async fn grow_through_a_frozen_task(t: &TestStack, name: &str, frozen_after: bool) {
    let reel = ReelId::parse(name).unwrap();
    let config = &t.stack.config;
    let wait = Resharder::new(DynamoStore::new(t.stack.client.clone(), config), config).wait();
    let hold = wait * 2 + Duration::from_millis(500);
    let requester = Arc::new(Delayed {
        inner: DynamoStore::new(t.stack.client.clone(), config),
        hold,
        frozen_after,
        held: Mutex::new(false),
        puts: Arc::new(Mutex::new(Vec::new())),
    });
    let advancer_puts = Arc::new(Mutex::new(Vec::new()));
    let advancer = Resharder::new(
        Delayed {
            inner: DynamoStore::new(t.stack.client.clone(), config),
            hold: Duration::ZERO,
            frozen_after: false,
            // Nothing held back: only the puts are recorded.
            held: Mutex::new(true),
            puts: advancer_puts.clone(),
        },
        config,
    );
    let task = tokio::spawn({
        let (requester, reel) = (requester.clone(), reel.clone());
        async move { reshard::request_grow(&*requester, &reel, 4, "test").await }
    });
    let started = Instant::now();
    let raised = loop {
        match advancer.advance(&reel).await.expect("advance") {
            Progress::Stable(s) if s.write_shards == 4 => break s,
            Progress::Stable(_) | Progress::Waiting { .. } => {}
            Progress::Interrupted => unreachable!("no limit"),
        }
        assert!(
            started.elapsed() < hold + wait * 4 + Duration::from_secs(10),
            "{name}: the grow never completed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((raised.read_shards, raised.phase), (4, Phase::Stable));
    let growing = requester
        .puts
        .lock()
        .unwrap()
        .iter()
        .find(|p| p.next.phase == Phase::Growing && p.applied)
        .cloned()
        .expect("the held-back growing put applied");
    let raise = advancer_puts
        .lock()
        .unwrap()
        .iter()
        .find(|p| p.next.write_shards == 4 && p.applied)
        .cloned()
        .expect("the advancer raised write_shards");
    // The `growing` settings became visible no earlier than when its put
    // was sent; `write_shards` may rise only a full wait after that (5 ms
    // for the millisecond clock the phase is stamped with).
    assert!(
        raise.sent + Duration::from_millis(5) >= growing.sent + wait,
        "{name}: write_shards rose {:?} after the growing settings were sent, before the wait of {wait:?}",
        raise.sent.saturating_duration_since(growing.sent)
    );
    if frozen_after {
        task.abort();
    } else {
        assert!(
            task.await.unwrap().unwrap(),
            "{name}: the task started the grow"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_grow_write_never_shortens_the_wait() {
    let t = TestStack::start(FAST).await;
    // Both in parallel: each takes the hold-back plus a wait.
    tokio::join!(
        // The task resumes after the put and finishes its work.
        grow_through_a_frozen_task(&t, "resumes", false),
        // The sandbox never runs again after the put landed.
        grow_through_a_frozen_task(&t, "stays-frozen", true),
    );
    t.stop().await;
}
