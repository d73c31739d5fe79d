//! The event source's own faults (`LOCAL_STREAM_FAULTS`): what Lambda may
//! do under failures and a fault-free local source never does, drawn from
//! one seeded generator so that a run can be repeated. This file holds the
//! settings and the changes a fault makes to a batch, as pure functions of
//! the draws; when each fault is drawn is `deliver`'s business. The
//! Kinesis event source (`crate::kinesis`) draws the same classes, with
//! the same settings type and dice, crate-visible for it.
//!
//! What Lambda documents, and each class stands for:
//!
//! * `redeliver`, `reorder`, `duplicate`: "Lambda will process each record
//!   at least once, but doesn't guarantee that each record will be
//!   processed only once. [...] Records are always processed in order the
//!   first time. If records are processed more than once, they might be
//!   processed out of order."
//!   (<https://docs.aws.amazon.com/lambda/latest/dg/services-ddb-windows.html>).
//!   So `reorder` only touches a batch handed over again, and keeps the
//!   records it appends after it (the ones that follow in the shard, seen
//!   for the first time) in order;
//! * `final_window`: at the end of a tumbling window Lambda makes one more
//!   invocation with `isFinalInvokeForWindow: true` for the window's
//!   state (same page), which may hold no records;
//! * `lost`, `late_commit`: "Event source mappings that read from streams
//!   retry the entire batch of items"
//!   (<https://docs.aws.amazon.com/lambda/latest/dg/invocation-retries.html>)
//!   after a function error or a timeout, whether or not the function did
//!   its work: `lost` is an invocation that did it and failed after;
//!   `late_commit` one that timed out while its writes were still on their
//!   way, so they may land after the retry started;
//! * `expire`: "If a Lambda event source mapping is unable to invoke the
//!   function due to throttling or other issues, it retries until the
//!   records expire or exceed the maximum age"
//!   (<https://docs.aws.amazon.com/lambda/latest/dg/kinesis-on-failure-destination.html>):
//!   a batch, first handed over or again, is taken as past
//!   `MaximumRecordAgeInSeconds` and sent to the OnFailure destination,
//!   whatever earlier invocations of it did.

use anyhow::{Context, Result, anyhow};
use std::sync::Mutex;

/// The `LOCAL_STREAM_FAULTS` of the local event source: a probability per
/// class (0: never), and the seed of their draws.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SourceFaults {
    pub(crate) seed: u64,
    /// A batch that succeeded is delivered once more.
    pub(crate) redeliver: f64,
    /// A successful invocation's answer is taken away (a function error).
    pub(crate) lost: f64,
    /// A batch handed over again comes out of stream order.
    pub(crate) reorder: f64,
    /// One record of a batch comes twice in it.
    pub(crate) duplicate: f64,
    /// A successful batch is followed by the window's final invocation.
    pub(crate) final_window: f64,
    /// An invocation is taken as timed out at once and left running.
    pub(crate) late_commit: f64,
    /// A batch about to be handed over goes to OnFailure instead.
    pub(crate) expire: f64,
}

/// The classes, as `LOCAL_STREAM_FAULTS` names them.
const CLASSES: &str =
    "seed, redeliver, lost, reorder, duplicate, final_window, late_commit, expire";

impl SourceFaults {
    /// `seed=N,redeliver=P,lost=P,reorder=P,duplicate=P,final_window=P,
    /// late_commit=P,expire=P` (probabilities in 0..=1, any subset); empty:
    /// none.
    pub fn parse(spec: &str) -> Result<Self> {
        let mut f = SourceFaults::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| anyhow!("{part:?}: expected name=value"))?;
            let (k, v) = (k.trim(), v.trim());
            if k == "seed" {
                f.seed = v.parse().context("seed")?;
                continue;
            }
            let slot = match k {
                "redeliver" => &mut f.redeliver,
                "lost" => &mut f.lost,
                "reorder" => &mut f.reorder,
                "duplicate" => &mut f.duplicate,
                "final_window" => &mut f.final_window,
                "late_commit" => &mut f.late_commit,
                "expire" => &mut f.expire,
                other => anyhow::bail!("unknown stream fault {other:?} ({CLASSES})"),
            };
            let p: f64 = v.parse().with_context(|| k.to_owned())?;
            if !(0.0..=1.0).contains(&p) {
                anyhow::bail!("{k}={p}: a probability is between 0 and 1");
            }
            *slot = p;
        }
        Ok(f)
    }
}

