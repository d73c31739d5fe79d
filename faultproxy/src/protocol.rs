//! The parts of the DynamoDB JSON protocol (awsJson1_0) the proxy needs:
//! which operation a request is, which items it touches at what cost, and
//! the error bodies DynamoDB answers with.

use serde_json::{Map, Value, json};
use std::collections::HashMap;

/// One item a request reads or writes, with the capacity it costs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Touch {
    pub table: String,
    /// The item's key as sent: its `Key`, or for a put the whole `Item`,
    /// whose key attributes the learned key schema picks out ([`item`]).
    pub key: Map<String, Value>,
    pub write_units: f64,
    pub read_units: f64,
}

/// `X-Amz-Target: DynamoDB_20120810.TransactWriteItems` → `TransactWriteItems`.
pub(crate) fn operation(target: Option<&str>) -> String {
    target
        .and_then(|t| t.rsplit_once('.'))
        .map(|(_, op)| op.to_owned())
        .unwrap_or_else(|| "Unknown".to_owned())
}

pub(crate) fn is_transaction(op: &str) -> bool {
    matches!(op, "TransactWriteItems" | "TransactGetItems")
}

/// Write units of writing `item` (1 per started KB of its JSON form, the
/// proxy's stand-in for DynamoDB's item size).
fn item_units(item: Option<&Value>) -> f64 {
    let len = item.map(|i| i.to_string().len()).unwrap_or(0);
    (len.max(1) as f64 / 1024.0).ceil()
}

/// Bytes of an attribute value as DynamoDB sizes it, near enough: a binary
/// value's decoded length (base64 in the request), a string's or number's
/// text, the sum of a list's, map's or set's members.
fn value_bytes(v: &Value) -> usize {
    let Some((kind, inner)) = v.as_object().and_then(|o| o.iter().next()) else {
        return 0;
    };
    match (kind.as_str(), inner) {
        ("B", Value::String(b)) => b.len() * 3 / 4,
        (_, Value::String(t)) => t.len(),
        ("L", Value::Array(a)) => a.iter().map(value_bytes).sum(),
        ("M", Value::Object(m)) => m.iter().map(|(k, v)| k.len() + value_bytes(v)).sum(),
        (_, Value::Array(a)) => a
            .iter()
            .map(|m| {
                m.as_str().map_or(0, |t| {
                    if kind == "BS" {
                        t.len() * 3 / 4
                    } else {
                        t.len()
                    }
                })
            })
            .sum(),
        _ => 1,
    }
}

/// Write units of an update: at least the key and every value it writes
/// (1 per started KB). The proxy never reads the item, so what the item
/// already holds is not counted: a lower bound, exact for an item the
/// update rewrites whole (a sketch replaced, a counter added to).
fn update_units(inner: &Value) -> f64 {
    let sum = |v: Option<&Value>| -> usize {
        v.and_then(Value::as_object)
            .map_or(0, |m| m.iter().map(|(k, v)| k.len() + value_bytes(v)).sum())
    };
    let bytes = sum(inner.get("Key")) + sum(inner.get("ExpressionAttributeValues"));
    (bytes.max(1) as f64 / 1024.0).ceil()
}

fn object(v: Option<&Value>) -> Map<String, Value> {
    v.and_then(Value::as_object).cloned().unwrap_or_default()
}

