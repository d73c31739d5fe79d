//! The views stream of the local stack: kinesis-mock started as a child
//! process (or `LOCAL_KINESIS_ENDPOINT`, a Kinesis already running), the
//! stream of `template.yaml`'s `ViewsStream` made with
//! `LOCAL_VIEWS_SHARDS` shards, and the views aggregator's event source on
//! it.
//!
//! Kept apart from the stack's start-up because it is one concern with
//! its own process. With `FAULTS`, the fault proxy stands between the
//! functions (and the source) and Kinesis, while [`Views::client`] stays
//! direct.

use super::StackOptions;
use crate::kinesis::{
    Handler, KinesisEmulator, KinesisSettings, KinesisSource, KinesisSourceDef, create_stream,
    kinesis_client,
};
use anyhow::{Context, Result};
use likes::App;
use std::sync::Arc;
use tokio::sync::watch;

/// The local shard count of the views stream when neither
/// `LOCAL_VIEWS_SHARDS` nor the template's `ShardCount` says one (the
/// template's stream is on-demand, whose shards AWS decides).
const DEFAULT_SHARDS: u32 = 4;
/// More shards than kinesis-mock's default limit allows is a typo.
const MAX_SHARDS: u32 = 50;

/// The views stream, running.
pub struct Views {
    /// The emulator's own endpoint (or `LOCAL_KINESIS_ENDPOINT`): what
    /// tools and tests look at the stream through.
    pub kinesis_endpoint: String,
    /// The endpoint the functions and the event source reach Kinesis
    /// through: the fault proxy's, when one stands in front, else
    /// [`Views::kinesis_endpoint`].
    pub source_endpoint: String,
    /// A client on [`Views::kinesis_endpoint`], never through the proxy.
    pub client: aws_sdk_kinesis::Client,
    /// The stream and its mapping's settings, from the template.
    pub def: KinesisSourceDef,
    /// Its shards at creation.
    pub shards: u32,
    /// The views function's event source, once started.
    pub source: Option<KinesisSource>,
    /// The event source's own settings (`LOCAL_VIEWS_FAULTS`, ...).
    settings: KinesisSettings,
    emulator: Option<KinesisEmulator>,
}

impl Views {
    /// Stops the event source, then the emulator (after the stack's stop
    /// signal was sent).
    pub async fn stop(self) {
        if let Some(s) = self.source {
            s.stop().await;
        }
        if let Some(e) = self.emulator {
            e.stop().await;
        }
    }
}

/// The views aggregator's entry point of `app`
/// (`likes::triggers::handle_views_event`, what the `aggregate-views`
/// binary's `main` calls), as the event source's handler, with Lambda's
/// deadline of `timeout` (the function's `Timeout`) from each invocation.
pub(super) fn views_handler(app: &Arc<App>, timeout: std::time::Duration) -> Handler {
    let app = app.clone();
    Arc::new(move |event| {
        let app = app.clone();
        Box::pin(async move {
            let deadline = Some(std::time::Instant::now() + timeout);
            let (records, bytes) = crate::meter::records_of(&event);
            let handled = likes::triggers::handle_views_event(&app, event, deadline);
            crate::meter::invoke("aggregate-views", records, bytes, handled)
                .await
                .map_err(|e| anyhow::anyhow!("{}: {e}", e.code()))
        })
    })
}

/// The shard count the stream is made with.
fn shard_count(opts: &StackOptions, def: &KinesisSourceDef) -> Result<u32> {
    let Some(v) = opts
        .lookup("LOCAL_VIEWS_SHARDS")
        .filter(|v| !v.trim().is_empty())
    else {
        return Ok(def.shard_count.unwrap_or(DEFAULT_SHARDS).min(MAX_SHARDS));
    };
    let n: u32 = v.trim().parse().context("LOCAL_VIEWS_SHARDS")?;
    if !(1..=MAX_SHARDS).contains(&n) {
        anyhow::bail!("LOCAL_VIEWS_SHARDS={n}: 1 to {MAX_SHARDS}");
    }
    Ok(n)
}

