//! The functions' entry points that are not HTTP requests: the `reshard`
//! function's event (an admin route's API Gateway request, or the
//! EventBridge schedule), the `reconcile` function's event and the
//! `aggregate` function's stream batch (stream mode), and the
//! `aggregate-views` function's (a views-log batch, a given-up range, or
//! the OnFailure queue's messages naming such ranges), and the `warm`
//! function's schedule. They record their
//! runs' metrics; the HTTP handling itself stays in [`crate::http`].

use crate::App;
use crate::aggregate::records::StreamEvent;
use crate::error::Error;
use crate::http::{Function, error_response, handle};
use crate::reconcile::{Mode, Options as ReconcileOptions};
use crate::store::dynamodb::DynamoViews;
use crate::store::kinesis::KinesisLog;
use lambda_http::aws_lambda_events::apigw::{ApiGatewayV2httpRequest, ApiGatewayV2httpResponse};
use lambda_http::request::LambdaRequest;
use serde_json::{Value, json};
use std::time::Instant;

/// One event of the `reshard` function: an API Gateway HTTP API request (an
/// admin route; the answer is its payload-2.0 response) or anything else,
/// which is taken as the EventBridge schedule (the answer is the run's
/// summary). A failed scheduled run is an error, so Lambda records it.
pub async fn handle_reshard_event(
    app: &App,
    event: Value,
    deadline: Option<Instant>,
) -> Result<Value, Error> {
    if event.get("requestContext").is_some() {
        let response = match serde_json::from_value::<ApiGatewayV2httpRequest>(event) {
            Ok(r) => {
                handle(
                    app,
                    Function::Reshard,
                    LambdaRequest::ApiGatewayV2(r).into(),
                )
                .await
            }
            Err(e) => {
                tracing::warn!(error = %e, "unreadable API Gateway event");
                error_response(&Error::bad_request("invalid_event", "unreadable request"))
            }
        };
        let (parts, body) = response.into_parts();
        let mut out = ApiGatewayV2httpResponse::default();
        out.status_code = i64::from(parts.status.as_u16());
        out.headers = parts.headers;
        out.body = Some(body);
        return serde_json::to_value(out).map_err(|e| Error::internal("serialising a response", e));
    }
    // Boxed: the run's future is deep, and the functions' `main` futures
    // would otherwise hit rustc's query depth limit computing their layout.
    let summary = match Box::pin(app.reshard.run_scheduled(deadline)).await {
        Ok(s) => s,
        Err(e) => {
            // A failed run reports its failure; it knows no phase age, and
            // the stuck alarm reads the age missing as breaching.
            app.config
                .metrics
                .record("reshard")
                .count("ReshardRuns", 1)
                .count("ResizeErrors", 1);
            app.config.metrics.flush(None);
            return Err(e);
        }
    };
    app.config
        .metrics
        .record("reshard")
        .count("ReshardRuns", 1)
        .count("ShardedReels", summary.reels as u64)
        .count("ResizeSteps", summary.steps as u64)
        .count("ResizesCompleted", summary.completed as u64)
        .count("GrowsStarted", summary.grows_started as u64)
        .count("ShrinksStarted", summary.shrinks_started as u64)
        .count("Folds", summary.folds as u64)
        .count("ResizeErrors", summary.errors as u64)
        .sample(
            "OldestResizePhaseAge",
            summary.oldest_phase_ms as f64 / 1000.0,
        );
    app.config.metrics.flush(None);
    Ok(json!(summary))
}

/// One event of the `reconcile` function: `{"mode": "start" | "resume",
/// "dry_run": bool}` (both optional; the schedules pass the mode as their
/// input). The answer is the invocation's summary.
pub async fn handle_reconcile_event(
    app: &App,
    event: &Value,
    deadline: Option<Instant>,
) -> Result<Value, Error> {
    let mode = match event.get("mode").and_then(Value::as_str) {
        None | Some("start") => Mode::Start,
        Some("resume") => Mode::Resume,
        Some(other) => {
            tracing::warn!(mode = other, "unknown reconcile mode");
            return Err(Error::bad_request(
                "invalid_mode",
                "mode must be \"start\" or \"resume\"",
            ));
        }
    };
    let opts = ReconcileOptions {
        mode,
        dry_run: event
            .get("dry_run")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        deadline,
        stop_after_segments: None,
        stop_after_pages: None,
    };
    let summary = Box::pin(app.reconcile.run(&opts)).await?;
    if !summary.dry_run {
        // Every invocation (the resume schedule's every 15 minutes): how
        // old the run in progress is, 0 when none is. A run that never
        // finishes (one-off reels past what a run gets through before its
        // age limit) shows here long before drift goes unrepaired.
        let age_ms = if summary.complete {
            0
        } else {
            summary.run_duration_ms
        };
        app.config
            .metrics
            .record("reconcile")
            .sample("ReconcileRunAge", age_ms as f64 / 1000.0);
    }
    // A run's totals, once: from the invocation that finished it.
    if summary.complete && matches!(summary.invocation, "started" | "resumed") && !summary.dry_run {
        app.config
            .metrics
            .record("reconcile")
            .count("ReconcileRuns", 1)
            .count("ReconcileRowsScanned", summary.rows_scanned)
            .count("ReconcileReelsChecked", summary.reels_checked)
            .count("ReconcileReelsCorrected", summary.reels_corrected)
            .count("ReconcileReelsDeferred", summary.reels_deferred)
            .count("ReconcileAbsDrift", summary.total_abs_drift)
            .sample(
                "ReconcileRunDuration",
                summary.run_duration_ms as f64 / 1000.0,
            );
    }
    app.config.metrics.flush(None);
    serde_json::to_value(summary)
        .map_err(|e| Error::internal("serialising the reconcile summary", e))
}

