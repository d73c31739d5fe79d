//! What a batch's cut knows of its viewers (issue 36): a viewer whose
//! minute is spent takes no item in the cut, so a flood of its parts rides
//! along in whatever chunk comes instead of taking transactions of its own
//! before the other viewers' records (see `super::bound`).
//!
//! The batch's seen items are read before it is cut (its chunks' plans
//! read them anyway). A viewer they show spent from the newest part's
//! minute on is spent for every chunk of the batch: each chunk's plan reads
//! at least those items (its window starts a minute before its oldest
//! part), so it counts nothing of that viewer, and no chunk's plan can hold
//! more items than the cut allowed for.

use super::aggregate::ViewPlanning;
use super::bound::{self, viewer_tag};
use super::chunk::Part;
use crate::store::{LogStore, ViewStore};

impl<S: ViewStore, L: LogStore> ViewPlanning<'_, S, L> {
    /// Reads the seen items of `parts`' window into the aggregator's
    /// cache. A failure only leaves the cut as it would be without.
    pub(super) async fn read_window(&self, parts: &[Part]) {
        let Some(oldest) = parts.iter().map(|p| p.arrival_ms).min() else {
            return;
        };
        let a = self.aggregator;
        let window = a.config.dedup_window.as_millis() as i64;
        if let Err(e) = a
            .seen
            .since(
                &a.store,
                &a.read_backoff,
                &self.partitions(),
                &self.seen_key,
                oldest - window.max(bound::WINDOW_MS),
                self.deadline,
            )
            .await
        {
            tracing::debug!(error = e.code(), "seen items not read before the cut");
        }
    }

    /// Whether a viewer is spent for every chunk of `pending` (see the
    /// module notes).
    pub(super) fn spent(&self, pending: &[Part]) -> impl Fn(&str) -> bool {
        let newest = pending.iter().map(|p| p.arrival_ms).max().unwrap_or(0);
        let a = self.aggregator;
        let used = a.seen.usage(&self.partitions(), newest - bound::WINDOW_MS);
        let (views, reels) = a.config.per_viewer;
        move |viewer: &str| {
            used.get(&viewer_tag(viewer))
                .is_some_and(|(v, r)| *v >= u64::from(views) || *r >= u64::from(reels))
        }
    }

    /// The seen partitions the batch reads: its parents' and its own.
    fn partitions(&self) -> Vec<String> {
        let mut p = self.ancestors.clone();
        p.push(self.seen_key.clone());
        p
    }
}
