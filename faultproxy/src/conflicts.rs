//! The conflict model: DynamoDB's rule that an item a transaction holds in
//! flight cannot be touched by another request. Deterministic, beside the
//! random `conflict` class, and on with `conflict_hold_ms`.
//!
//! DynamoDB's developer guide, "Transaction conflict handling in DynamoDB"
//! (<https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html#transaction-conflict-handling>),
//! says which requests conflict with an ongoing `TransactWriteItems` on one
//! of its items, and what they get. The model gives the same answers:
//!
//! * another `TransactWriteItems`: `TransactionCanceledException`, with a
//!   `TransactionConflict` reason at each action on a held item and `None`
//!   at the others;
//! * `PutItem`, `UpdateItem`, `DeleteItem`: `TransactionConflictException`;
//! * `TransactGetItems`: `TransactionCanceledException`, reasons as above;
//! * `GetItem`: "both operations can succeed", so it goes through. So do
//!   `BatchGetItem`, `Query` and `Scan`, read-committed against a
//!   transaction as a unit (the guide's isolation table), and
//!   `BatchWriteItem`, for which the guide names no conflict with an
//!   ongoing transaction.
//!
//! And the API reference's `TransactWriteItems` errors add
//! `TransactionInProgressException`, "the transaction with the given request
//! token is already in progress"
//! (<https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_TransactWriteItems.html#API_TransactWriteItems_Errors>):
//! a retry with the `ClientRequestToken` of a transaction that still holds
//! its items gets that, whatever it touches.
//!
//! Only `TransactWriteItems` holds items here. DynamoDB also cancels an
//! ongoing `TransactGetItems` when a write lands on an item it reads; the
//! proxy has forwarded that read already and leaves it be. And DynamoDB
//! cancels a transaction that meets a single write (`PutItem`,
//! `UpdateItem`, `DeleteItem`, `BatchWriteItem`) in flight on one of its
//! items; single writes hold nothing here, so no transaction is ever
//! cancelled by one (say, a stream-mode keyed unlike by the unkeyed like
//! `PutItem` of the same row): only the random `conflict` class stands in
//! for that.
//!
//! A transaction holds its items from when the proxy decides to forward it
//! until its answer reaches the caller, and the proxy holds that answer
//! back for the hold (`conflict_hold_ms`): the emulator answers in well
//! under a millisecond, so without the hold no two transactions would
//! overlap. The hold is spent before the answer, as DynamoDB spends a
//! transaction's time: a caller's next transaction, sent once it has the
//! answer, never meets its own last one (a hold past the answer made every
//! aggregator's consecutive chunks, which move one checkpoint item,
//! conflict with themselves). A hold ends when the answer goes out, or when
//! the request is abandoned first (a drop guard), so no hold outlives its
//! request; it is pruned when the next request looks, under the state's one
//! lock.

use crate::protocol::{self, Touch};
use crate::schema::KeySchemas;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// What the conflict model did, as `GET /__proxy/stats` reports it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ModeledConflicts {
    /// Requests refused because an item they touch was held by a
    /// transaction in flight, by operation.
    pub refused: BTreeMap<String, u64>,
    /// `TransactWriteItems` refused with `TransactionInProgressException`:
    /// the token of a transaction still holding its items.
    pub in_progress: u64,
    /// Transactions that held their items (forwarded with the model on).
    pub holds: u64,
    /// The most items held at once.
    pub max_held_items: u64,
    /// Refusals by the held item that caused them (one per item held in a
    /// refused request), named as the model names items (table and key as
    /// JSON): which items requests queue on. The first 10,000 items only
    /// (`MAX_ITEMS_TRACKED`).
    pub refused_on: BTreeMap<String, u64>,
}

/// How many distinct items [`ModeledConflicts::refused_on`] tracks.
pub const MAX_ITEMS_TRACKED: usize = 10_000;

impl ModeledConflicts {
    /// Every request the model refused.
    pub fn total(&self) -> u64 {
        self.refused.values().sum::<u64>() + self.in_progress
    }
}

/// One transaction's hold on its items.
struct Hold {
    token: Option<String>,
    /// `None` while the transaction is in flight; then the end of the hold.
    until: Option<Instant>,
}

/// The items transactions in flight hold.
#[derive(Default)]
pub(crate) struct Holds {
    /// Item (as `protocol::item` names it) → the transaction holding it.
    items: HashMap<String, u64>,
    holds: HashMap<u64, Hold>,
    next: u64,
    pub(crate) stats: ModeledConflicts,
}

impl Holds {
    /// Forgets the holds that ended before `now`.
    fn prune(&mut self, now: Instant) {
        self.holds
            .retain(|_, h| h.until.is_none_or(|until| until > now));
        let holds = &self.holds;
        self.items.retain(|_, id| holds.contains_key(id));
    }