fn table(v: &Value) -> String {
    v.get("TableName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// The items `op` touches. Transactional items cost twice (DynamoDB's
/// rule: 2 write units per KB written, 2 read units per 4 KB read), a
/// `ConditionCheck` included. Operations on no single item (Scan, Query,
/// table management) touch none.
/// What a `Query` answered with `answer` read: the partition it named
/// (its key condition's equality on the hash key) and DynamoDB's units for
/// the items returned (their sizes summed, rounded up to 4 KB: one unit
/// each consistent, half eventually consistent, one 4 KB at the least),
/// with how many items; `None` for an answer without items or a request
/// whose partition cannot be read.
pub(crate) fn query_read(body: &Value, answer: &Value) -> Option<(Touch, u64)> {
    let items = answer.get("Items")?.as_array()?;
    let cond = body.get("KeyConditionExpression")?.as_str()?;
    let first = cond.split(" AND ").next()?.split(" and ").next()?;
    let (name, placeholder) = first.split_once('=')?;
    let (name, placeholder) = (name.trim(), placeholder.trim());
    let name = match name.strip_prefix('#') {
        Some(_) => body
            .get("ExpressionAttributeNames")?
            .get(name)?
            .as_str()?
            .to_owned(),
        None => name.to_owned(),
    };
    let value = body
        .get("ExpressionAttributeValues")?
        .get(placeholder)?
        .clone();
    let bytes: usize = items.iter().map(item_size).sum();
    let blocks = bytes.div_ceil(4096).max(1) as f64;
    let consistent = body.get("ConsistentRead").and_then(Value::as_bool) == Some(true);
    let mut key = Map::new();
    key.insert(name, value);
    Some((
        Touch {
            table: table(body),
            key,
            write_units: 0.0,
            read_units: if consistent { blocks } else { blocks / 2.0 },
        },
        items.len() as u64,
    ))
}

/// DynamoDB's size of an item as JSON gives it: each attribute's name and
/// value (strings and binaries by their bytes, numbers about one byte per
/// two digits, sets and documents by their members).
fn item_size(item: &Value) -> usize {
    item.as_object()
        .map_or(0, |m| m.iter().map(|(k, v)| k.len() + value_size(v)).sum())
}

fn value_size(v: &Value) -> usize {
    let Some((kind, inner)) = v.as_object().and_then(|m| m.iter().next()) else {
        return 0;
    };
    match kind.as_str() {
        "S" => inner.as_str().map_or(0, str::len),
        "N" => inner.as_str().map_or(0, |n| n.len().div_ceil(2) + 1),
        "B" => inner.as_str().map_or(0, |b| b.len() * 3 / 4),
        "BOOL" | "NULL" => 1,
        "SS" | "NS" | "BS" => inner.as_array().map_or(0, |a| {
            a.iter().map(|x| x.as_str().map_or(0, str::len)).sum()
        }),
        "M" => {
            3 + inner.as_object().map_or(0, |m| {
                m.iter().map(|(k, v)| k.len() + 1 + value_size(v)).sum()
            })
        }
        "L" => {
            3 + inner
                .as_array()
                .map_or(0, |a| a.iter().map(|x| 1 + value_size(x)).sum())
        }
        _ => 0,
    }
}

pub(crate) fn touches(op: &str, body: &Value) -> Vec<Touch> {
    let write = |table: String, key: Map<String, Value>, units: f64| Touch {
        table,
        key,
        write_units: units,
        read_units: 0.0,
    };
    let read = |table: String, key: Map<String, Value>, units: f64| Touch {
        table,
        key,
        write_units: 0.0,
        read_units: units,
    };
    let consistent = |v: &Value| v.get("ConsistentRead").and_then(Value::as_bool) == Some(true);
    match op {
        "PutItem" => vec![write(
            table(body),
            object(body.get("Item")),
            item_units(body.get("Item")),
        )],
        "UpdateItem" => vec![write(
            table(body),
            object(body.get("Key")),
            update_units(body),
        )],
        "DeleteItem" => vec![write(table(body), object(body.get("Key")), 1.0)],
        "GetItem" => vec![read(
            table(body),
            object(body.get("Key")),
            if consistent(body) { 1.0 } else { 0.5 },
        )],
        "TransactWriteItems" => items(body)
            .iter()
            .filter_map(|ti| {
                let (kind, inner) = ti.as_object()?.iter().next()?;
                let (key, units) = match kind.as_str() {
                    "Put" => (object(inner.get("Item")), item_units(inner.get("Item"))),
                    "Update" => (object(inner.get("Key")), update_units(inner)),
                    _ => (object(inner.get("Key")), 1.0),
                };
                Some(write(table(inner), key, 2.0 * units))
            })
            .collect(),
        "TransactGetItems" => items(body)
            .iter()
            .filter_map(|ti| {
                let inner = ti.get("Get")?;
                Some(read(table(inner), object(inner.get("Key")), 2.0))
            })
            .collect(),
        "BatchGetItem" => object(body.get("RequestItems"))
            .into_iter()
            .flat_map(|(t, spec)| {
                let units = if consistent(&spec) { 1.0 } else { 0.5 };
                spec.get("Keys")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |k| read(t.clone(), object(Some(&k)), units))
                    .collect::<Vec<_>>()
            })
            .collect(),
        "BatchWriteItem" => object(body.get("RequestItems"))
            .into_iter()
            .flat_map(|(t, reqs)| {
                reqs.as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|r| {
                        if let Some(p) = r.get("PutRequest") {
                            Some(write(
                                t.clone(),
                                object(p.get("Item")),
                                item_units(p.get("Item")),
                            ))
                        } else {
                            r.get("DeleteRequest")
                                .map(|d| write(t.clone(), object(d.get("Key")), 1.0))
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn items(body: &Value) -> Vec<Value> {
    body.get("TransactItems")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The attribute of a `DescribeTable` answer's key schema whose `KeyType`
/// is `kind` (`HASH` or `RANGE`).
pub(crate) fn key_attribute(described: &Value, kind: &str) -> Option<String> {
    described["Table"]["KeySchema"]
        .as_array()?
        .iter()
        .find(|k| k["KeyType"] == kind)?["AttributeName"]
        .as_str()
        .map(str::to_owned)
}

/// The partition a touched item lives on, as text: `table/value` of its
/// hash key attribute when the table's key schema is known, else of its
/// whole key (every item its own partition).
pub(crate) fn partition(touch: &Touch, hash_keys: &HashMap<String, String>) -> String {
    let value = match hash_keys
        .get(&touch.table)
        .and_then(|attr| touch.key.get(attr))
    {
        Some(v) => scalar(v),
        None => {
            let mut parts: Vec<String> = touch
                .key
                .iter()
                .map(|(k, v)| format!("{k}={}", scalar(v)))
                .collect();
            parts.sort();
            parts.join(",")
        }
    };
    format!("{}/{}", touch.table, value)
}

/// The item a touch is on, as text: its table and the values of its key
/// attributes (hash, then sort) when the table's key schema is known, so a
/// put's whole `Item` and an update's `Key` name the same item. Without a
/// schema, the whole key as sent. JSON, so no two items share a name.
pub(crate) fn item(
    touch: &Touch,
    hash_keys: &HashMap<String, String>,
    sort_keys: &HashMap<String, String>,
) -> String {
    let key: Vec<(&String, &Value)> = match hash_keys.get(&touch.table) {
        Some(hash) => [Some(hash), sort_keys.get(&touch.table)]
            .into_iter()
            .flatten()
            .filter_map(|attr| touch.key.get_key_value(attr))
            .collect(),
        None => {
            let mut all: Vec<_> = touch.key.iter().collect();
            all.sort_by(|a, b| a.0.cmp(b.0));
            all
        }
    };
    json!([touch.table, key]).to_string()
}

/// `{"S": "x"}` → `x`; other types as their JSON.
fn scalar(v: &Value) -> String {
    match v.as_object().and_then(|o| o.iter().next()) {
        Some((t, Value::String(s))) if t == "S" || t == "N" => s.clone(),
        _ => v.to_string(),
    }
}

const DDB: &str = "com.amazonaws.dynamodb.v20120810";

/// An error answer: (status, body).
pub(crate) fn error(status: u16, kind: &str, message: &str) -> (u16, Value) {
    let prefix = match kind {
        "ThrottlingException" | "ServiceUnavailable" => "com.amazon.coral.availability",
        _ => DDB,
    };
    (
        status,
        json!({ "__type": format!("{prefix}#{kind}"), "message": message }),
    )
}

pub(crate) fn throughput_exceeded() -> (u16, Value) {
    error(
        400,
        "ProvisionedThroughputExceededException",
        "The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API.",
    )
}

pub(crate) fn throttling() -> (u16, Value) {
    error(
        400,
        "ThrottlingException",
        "Rate of requests exceeds the allowed throughput.",
    )
}

/// `TransactionCanceledException` whose reasons are `code` for the items at
/// `hit` and `None` for the rest, as DynamoDB lists one reason per item.
pub(crate) fn cancelled(items: usize, hit: &[usize], code: &str, message: &str) -> (u16, Value) {
    let codes: Vec<&str> = (0..items.max(1))
        .map(|i| if hit.contains(&i) { code } else { "None" })
        .collect();
    let reasons: Vec<Value> = codes
        .iter()
        .map(|c| {
            if *c == "None" {
                json!({ "Code": "None" })
            } else {
                json!({ "Code": c, "Message": message })
            }
        })
        .collect();
    (
        400,
        json!({
            "__type": format!("{DDB}#TransactionCanceledException"),
            "Message": format!(
                "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
                codes.join(", ")
            ),
            "CancellationReasons": reasons,
        }),
    )
}

const CONFLICT_MESSAGE: &str = "Transaction is ongoing for the item";

/// A transaction cancelled because the items at `hit` are in another
/// transaction in flight.
pub(crate) fn conflict_cancelled(items: usize, hit: &[usize]) -> (u16, Value) {
    cancelled(items, hit, "TransactionConflict", CONFLICT_MESSAGE)
}

/// A single-item write refused because a transaction in flight holds the
/// item.
pub(crate) fn transaction_conflict() -> (u16, Value) {
    error(400, "TransactionConflictException", CONFLICT_MESSAGE)
}

/// A `TransactWriteItems` refused because a transaction with its
/// `ClientRequestToken` is still in progress.
pub(crate) fn transaction_in_progress() -> (u16, Value) {
    error(
        400,
        "TransactionInProgressException",
        "The transaction with the given request token is already in progress.",
    )
}

/// The `ClientRequestToken` of a `TransactWriteItems` request.
pub(crate) fn client_token(body: &Value) -> Option<&str> {
    body.get("ClientRequestToken").and_then(Value::as_str)
}

/// The number of items of a transaction request.
pub(crate) fn transaction_items(body: &Value) -> usize {
    items(body).len()
}

/// The error type name of an answer body (`IdempotentParameterMismatchException`).
pub(crate) fn error_kind(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let t = v.get("__type")?.as_str()?;
    Some(t.rsplit('#').next().unwrap_or(t).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactional_items_cost_double() {
        let body = json!({
            "TransactItems": [
                {"Put": {"TableName": "Likes", "Item": {"user_id": {"S": "u1"}, "reel_id": {"S": "r1"}}}},
                {"Update": {"TableName": "Counters", "Key": {"pk": {"S": "003#reel#r1#likes"}}}},
                {"ConditionCheck": {"TableName": "Counters", "Key": {"pk": {"S": "reel#r1#settings"}}}}
            ],
            "ClientRequestToken": "t"
        });
        let t = touches("TransactWriteItems", &body);
        assert_eq!(t.len(), 3);
        assert!(
            t.iter()
                .all(|t| t.write_units == 2.0 && t.read_units == 0.0)
        );
        let keys = HashMap::from([
            ("Counters".to_owned(), "pk".to_owned()),
            ("Likes".to_owned(), "user_id".to_owned()),
        ]);
        assert_eq!(partition(&t[0], &keys), "Likes/u1");
        assert_eq!(partition(&t[1], &keys), "Counters/003#reel#r1#likes");
        // Unknown schema: the whole key is the partition.
        assert_eq!(
            partition(&t[0], &HashMap::new()),
            "Likes/reel_id=r1,user_id=u1"
        );
    }

    #[test]
    fn an_update_costs_at_least_what_it_writes() {
        // A 2,184-byte sketch written by an update: 3 KB, 6 units in a
        // transaction (it was charged 2 whatever its size).
        let sketch =
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, vec![7u8; 2184]);
        let body = json!({
            "TransactItems": [
                {"Update": {"TableName": "Views", "Key": {"pk": {"S": "v#r1"}, "sk": {"S": "all#w1"}},
                 "UpdateExpression": "ADD #v :v SET #h = :h",
                 "ExpressionAttributeValues": {":v": {"N": "12"}, ":h": {"B": sketch}}}},
                {"Update": {"TableName": "Counters", "Key": {"pk": {"S": "003#reel#r1#likes"}},
                 "ExpressionAttributeValues": {":d": {"N": "1"}}}}
            ]
        });
        let t = touches("TransactWriteItems", &body);
        assert_eq!(t[0].write_units, 6.0);
        assert_eq!(t[1].write_units, 2.0);
        let single = touches("UpdateItem", &body["TransactItems"][0]["Update"]);
        assert_eq!(single[0].write_units, 3.0);
    }

    #[test]
    fn an_item_is_named_by_its_full_primary_key() {
        let tx = json!({
            "TransactItems": [
                {"Put": {"TableName": "Likes", "Item": {"user_id": {"S": "u1"}, "reel_id": {"S": "r1"}, "at": {"N": "5"}}}},
                {"Delete": {"TableName": "Likes", "Key": {"reel_id": {"S": "r1"}, "user_id": {"S": "u1"}}}},
                {"Delete": {"TableName": "Likes", "Key": {"user_id": {"S": "u1"}, "reel_id": {"S": "r2"}}}}
            ]
        });
        let t = touches("TransactWriteItems", &tx);
        let hash = HashMap::from([("Likes".to_owned(), "user_id".to_owned())]);
        let sort = HashMap::from([("Likes".to_owned(), "reel_id".to_owned())]);
        let names: Vec<String> = t.iter().map(|t| item(t, &hash, &sort)).collect();
        // A put's whole item and a delete's key name the same item; the
        // sort key tells items of one partition apart.
        assert_eq!(names[0], names[1]);
        assert_ne!(names[1], names[2]);
        assert_eq!(partition(&t[1], &hash), partition(&t[2], &hash));
        // Without a schema only keys sent alike match, in any order.
        let none = HashMap::new();
        assert_ne!(item(&t[0], &none, &none), item(&t[1], &none, &none));
        let swapped = touches(
            "DeleteItem",
            &json!({"TableName": "Likes", "Key": {"user_id": {"S": "u1"}, "reel_id": {"S": "r1"}}}),
        );
        assert_eq!(item(&t[1], &none, &none), item(&swapped[0], &none, &none));
        // The schema as DescribeTable tells it.
        let described = json!({"Table": {"KeySchema": [
            {"AttributeName": "user_id", "KeyType": "HASH"},
            {"AttributeName": "reel_id", "KeyType": "RANGE"}
        ]}});
        assert_eq!(
            key_attribute(&described, "HASH").as_deref(),
            Some("user_id")
        );
        assert_eq!(
            key_attribute(&described, "RANGE").as_deref(),
            Some("reel_id")
        );
        assert_eq!(key_attribute(&json!({}), "HASH"), None);
    }

    #[test]
    fn reads_cost_by_consistency() {
        let body = json!({"RequestItems": {"Counters": {"Keys": [{"pk": {"S": "a"}}, {"pk": {"S": "b"}}], "ConsistentRead": true}}});
        let t = touches("BatchGetItem", &body);
        assert_eq!(t.len(), 2);
        assert!(t.iter().all(|t| t.read_units == 1.0));
        let g = touches(
            "GetItem",
            &json!({"TableName": "T", "Key": {"pk": {"S": "a"}}}),
        );
        assert_eq!(g[0].read_units, 0.5);
        assert!(touches("Scan", &json!({"TableName": "T"})).is_empty());
    }

    #[test]
    fn cancellation_lists_one_reason_per_item() {
        let (status, body) = conflict_cancelled(3, &[1]);
        assert_eq!(status, 400);
        let codes: Vec<&str> = body["CancellationReasons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["Code"].as_str().unwrap())
            .collect();
        assert_eq!(codes, ["None", "TransactionConflict", "None"]);
        assert_eq!(
            error_kind(body.to_string().as_bytes()).as_deref(),
            Some("TransactionCanceledException")
        );
        assert_eq!(operation(Some("DynamoDB_20120810.GetItem")), "GetItem");
    }

    #[test]
    fn a_query_is_charged_for_what_it_returned() {
        let body = json!({
            "TableName": "V",
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": "l#r"}},
            "ConsistentRead": true,
        });
        // Three items of ~2 KB: 6 KB, two units consistent.
        let big = "x".repeat(2_000);
        let item = json!({"pk": {"S": "l#r"}, "sk": {"S": "w#1"}, "blob": {"S": big}});
        let answer = json!({"Items": [item.clone(), item.clone(), item]});
        let (t, n) = query_read(&body, &answer).unwrap();
        assert_eq!((t.table.as_str(), n, t.read_units), ("V", 3, 2.0));
        assert_eq!(t.key.get("pk"), Some(&json!({"S": "l#r"})));
        // Nothing returned still costs a 4 KB read; eventually consistent, half.
        let mut eventual = body.clone();
        eventual["ConsistentRead"] = json!(false);
        let (t, n) = query_read(&eventual, &json!({"Items": []})).unwrap();
        assert_eq!((n, t.read_units), (0, 0.5));
    }
}
