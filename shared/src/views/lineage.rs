//! Which shards' seen items a shard of the views log reads besides its
//! own: its ancestors, through splits and merges, a few generations back
//! (see `super::aggregate`'s notes on copies).

use super::aggregate::ViewAggregator;
use crate::error::Error;
use crate::store::{LogStore, ViewStore};
use std::collections::BTreeSet;

/// Generations of a shard's ancestors whose seen items it reads: Kinesis
/// on demand splits a hot shard again within minutes when traffic doubles
/// and doubles again, and a copy of a record (a producer's or a client's
/// retry) may come that many reshards later within `VIEWS_DEDUP_SECS`.
const LINEAGE_GENERATIONS: usize = 6;

impl<S: ViewStore, L: LogStore> ViewAggregator<S, L> {
    /// The shards `shard_id` of `stream_arn` was split or merged from, and
    /// theirs, up to [`LINEAGE_GENERATIONS`] back (a retry's copy may land
    /// several reshards later within the dedup window when Kinesis scales
    /// in bursts), each once, older generations before younger. The
    /// parents come from the cached shard listing; a closed ancestor's
    /// seen items are read once per instance.
    pub(super) async fn ancestors(
        &self,
        stream_arn: &str,
        shard_id: &str,
    ) -> Result<Vec<String>, Error> {
        let mut generations: Vec<Vec<String>> = Vec::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut current = vec![shard_id.to_owned()];
        for _ in 0..LINEAGE_GENERATIONS {
            let mut next = Vec::new();
            for shard in &current {
                for parent in self.log.parents(stream_arn, shard).await? {
                    if seen.insert(parent.clone()) {
                        next.push(parent);
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            generations.push(next.clone());
            current = next;
        }
        Ok(generations.into_iter().rev().flatten().collect())
    }
}