/// One event of the `warm` function: the EventBridge schedule (once a
/// minute), or `{"rounds": n}` (a test's, `make sam-local`'s: n rounds,
/// then the answer). The answer is the run's summary; a run whose every
/// round failed is an error, so Lambda records it.
pub async fn handle_warm_event(
    app: &App,
    event: &Value,
    deadline: Option<Instant>,
) -> Result<Value, Error> {
    let rounds = match event.get("rounds") {
        None => None,
        Some(n) => match n.as_u64() {
            Some(n @ 1..=1000) => Some(n as u32),
            _ => {
                return Err(Error::bad_request(
                    "invalid_rounds",
                    "rounds must be a whole number from 1 to 1000",
                ));
            }
        },
    };
    fold_known(app).await;
    let s = Box::pin(crate::warmer::keep_warm(app, deadline, rounds)).await?;
    app.config
        .metrics
        .record("warm")
        .count("WarmRounds", u64::from(s.rounds))
        .count("WarmLists", u64::from(s.lists))
        .count("WarmFigures", s.figures)
        .count("WarmErrors", u64::from(s.errors))
        .sample("WarmReels", s.reels as f64);
    app.config.metrics.flush(None);
    tracing::info!(
        rounds = s.rounds,
        lists = s.lists,
        reels = s.reels,
        figures = s.figures,
        errors = s.errors,
        "warm run"
    );
    if s.rounds > 0 && s.errors >= s.rounds && s.figures == 0 && s.lists == 0 {
        return Err(Error::internal(
            "the warm run wrote nothing",
            format!("{} errors in {} rounds", s.errors, s.rounds),
        ));
    }
    serde_json::to_value(s).map_err(|e| Error::internal("serialising the warm summary", e))
}

/// The known reels' fold ([`crate::known::fold`]), once per warm run. It
/// never fails the run: what it leaves is folded by the next.
async fn fold_known(app: &App) {
    let Some(known) = &app.known else {
        return;
    };
    let fold = crate::known::fold::Fold::new(
        std::sync::Arc::new(app.service.store().clone()),
        known.margin_ms(),
        app.config.known_backfill_delay.as_millis() as i64,
    );
    let metrics = app.config.metrics.record("warm");
    match fold.fold_at(crate::clock::now_ms()).await {
        Ok(r) => {
            metrics
                .count("KnownFolded", r.registrations as u64 + r.backfilled as u64)
                .count("KnownIncomplete", u64::from(!r.complete));
            tracing::info!(
                registrations = r.registrations,
                added = r.added,
                segments = r.segments_written,
                backfilled = r.backfilled,
                complete = r.complete,
                lost = r.lost,
                "known reels folded"
            );
        }
        Err(e) => {
            metrics
                .count("KnownFoldErrors", 1)
                .count("KnownIncomplete", 1);
            tracing::warn!(
                error = e.code(),
                "the known reels' fold failed: the next run folds"
            );
        }
    }
}

