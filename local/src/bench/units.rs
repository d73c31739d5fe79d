//! Write units by whose likes they served, from the fault proxy's per-key
//! counts ([`faultproxy::KeyLoad`]): each variant's cost per like is then
//! its own, not an average over the viral and the background likes.

use super::VIRAL;

/// Write units the proxy counted, by whose likes they served.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Units {
    /// The viral reel's likes (and the naive counter).
    pub viral: f64,
    /// The background reels' likes.
    pub background: f64,
    /// The aggregator's checkpoints (stream mode): every like's.
    pub checkpoints: f64,
    /// Neither (expected 0).
    pub other: f64,
}

/// Attributes every partition key's write units (`table/key` as the proxy
/// names them) to the viral reel's likes or the background likes: counter
/// items by the reel they belong to, like rows by their user (viral users
/// are `{prefix}v…`, background users `{prefix}b…`), `Idempotency-Key`
/// records to the viral likes (the only ones that carry a key), and the
/// naive counter item to the viral likes.
pub(super) fn attribute(
    loads: &[faultproxy::KeyLoad],
    counters: &str,
    likes: &str,
    writers: Option<&str>,
    prefix: &str,
) -> Units {
    let mut u = Units::default();
    for load in loads {
        let (table, key) = load
            .partition
            .split_once('/')
            .unwrap_or(("", &load.partition));
        if table == counters && key.starts_with("agg#") {
            u.checkpoints += load.write_units;
            continue;
        }
        let viral = if table == counters {
            if key == format!("naive#{VIRAL}") || key.starts_with("idem#") {
                Some(true)
            } else {
                likes::keys::reel_of_counter_key(key).map(|r| r.as_str() == VIRAL)
            }
        } else if Some(table) == writers && key.starts_with("l#") {
            // Stream mode's writer items of a reel.
            Some(&key[2..] == VIRAL)
        } else if table == likes {
            match key.strip_prefix(prefix).and_then(|k| k.chars().next()) {
                Some('v') => Some(true),
                Some('b') => Some(false),
                _ => None,
            }
        } else {
            None
        };
        match viral {
            Some(true) => u.viral += load.write_units,
            Some(false) => u.background += load.write_units,
            None => u.other += load.write_units,
        }
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(partition: &str, write_units: f64) -> faultproxy::KeyLoad {
        faultproxy::KeyLoad {
            partition: partition.into(),
            write_units,
            ..Default::default()
        }
    }

    #[test]
    fn units_are_attributed_by_whose_like_they_served() {
        let loads = [
            load("C/004#reel#viral#likes", 2.0),
            load("C/reel#viral#settings", 1.0),
            load("C/idem#abc", 2.0),
            load("C/naive#viral", 1.0),
            load("L/r1v17", 2.0),
            load("C/003#reel#bg4#likes", 2.0),
            load("C/reel#bg4#settings", 1.0),
            load("L/r1b3", 2.0),
            // A user of another run (r10 is not r1's), another table, a
            // bookkeeping key: none of the two.
            load("L/r10v1", 2.0),
            load("X/r1v1", 4.0),
            load("C/recon#run", 1.0),
            load("C/agg#0123", 2.0),
        ];
        assert_eq!(
            attribute(&loads, "C", "L", Some("W"), "r1"),
            Units {
                viral: 8.0,
                background: 5.0,
                checkpoints: 2.0,
                other: 7.0
            }
        );
    }
}