    /// DynamoDB's answer to `op`, which `touches` these items, when a
    /// transaction holds any of them; `None` lets the request through.
    pub(crate) fn check(
        &mut self,
        op: &str,
        body: &Value,
        touches: &[Touch],
        schemas: &KeySchemas,
        now: Instant,
    ) -> Option<(u16, Value)> {
        self.prune(now);
        if self.holds.is_empty() {
            return None;
        }
        let items: Vec<String> = touches.iter().map(|t| schemas.item(t)).collect();
        let held: Vec<usize> = items
            .iter()
            .enumerate()
            .filter(|(_, item)| self.items.contains_key(*item))
            .map(|(i, _)| i)
            .collect();
        let answer = match op {
            "TransactWriteItems" => {
                if let Some(token) = protocol::client_token(body)
                    && self
                        .holds
                        .values()
                        .any(|h| h.token.as_deref() == Some(token))
                {
                    self.stats.in_progress += 1;
                    return Some(protocol::transaction_in_progress());
                }
                self.cancellation(body, &items, &held)?
            }
            "TransactGetItems" => self.cancellation(body, &items, &held)?,
            "PutItem" | "UpdateItem" | "DeleteItem" if !held.is_empty() => {
                protocol::transaction_conflict()
            }
            _ => return None,
        };
        *self.stats.refused.entry(op.to_owned()).or_default() += 1;
        for &i in &held {
            let tracked = self.stats.refused_on.len() < MAX_ITEMS_TRACKED;
            match self.stats.refused_on.get_mut(&items[i]) {
                Some(n) => *n += 1,
                None if tracked => {
                    self.stats.refused_on.insert(items[i].clone(), 1);
                }
                None => {}
            }
        }
        Some(answer)
    }

    /// A transaction's cancellation for the items at `held`, if any. A
    /// request whose items do not line up with its `TransactItems` is
    /// malformed: it goes through, and the emulator refuses it.
    fn cancellation(&self, body: &Value, items: &[String], held: &[usize]) -> Option<(u16, Value)> {
        let n = protocol::transaction_items(body);
        (!held.is_empty() && n == items.len()).then(|| protocol::conflict_cancelled(n, held))
    }

    /// Holds the items a `TransactWriteItems` about to be forwarded
    /// touches, until [`Holds::release`] plus `extra`. Returns the hold's
    /// id.
    pub(crate) fn hold(&mut self, body: &Value, touches: &[Touch], schemas: &KeySchemas) -> u64 {
        self.next += 1;
        let id = self.next;
        for t in touches {
            self.items.insert(schemas.item(t), id);
        }
        self.holds.insert(
            id,
            Hold {
                token: protocol::client_token(body).map(str::to_owned),
                until: None,
            },
        );
        self.stats.holds += 1;
        self.stats.max_held_items = self.stats.max_held_items.max(self.items.len() as u64);
        id
    }

