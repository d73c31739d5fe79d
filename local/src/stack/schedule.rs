//! The schedules of `template.yaml`, run locally: what EventBridge does in
//! AWS for the reshard, reconcile and warm functions. Apart from the start-up
//! because a schedule is a loop that lives as long as the stack, not a step
//! of starting it.

use super::StackOptions;
use crate::template::ScheduleDef;
use anyhow::{Context, Result, anyhow};
use likes::App;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The scheduled invocations EventBridge makes in AWS, made locally every
/// `period` (`LOCAL_SCHEDULE_SECS`), through the same entry point as the
/// Lambda function, one at a time.
pub(super) fn spawn_schedule(
    app: Arc<App>,
    schedule: &ScheduleDef,
    period: Duration,
    mut stopped: watch::Receiver<bool>,
) -> Result<JoinHandle<()>> {
    let name: &'static str = match schedule.code_uri.rsplit('/').next() {
        Some("reshard") => "reshard",
        Some("reconcile") => "reconcile",
        Some("warm") => "warm",
        _ => "",
    };
    if name.is_empty() {
        anyhow::bail!(
            "no local handler for the schedule of {} (CodeUri {})",
            schedule.function,
            schedule.code_uri
        );
    }
    let input: serde_json::Value = match &schedule.input {
        Some(text) => serde_json::from_str(text)
            .with_context(|| format!("the Input of a schedule of {}", schedule.function))?,
        None => serde_json::json!({
            "source": "aws.events",
            "detail-type": "Scheduled Event",
            "detail": {},
        }),
    };
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            let deadline = Instant::now() + SCHEDULED_TIMEOUT;
            let run = async {
                match name {
                    "reconcile" => {
                        likes::triggers::handle_reconcile_event(&app, &input, Some(deadline)).await
                    }
                    "warm" => {
                        likes::triggers::handle_warm_event(&app, &input, Some(deadline)).await
                    }
                    _ => {
                        likes::triggers::handle_reshard_event(&app, input.clone(), Some(deadline))
                            .await
                    }
                }
            };
            tokio::select! {
                _ = stopped.wait_for(|s| *s) => return,
                r = run => if let Err(e) = r {
                    tracing::warn!(error = e.code(), function = name, "scheduled run failed");
                },
            }
        }
    }))
}

/// A period in (fractional) seconds from `name`, or `default`.
pub(super) fn seconds(opts: &StackOptions, name: &str, default: Duration) -> Result<Duration> {
    match opts.lookup(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| anyhow!("{name}={v:?} is not a number of seconds")),
    }
}

/// The `Timeout` of the scheduled functions in `template.yaml`.
/// The stream sources use it too, for a function that sets none.
pub(super) const SCHEDULED_TIMEOUT: Duration = Duration::from_secs(60);