/// One batch of the `aggregate` function (stream mode): Lambda's DynamoDB
/// stream event, with the tumbling-window fields (`shardId`). The answer is
/// Lambda's `TimeWindowEventResponse`: `batchItemFailures` names the record
/// from which Lambda must deliver again (empty: the whole batch is
/// applied), and `state` is left empty (the checkpoint item is the state,
/// kept across windows). An unreadable event or a store failure is an
/// error, so Lambda retries the whole batch (the mapping never bisects).
pub async fn handle_aggregate_event(
    app: &App,
    event: Value,
    deadline: Option<Instant>,
) -> Result<Value, Error> {
    let event: StreamEvent =
        serde_json::from_value(event).map_err(|e| Error::internal("unreadable stream event", e))?;
    let records = event.records.len() as u64;
    let result = app.aggregate.handle(&event, deadline).await;
    let m = app.config.metrics.record("aggregate");
    m.count("AggregateBatches", 1);
    match &result {
        Ok(out) => {
            m.count("AggregatedRecords", out.applied as u64)
                .count("AggregateSkippedRecords", out.skipped as u64)
                .count("AggregateChunks", out.chunks as u64)
                .count("AggregateRetries", u64::from(out.retries))
                .count(
                    "AggregateBatchesHandedBack",
                    u64::from(out.failed_from.is_some()),
                )
                .count("AggregateBatchesOutOfOrder", u64::from(out.out_of_order));
            if let Some(lag) = out.lag_ms {
                m.sample("AggregationLag", lag as f64);
            }
            tracing::info!(records, applied = out.applied, skipped = out.skipped, chunks = out.chunks, retries = out.retries, failed_from = ?out.failed_from, lag_ms = ?out.lag_ms, out_of_order = out.out_of_order, "aggregate batch");
        }
        Err(e) => {
            m.count("AggregateErrors", 1);
            tracing::warn!(records, error = %e, "aggregate batch failed; Lambda retries it");
        }
    }
    app.config.metrics.flush(None);
    Ok(json!({ "state": {}, "batchItemFailures": batch_item_failures(&result?) }))
}

/// The `aggregate-views` function's entry point: one batch of one views-log
/// shard (Lambda's Kinesis event), applied exactly once
/// ([`crate::views::aggregate`]); answers Lambda's `batchItemFailures`.
pub async fn handle_views_event(
    app: &App,
    event: Value,
    deadline: Option<Instant>,
) -> Result<Value, Error> {
    let aggregator = app.views.aggregator.as_ref().ok_or_else(|| {
        Error::internal(
            "views aggregation without views configured",
            "VIEWS_TABLE and VIEWS_STREAM must both be set",
        )
    })?;
    if crate::views::repair::GivenUp::is_invocation_record(&event) {
        return repair_views(app, aggregator, &event, deadline).await;
    }
    if crate::views::repair::QueuedRanges::is_sqs_event(&event) {
        return repair_queued(app, aggregator, &event, deadline).await;
    }
    let event: crate::views::record::KinesisEvent = serde_json::from_value(event)
        .map_err(|e| Error::internal("unreadable Kinesis event", e))?;
    let records = event.records.len() as u64;
    let views_before = aggregator.views_applied();
    let result = aggregator.handle(&event, deadline).await;
    let m = app.config.metrics.record("aggregate-views");
    m.count("ViewBatches", 1).count(
        "ViewsApplied",
        aggregator.views_applied().saturating_sub(views_before),
    );
    match &result {
        Ok(out) => {
            m.count("ViewRecordsApplied", out.applied as u64)
                .count("ViewRecordsSkipped", out.skipped as u64)
                .count("ViewChunks", out.chunks as u64)
                .count("ViewRetries", u64::from(out.retries))
                .count(
                    "ViewBatchesHandedBack",
                    u64::from(out.failed_from.is_some()),
                )
                .count("ViewBatchesOutOfOrder", u64::from(out.out_of_order));
            if let Some(lag) = out.lag_ms {
                m.sample("ViewAggregationLag", lag as f64);
            }
            tracing::info!(records, applied = out.applied, skipped = out.skipped, chunks = out.chunks, retries = out.retries, failed_from = ?out.failed_from, lag_ms = ?out.lag_ms, out_of_order = out.out_of_order, "views batch");
        }
        Err(e) => {
            m.count("ViewErrors", 1);
            tracing::warn!(records, error = %e, "views batch failed; Lambda retries it");
        }
    }
    app.config.metrics.flush(None);
    Ok(json!({ "batchItemFailures": batch_item_failures(&result?) }))
}

/// `aggregate-views` invoked with an OnFailure invocation record (the
/// message of `ViewsOnFailureQueue`, as an operator passes it): the range
/// it names counted once ([`crate::views::repair`]); answers what it did.
async fn repair_views(
    app: &App,
    aggregator: &crate::views::aggregate::ViewAggregator<DynamoViews, KinesisLog>,
    event: &Value,
    deadline: Option<Instant>,
) -> Result<Value, Error> {
    let range = crate::views::repair::GivenUp::parse(event)?;
    let result = aggregator.repair(&range, deadline).await;
    let m = app.config.metrics.record("aggregate-views");
    match &result {
        Ok(out) => {
            m.count("ViewRepairParts", out.applied_now as u64)
                .count("ViewRepairsIncomplete", u64::from(!out.complete));
            tracing::info!(shard = %range.shard_id, start = %range.start, end = %range.end, ?out, "views range repaired");
        }
        Err(e) => {
            m.count("ViewErrors", 1);
            tracing::warn!(shard = %range.shard_id, start = %range.start, error = %e, "views repair failed; invoke it again");
        }
    }
    app.config.metrics.flush(None);
    Ok(json!({ "repair": result? }))
}