    /// The transaction of hold `id` has given its answer (or was
    /// abandoned) at `now`: its items are free.
    pub(crate) fn release(&mut self, id: u64, now: Instant) {
        if let Some(h) = self.holds.get_mut(&id) {
            h.until = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn update(pk: &str) -> Value {
        json!({"Update": {"TableName": "T", "Key": {"pk": {"S": pk}}, "UpdateExpression": "ADD n :one"}})
    }

    fn tx(pks: &[&str], token: &str) -> Value {
        let items: Vec<Value> = pks.iter().map(|pk| update(pk)).collect();
        json!({"TransactItems": items, "ClientRequestToken": token})
    }

    /// Table `T`, hash key `pk`, as DescribeTable tells it.
    fn schemas() -> KeySchemas {
        let mut s = KeySchemas::default();
        let described =
            json!({"Table": {"KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}]}});
        s.learn("T".to_owned(), Some(&described));
        s
    }

    /// Lets a `TransactWriteItems` through and holds its items: its id.
    fn hold(h: &mut Holds, body: &Value) -> u64 {
        let touches = protocol::touches("TransactWriteItems", body);
        h.hold(body, &touches, &schemas())
    }

    /// `op` with `body` against `h`: `None` if let through (and then, for a
    /// transaction, holding its items), else the refusal.
    fn send(h: &mut Holds, op: &str, body: &Value, now: Instant) -> Option<(u16, Value)> {
        let answer = h.check(op, body, &protocol::touches(op, body), &schemas(), now);
        if answer.is_none() && op == "TransactWriteItems" {
            hold(h, body);
        }
        answer
    }

    fn codes(answer: &(u16, Value)) -> Vec<&str> {
        answer.1["CancellationReasons"]
            .as_array()
            .map(|r| r.iter().filter_map(|r| r["Code"].as_str()).collect())
            .unwrap_or_default()
    }

    fn kind(answer: &(u16, Value)) -> Option<String> {
        protocol::error_kind(answer.1.to_string().as_bytes())
    }

    #[test]
    fn a_transaction_on_a_held_item_is_cancelled_at_that_item() {
        let mut h = Holds::default();
        let t0 = Instant::now();
        assert!(send(&mut h, "TransactWriteItems", &tx(&["a"], "t1"), t0).is_none());
        // Still in flight, however long it takes.
        let later = t0 + Duration::from_secs(60);
        let answer = send(
            &mut h,
            "TransactWriteItems",
            &tx(&["x", "y", "a"], "t2"),
            later,
        )
        .expect("conflict");
        assert_eq!(answer.0, 400);
        assert_eq!(
            kind(&answer).as_deref(),
            Some("TransactionCanceledException")
        );
        assert_eq!(codes(&answer), ["None", "None", "TransactionConflict"]);
        // The cancelled one took no holds: x is free.
        assert!(send(&mut h, "TransactWriteItems", &tx(&["x"], "t3"), later).is_none());
        assert_eq!(h.stats.refused["TransactWriteItems"], 1);
        // Refused on a (held), not on x or y.
        let on: Vec<(&String, &u64)> = h.stats.refused_on.iter().collect();
        assert_eq!(on.len(), 1, "{on:?}");
        assert!(on[0].0.contains("\"a\"") && *on[0].1 == 1, "{on:?}");
        assert_eq!(h.stats.holds, 2);
        assert_eq!(h.stats.max_held_items, 2);
    }

    #[test]
    fn transactions_on_different_items_both_go_through() {
        let mut h = Holds::default();
        let t0 = Instant::now();
        assert!(send(&mut h, "TransactWriteItems", &tx(&["a", "b"], "t1"), t0).is_none());
        assert!(send(&mut h, "TransactWriteItems", &tx(&["c", "d"], "t2"), t0).is_none());
        assert_eq!(h.stats.total(), 0);
        assert_eq!(h.stats.max_held_items, 4);
    }

    #[test]
    fn an_item_is_free_once_the_answer_is_out() {
        let mut h = Holds::default();
        let t0 = Instant::now();
        let id = hold(&mut h, &tx(&["a"], "t1"));
        let during = t0 + Duration::from_millis(49);
        assert!(send(&mut h, "TransactWriteItems", &tx(&["a"], "t2"), during).is_some());
        let answered = t0 + Duration::from_millis(50);
        h.release(id, answered);
        // The caller's next transaction, sent on the answer, goes through.
        let after = answered + Duration::from_micros(1);
        assert!(send(&mut h, "TransactWriteItems", &tx(&["a"], "t3"), after).is_none());
        assert!(
            h.holds.len() == 1 && h.items.len() == 1,
            "the ended hold is forgotten"
        );
    }

    #[test]
    fn single_writes_on_a_held_item_conflict_and_reads_go_through() {
        let mut h = Holds::default();
        let t0 = Instant::now();
        assert!(send(&mut h, "TransactWriteItems", &tx(&["a"], "t1"), t0).is_none());
        let key = json!({"TableName": "T", "Key": {"pk": {"S": "a"}}});
        let put = json!({"TableName": "T", "Item": {"pk": {"S": "a"}, "n": {"N": "1"}}});
        for (op, body) in [
            ("UpdateItem", &key),
            ("DeleteItem", &key),
            ("PutItem", &put),
        ] {
            let answer = send(&mut h, op, body, t0).expect(op);
            assert_eq!(answer.0, 400);
            assert_eq!(
                kind(&answer).as_deref(),
                Some("TransactionConflictException"),
                "{op}"
            );
        }
        let other = json!({"TableName": "T", "Key": {"pk": {"S": "b"}}});
        assert!(send(&mut h, "UpdateItem", &other, t0).is_none());
        // The guide: a GetItem and an ongoing transaction both succeed.
        assert!(send(&mut h, "GetItem", &key, t0).is_none());
        let batch = json!({"RequestItems": {"T": {"Keys": [{"pk": {"S": "a"}}]}}});
        assert!(send(&mut h, "BatchGetItem", &batch, t0).is_none());
        let batch_write =
            json!({"RequestItems": {"T": [{"DeleteRequest": {"Key": {"pk": {"S": "a"}}}}]}});
        assert!(send(&mut h, "BatchWriteItem", &batch_write, t0).is_none());
        // A transactional read of the held item is cancelled.
        let get = json!({"TransactItems": [
            {"Get": {"TableName": "T", "Key": {"pk": {"S": "b"}}}},
            {"Get": {"TableName": "T", "Key": {"pk": {"S": "a"}}}}
        ]});
        let answer = send(&mut h, "TransactGetItems", &get, t0).expect("cancelled");
        assert_eq!(codes(&answer), ["None", "TransactionConflict"]);
        assert_eq!(h.stats.refused.values().sum::<u64>(), 4);
        assert_eq!(h.stats.refused["TransactGetItems"], 1);
    }

    #[test]
    fn a_retry_with_the_token_of_a_held_transaction_is_in_progress() {
        let mut h = Holds::default();
        let t0 = Instant::now();
        let first = tx(&["a"], "t1");
        let id = hold(&mut h, &first);
        let answer = send(&mut h, "TransactWriteItems", &first, t0).expect("in progress");
        assert_eq!(
            kind(&answer).as_deref(),
            Some("TransactionInProgressException")
        );
        assert_eq!(h.stats.in_progress, 1);
        assert!(h.stats.refused.is_empty());
        // Once the hold ends the retry goes through (to the emulator's
        // token handling: a replay).
        h.release(id, t0);
        let after = t0 + Duration::from_millis(51);
        assert!(send(&mut h, "TransactWriteItems", &first, after).is_none());
    }
}