/// Starts the views stream for the stack of `opts`: the emulator (unless
/// `LOCAL_KINESIS_ENDPOINT` names one) and the stream; its event source
/// starts once the function it hands batches to is built
/// ([`Views::spawn_source`]).
pub(super) async fn start(opts: &StackOptions) -> Result<Views> {
    let def = KinesisSourceDef::load(&opts.template)?;
    let shards = shard_count(opts, &def)?;
    let settings = KinesisSettings::from_lookup(|k| opts.lookup(k))?;
    let (emulator, kinesis_endpoint) = match opts
        .lookup("LOCAL_KINESIS_ENDPOINT")
        .filter(|v| !v.trim().is_empty())
    {
        Some(url) => (None, url),
        None => {
            let dir = crate::kinesis::package_dir(|k| opts.lookup(k))?;
            let e = KinesisEmulator::start(&dir)
                .await
                .context("starting the Kinesis emulator (LOCAL_VIEWS=off skips it)")?;
            let url = e.endpoint.clone();
            (Some(e), url)
        }
    };
    let client = kinesis_client(&kinesis_endpoint);
    create_stream(&client, &def.stream, shards).await?;
    Ok(Views {
        source_endpoint: kinesis_endpoint.clone(),
        kinesis_endpoint,
        client,
        def,
        shards,
        settings,
        source: None,
        emulator,
    })
}

impl Views {
    /// Starts the event source, handing batches to `handler`, reading
    /// through `proxy` (the fault proxy in front of Kinesis) if given.
    pub(super) fn spawn_source(
        &mut self,
        handler: Handler,
        proxy: Option<String>,
        stopped: watch::Receiver<bool>,
    ) {
        if let Some(p) = proxy {
            self.source_endpoint = p;
        }
        self.source = Some(KinesisSource::spawn(
            kinesis_client(&self.source_endpoint),
            self.def.clone(),
            self.settings.clone(),
            handler,
            stopped,
        ));
    }
}

/// Whether the stack of `opts` runs the views stream: `LOCAL_VIEWS`
/// (`on`/`off`, `1`/`0`), else `default` (on for `make serve`, off for
/// the integration tests' isolated stacks, which need no Node.js).
pub(super) fn enabled(opts: &StackOptions, default: bool) -> Result<bool> {
    match opts.lookup("LOCAL_VIEWS").as_deref().map(str::trim) {
        None | Some("") => Ok(default),
        Some("on" | "1" | "true") => Ok(true),
        Some("off" | "0" | "false") => Ok(false),
        Some(other) => anyhow::bail!("LOCAL_VIEWS={other}: on or off"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Stack;
    use super::*;
    use std::path::PathBuf;

    fn opts(env: &[(&str, &str)]) -> StackOptions {
        let mut o = StackOptions::isolated(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../template.yaml"
        )));
        o.env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        o
    }

    #[test]
    fn switch_and_shard_count() {
        let def = KinesisSourceDef::default();
        assert!(!enabled(&opts(&[]), false).unwrap());
        assert!(enabled(&opts(&[]), true).unwrap());
        assert!(enabled(&opts(&[("LOCAL_VIEWS", "on")]), false).unwrap());
        assert!(!enabled(&opts(&[("LOCAL_VIEWS", "off")]), true).unwrap());
        assert!(enabled(&opts(&[("LOCAL_VIEWS", "maybe")]), true).is_err());
        assert_eq!(shard_count(&opts(&[]), &def).unwrap(), 4);
        let provisioned = KinesisSourceDef {
            shard_count: Some(2),
            ..def.clone()
        };
        assert_eq!(shard_count(&opts(&[]), &provisioned).unwrap(), 2);
        let three = opts(&[("LOCAL_VIEWS_SHARDS", "3")]);
        assert_eq!(shard_count(&three, &provisioned).unwrap(), 3);
        for bad in ["0", "51", "x"] {
            assert!(shard_count(&opts(&[("LOCAL_VIEWS_SHARDS", bad)]), &def).is_err());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_stack_starts_the_stream_and_stops_the_emulator() {
        if crate::kinesis::skip_without_node() {
            return;
        }
        let stack = Stack::start(opts(&[("LOCAL_VIEWS", "on"), ("LOCAL_VIEWS_SHARDS", "3")]))
            .await
            .unwrap();
        let views = stack.views.as_ref().expect("LOCAL_VIEWS=on");
        assert_eq!(
            views.source_endpoint, views.kinesis_endpoint,
            "no proxy without FAULTS"
        );
        assert!(views.source.is_some(), "the aggregator's source runs");
        assert!(views.kinesis_endpoint.starts_with("http://127.0.0.1:"));
        let shards = views
            .client
            .list_shards()
            .stream_name(&views.def.stream)
            .send()
            .await
            .unwrap();
        assert_eq!(shards.shards().len(), 3);
        let endpoint = views.kinesis_endpoint.clone();
        stack.shutdown().await;
        let gone = kinesis_client(&endpoint).list_streams().send().await;
        assert!(gone.is_err(), "the emulator stops with the stack");
    }
}
