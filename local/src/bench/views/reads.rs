//! What the `views` variant reads back: the table's sums and items, the
//! stream's shards, the answers it retries.

use super::*;

/// The string attribute `k` of `item`.
pub(super) fn s_attr(item: &Item, k: &str) -> Option<String> {
    item.get(k).and_then(|v| v.as_s().ok()).cloned()
}

/// The viral reel's partition in the views table.
pub(super) fn viral_pk() -> String {
    likes::keys::views_reel_key(&likes::keys::ReelId::parse(VIRAL).expect("a valid id"))
}

/// Waits for the views stream to be drained, up to [`DRAIN_LIMIT`].
pub(super) async fn drain(stack: &Stack) -> Result<()> {
    let start = Instant::now();
    while !stack.views_drained().await? {
        if start.elapsed() > DRAIN_LIMIT {
            return Err(anyhow!(
                "the views stream was not drained within {DRAIN_LIMIT:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Sends `failed` again with their keys, 16 at a time, up to 50 attempts
/// each; answers the ones that got a `202`.
pub(super) async fn retry(client: &Client, prefix: &str, failed: &[&Sample]) -> Vec<Sample> {
    let mut settled = Vec::new();
    for chunk in failed.chunks(16) {
        let done = futures::future::join_all(chunk.iter().map(|s| async move {
            for attempt in 0..50u64 {
                if client
                    .post(VIRAL, &user(prefix, s.viewer), s.count, &s.key)
                    .await
                    == Some(202)
                {
                    return Some((*s).clone());
                }
                tokio::time::sleep(Duration::from_millis(20 * attempt.min(10))).await;
            }
            None
        }))
        .await;
        settled.extend(done.into_iter().flatten());
    }
    settled
}

/// Polls the viral reel's summed views every [`POLL`] until `watching` is
/// cleared: `(seconds since t0, views)`; failed reads are left out.
pub(super) async fn poll_sums(
    client: aws_sdk_dynamodb::Client,
    table: String,
    watching: Arc<AtomicBool>,
    t0: Instant,
) -> Vec<(f64, u64)> {
    let mut out = Vec::new();
    while watching.load(Ordering::Relaxed) {
        if let Ok(n) = stored_sum(&client, &table).await {
            out.push((t0.elapsed().as_secs_f64(), n));
        }
        tokio::time::sleep(POLL).await;
    }
    out
}

/// The viral reel's views: its writers' all-time items summed, read
/// consistently (what the reader sums, without its cache).
pub(super) async fn stored_sum(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<u64> {
    let mut sum = 0u64;
    let mut start: Option<Item> = None;
    loop {
        let out = client
            .query()
            .table_name(table)
            .key_condition_expression("pk = :p AND begins_with(sk, :a)")
            .expression_attribute_values(":p", AttributeValue::S(viral_pk()))
            .expression_attribute_values(
                ":a",
                AttributeValue::S(likes::keys::VIEWS_ALL_PREFIX.into()),
            )
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .context("querying the viral reel's view items")?;
        sum += out
            .items()
            .iter()
            .filter_map(|i| i.get("v")?.as_n().ok()?.parse::<u64>().ok())
            .sum::<u64>();
        match out.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => return Ok(sum),
        }
    }
}

/// `GET /reels/viral/views` (the stack's cache is off): views and the
/// unique-viewer estimate.
pub(super) async fn read_back(client: &Client) -> Result<(u64, u64)> {
    let r = client
        .http
        .get(format!("{}/reels/{VIRAL}/views", client.base))
        .header("x-user-id", "bench-reader")
        .send()
        .await
        .context("GET /reels/viral/views")?;
    let status = r.status();
    let body: serde_json::Value = r.json().await.context("its body")?;
    let num = |k: &str| body.get(k).and_then(serde_json::Value::as_u64);
    match (num("views"), num("unique_viewers")) {
        (Some(v), Some(u)) if status.as_u16() == 200 => Ok((v, u)),
        _ => Err(anyhow!("GET /reels/viral/views answered {status}: {body}")),
    }
}

/// The ids of every shard of `stream`, open or closed.
pub(super) async fn shard_ids(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut next: Option<String> = None;
    loop {
        // ListShards takes the stream's name or a token, never both.
        let req = match next.take() {
            Some(token) => client.list_shards().next_token(token),
            None => client.list_shards().stream_name(stream),
        };
        let page = req.send().await.context("ListShards")?;
        out.extend(page.shards().iter().map(|s| s.shard_id().to_owned()));
        match page.next_token() {
            Some(t) if !t.is_empty() => next = Some(t.to_owned()),
            _ => return Ok(out),
        }
    }
}

/// Every item of the views table, read consistently.
pub(super) async fn scan(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    let mut start: Option<Item> = None;
    loop {
        let out = client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .context("scanning the views table")?;
        items.extend(out.items().iter().cloned());
        match out.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => return Ok(items),
        }
    }
}
