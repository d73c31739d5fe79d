//! The views stream as the views tests fake it: its ARN, Kinesis-shaped
//! sequence numbers, and a reel's views read back as a reader sees them.

use super::TestStack;
use likes::keys::ReelId;
use likes::store::dynamodb::DynamoViews;
use likes::views::read::ViewReader;
use std::time::Duration;

/// The views stream the records and batches name.
pub const ARN: &str = "arn:aws:kinesis:us-east-1:123456789012:stream/ViewsStream";

/// A Kinesis-shaped sequence number, ordered by `n`.
pub fn seq(n: u64) -> String {
    format!("4959{:052}", n)
}

/// `reel`'s all-time views, read by a fresh reader (no cache, the system
/// clock) from the stack's views table.
pub async fn views_of(t: &TestStack, reel: &str) -> u64 {
    let reader = ViewReader::new(
        DynamoViews::new(t.stack.client.clone(), "ViewsTable"),
        Duration::ZERO,
        10,
        likes::views::system_clock(),
    );
    reader
        .counts(&ReelId::parse(reel).unwrap())
        .await
        .unwrap()
        .views
}