/// `aggregate-views` invoked by the OnFailure queue (an SQS event source,
/// `ReportBatchItemFailures`): each message's range repaired in turn
/// within the deadline; the answer names the messages SQS is to deliver
/// again after the queue's visibility timeout (which is then the delay
/// of a retry): a repair too early, one stopped before its end (it goes
/// on from its checkpoint), one that failed, one that found the stream's
/// lease held past its wait, and those the deadline left no time for.
/// A range's failure is its message's, never the event's: it must not
/// hand the others back. Only an event without message ids (which Lambda
/// always writes) is an error, so that Lambda delivers it whole again.
async fn repair_queued(
    app: &App,
    aggregator: &crate::views::aggregate::ViewAggregator<DynamoViews, KinesisLog>,
    event: &Value,
    deadline: Option<Instant>,
) -> Result<Value, Error> {
    use crate::views::repair::{QueuedRanges, batch_item_failures};
    let messages = QueuedRanges::parse(event)?.0;
    let mut again: Vec<&str> = Vec::new();
    let m = app.config.metrics.record("aggregate-views");
    for (id, range) in &messages {
        let range = match range {
            Ok(r) => r,
            Err(e) => {
                // Dropped, not failed: nothing makes a body that names no
                // range name one, so delivering it again would only spend
                // invocations until the dead-letter queue took it a day
                // later. Logged whole, for an operator to look at.
                m.count("ViewRepairMessagesDropped", 1);
                tracing::error!(message = %id, error = %e, event = %event, "an OnFailure queue message that is no invocation record of a views range: dropped");
                continue;
            }
        };
        if deadline.is_some_and(|d| Instant::now() + crate::aggregate::core::DEADLINE_SAFETY >= d) {
            again.push(id);
            continue;
        }
        match repair_waiting_for_lease(aggregator, range, deadline).await {
            Ok(out) => {
                m.count("ViewRepairParts", out.applied_now as u64)
                    .count("ViewRepairsIncomplete", u64::from(!out.complete))
                    .count("ViewRepairsCompleted", u64::from(out.complete));
                tracing::info!(message = %id, shard = %range.shard_id, start = %range.start, end = %range.end, ?out, "views range repaired from the OnFailure queue");
                if !out.complete {
                    again.push(id);
                }
            }
            Err(e) if matches!(e.code(), "repair_too_early" | "repair_in_progress") => {
                m.count("ViewRepairsTooEarly", 1);
                tracing::info!(message = %id, shard = %range.shard_id, start = %range.start, why = %e, "views repair not yet: the queue delivers it again after its visibility timeout");
                again.push(id);
            }
            Err(e) if e.code() == "invalid_invocation_record" => {
                // Another stream's range: this function's keys would
                // find nothing counted of it, and count it all.
                m.count("ViewRepairMessagesDropped", 1);
                tracing::error!(message = %id, error = %e, "an OnFailure queue message names a range this function cannot repair: dropped");
            }
            Err(e) => {
                m.count("ViewErrors", 1);
                tracing::warn!(message = %id, shard = %range.shard_id, start = %range.start, error = %e, "views repair failed; the queue delivers it again");
                again.push(id);
            }
        }
    }
    app.config.metrics.flush(None);
    Ok(batch_item_failures(again))
}

/// A repair of `range`, waiting for the stream's lease while another
/// repair holds it (at most half the time left, so that the repair itself
/// still has the rest): two messages delivered side by side
/// (`MaximumConcurrency` 2) would otherwise fail one in two, and each
/// failure spends a receive of the message's `maxReceiveCount`.
async fn repair_waiting_for_lease(
    aggregator: &crate::views::aggregate::ViewAggregator<DynamoViews, KinesisLog>,
    range: &crate::views::repair::GivenUp,
    deadline: Option<Instant>,
) -> Result<crate::views::repair::RepairOutcome, Error> {
    let wait_until = deadline.map(|d| {
        let now = Instant::now();
        now + d.saturating_duration_since(now) / 2
    });
    loop {
        match aggregator.repair(range, deadline).await {
            Err(e)
                if e.code() == "repair_in_progress"
                    && wait_until.is_some_and(|w| Instant::now() + LEASE_POLL < w) =>
            {
                tokio::time::sleep(LEASE_POLL).await;
            }
            other => return other,
        }
    }
}

/// How often a queued repair asks for the stream's lease again.
const LEASE_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// Lambda's `batchItemFailures` for what an aggregator did not apply: the
/// record it is to deliver again from, if any (both event sources).
fn batch_item_failures(out: &crate::aggregate::BatchOutcome) -> Vec<Value> {
    out.failed_from
        .iter()
        .map(|seq| json!({ "itemIdentifier": seq }))
        .collect()
}
