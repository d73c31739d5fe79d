//! The embedded emulator's database, opened with the indexes dynoxide does
//! not make itself.
//!
//! dynoxide numbers each stream record with `MAX(sequence number)` over the
//! table's stream records, and reads a shard's records by sequence number,
//! with no index on either (dynoxide-rs 3.2): every write to a table with a
//! stream scans every record written before it, and records are never
//! trimmed. The Likes table has a stream (stream mode reads it, and a live
//! switch between the modes needs it there all along), so the local like
//! path slowed down with every like ever taken: measured with `wrk -c16`
//! on `likes-local serve`, 1,650 likes/s before the stream existed and 850
//! after it (a5eadbb), falling further the longer the stack ran; a
//! `MAX` over 50,000 records took 7.6 ms without an index and 4 µs with
//! one. DynamoDB's write path costs nothing for a stream.
//!
//! The in-memory database is therefore a named shared-cache one
//! (`file:…?mode=memory&cache=shared`), so that a second connection can
//! reach it to add the indexes once dynoxide has made its schema; a
//! `DYNOXIDE_DB_FILE` gets them the same way (kept in the file).

use anyhow::{Context, Result, anyhow};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The indexes dynoxide's stream queries need: the next sequence number of
/// a table, and a shard's records after a sequence number (both compare
/// sequence numbers as integers, so the indexes are on that expression).
const STREAM_INDEXES: &str = "
    CREATE INDEX IF NOT EXISTS likes_local_stream_seq
        ON _stream_records (table_name, CAST(sequence_number AS INTEGER));
    CREATE INDEX IF NOT EXISTS likes_local_stream_shard_seq
        ON _stream_records (table_name, shard_id, CAST(sequence_number AS INTEGER));";

/// Opens the embedded database: `file`, or a fresh in-memory one, with the
/// stream-record indexes. Returns it with the SQLite name it was opened by.
pub(super) fn open(file: Option<&Path>) -> Result<(dynoxide::Database, String)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = match file {
        Some(path) => path.to_string_lossy().into_owned(),
        None => format!(
            "file:likes-local-{}-{}?mode=memory&cache=shared",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ),
    };
    let db = dynoxide::Database::new(&name).map_err(|e| anyhow!("opening {name}: {e}"))?;
    // dynoxide has made its schema by now; the server is not serving yet,
    // so this connection is alone with it. Closed at once: an in-memory
    // database lives as long as dynoxide's own connection.
    rusqlite::Connection::open(&name)
        .and_then(|c| c.execute_batch(STREAM_INDEXES))
        .with_context(|| format!("indexing the stream records of {name}"))?;
    Ok((db, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan SQLite picks for dynoxide's two stream queries.
    fn plans(name: &str) -> Vec<String> {
        let c = rusqlite::Connection::open(name).unwrap();
        [
            "SELECT COALESCE(MAX(CAST(sequence_number AS INTEGER)), 0) + 1 FROM _stream_records WHERE table_name = 'T'",
            "SELECT event_name FROM _stream_records WHERE table_name = 'T' AND shard_id = 'S' AND CAST(sequence_number AS INTEGER) > 5 ORDER BY CAST(sequence_number AS INTEGER) ASC LIMIT 10",
        ]
        .iter()
        .map(|q| {
            let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {q}")).unwrap();
            let rows = stmt.query_map([], |r| r.get::<_, String>(3)).unwrap();
            rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
        })
        .collect()
    }

    #[test]
    fn stream_queries_use_an_index_in_memory_and_in_a_file() {
        let (db, name) = open(None).unwrap();
        for plan in plans(&name) {
            assert!(plan.contains("INDEX likes_local_stream"), "{plan}");
        }
        drop(db);
        let dir = std::env::temp_dir().join(format!("likes-emulator-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("db.sqlite");
        let (db, name) = open(Some(&file)).unwrap();
        for plan in plans(&name) {
            assert!(plan.contains("INDEX likes_local_stream"), "{plan}");
        }
        drop(db);
        // Opened again, the file keeps them.
        let (_db, name) = open(Some(&file)).unwrap();
        assert!(plans(&name)[0].contains("INDEX likes_local_stream"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn two_in_memory_databases_are_apart() {
        let (_a, a) = open(None).unwrap();
        let (_b, b) = open(None).unwrap();
        assert_ne!(a, b);
    }
}