/// The seeded draws of one event source, shared by its virtual shards.
pub(crate) struct Dice(Mutex<fastrand::Rng>);

impl Dice {
    pub(crate) fn new(seed: u64) -> Self {
        Dice(Mutex::new(fastrand::Rng::with_seed(seed)))
    }

    fn with<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        // A poisoned lock only means a draw panicked elsewhere; the
        // generator is still a generator.
        let mut rng = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut rng)
    }

    /// True with probability `p` (never drawn for 0, so that a run without
    /// a class draws the same as before it existed).
    pub(crate) fn chance(&self, p: f64) -> bool {
        p > 0.0 && self.with(|r| r.f64() < p)
    }

    /// A number in `0..n` (0 for `n == 0`).
    pub(crate) fn below(&self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.with(|r| r.usize(..n))
        }
    }

    /// A number in `0.0..1.0`.
    pub(crate) fn fraction(&self) -> f64 {
        self.with(|r| r.f64())
    }

    fn shuffle(&self, items: &mut [usize]) {
        self.with(|r| r.shuffle(items));
    }
}

/// `reorder`: the order in which a batch of `n` records is handed over, as
/// positions in stream order: reversed or shuffled, and never stream order
/// itself when `n > 1` (a shuffle that changed nothing is reversed).
pub(crate) fn out_of_order(n: usize, dice: &Dice) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if dice.chance(0.5) {
        dice.shuffle(&mut order);
    }
    if order.windows(2).all(|w| w[0] < w[1]) {
        order.reverse();
    }
    order
}

/// `duplicate`: which record of a batch of `n > 0` comes twice, and where
/// its copy goes (an insertion position after the record itself, so the
/// first sighting keeps its place in the batch).
pub(crate) fn duplicate_at(n: usize, dice: &Dice) -> (usize, usize) {
    let from = dice.below(n);
    let to = from + 1 + dice.below(n - from);
    (from, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse() {
        assert_eq!(SourceFaults::parse("").unwrap(), SourceFaults::default());
        let f = SourceFaults::parse("seed=3, redeliver=0.5,lost=0.25").unwrap();
        assert_eq!((f.seed, f.redeliver, f.lost), (3, 0.5, 0.25));
        let f = SourceFaults::parse("reorder=1,duplicate=0.5,final_window=0.25,late_commit=0.125")
            .unwrap();
        assert_eq!(
            (f.reorder, f.duplicate, f.final_window, f.late_commit),
            (1.0, 0.5, 0.25, 0.125)
        );
        assert!(SourceFaults::parse("lost=2").is_err());
        assert!(SourceFaults::parse("reorder=-0.1").is_err());
        assert!(SourceFaults::parse("drop=0.1").is_err());
        assert!(SourceFaults::parse("reorder").is_err());
    }

    #[test]
    fn an_order_out_of_order_is_a_permutation_that_is_never_stream_order() {
        let dice = Dice::new(9);
        for n in 2..12 {
            for _ in 0..50 {
                let order = out_of_order(n, &dice);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "a permutation");
                assert!(order.windows(2).any(|w| w[0] > w[1]), "{order:?}");
            }
        }
        assert_eq!(out_of_order(1, &dice), [0]);
    }

    #[test]
    fn a_duplicate_comes_after_the_record_it_copies() {
        let dice = Dice::new(4);
        for n in 1..8 {
            for _ in 0..50 {
                let (from, to) = duplicate_at(n, &dice);
                assert!(from < n && from < to && to <= n, "{n}: {from} -> {to}");
            }
        }
    }

    #[test]
    fn a_class_at_zero_draws_nothing() {
        let (a, b) = (Dice::new(1), Dice::new(1));
        assert!(!a.chance(0.0));
        assert_eq!(a.fraction(), b.fraction(), "the stream of draws is unmoved");
    }
}
