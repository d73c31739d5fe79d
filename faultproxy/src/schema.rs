//! The tables' key schemas, learned from the emulator's `DescribeTable`
//! answers: which partition (the capacity model) and which item (the
//! conflict model) a touched key is on.

use crate::protocol::{self, Touch};
use serde_json::Value;
use std::collections::{HashMap, HashSet};

#[derive(Default)]
pub(crate) struct KeySchemas {
    /// Table → its hash key attribute.
    hash: HashMap<String, String>,
    /// Table → its sort key attribute, for the tables that have one.
    sort: HashMap<String, String>,
    /// Tables whose schema could not be learned: every key is its own
    /// partition, and its own item as sent.
    unknown: HashSet<String>,
}

impl KeySchemas {
    /// Whether `table` was looked up already (learned or given up on).
    pub(crate) fn looked_up(&self, table: &str) -> bool {
        self.hash.contains_key(table) || self.unknown.contains(table)
    }

    /// Records what `DescribeTable` said of `table` (`None`: it failed).
    pub(crate) fn learn(&mut self, table: String, described: Option<&Value>) {
        let key = |kind| described.and_then(|d| protocol::key_attribute(d, kind));
        match key("HASH") {
            Some(hash) => {
                if let Some(sort) = key("RANGE") {
                    self.sort.insert(table.clone(), sort);
                }
                self.hash.insert(table, hash);
            }
            None => {
                self.unknown.insert(table);
            }
        }
    }

    pub(crate) fn partition(&self, touch: &Touch) -> String {
        protocol::partition(touch, &self.hash)
    }

    pub(crate) fn item(&self, touch: &Touch) -> String {
        protocol::item(touch, &self.hash, &self.sort)
    }
}
