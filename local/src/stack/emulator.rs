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
//!
//! # Threads of its own
//!
//! dynoxide runs each operation synchronously, under one mutex, on the
//! thread that polls its request handler. On the stack's runtime that
//! thread is one of the workers every other task needs: with two workers
//! (two cores), one running a transaction and the other waiting for the
//! mutex, no client, gateway or handler task could run at all, so the
//! function's own work and the emulator's took turns instead of running
//! side by side. Measured with `bench ratio` (transactional, 16 workers):
//! the like endpoint used 1.64 cores for 1,750 likes/s while the bare
//! transaction used 1.41 for 2,184/s; the local like path looked ~290 µs
//! of CPU dearer than its transaction, and the ratio read 0.80. DynamoDB
//! never runs in the function's process, so the emulator serves from a
//! runtime of its own ([`serve`]), whose blocked threads hold up only
//! the emulator's requests.

use anyhow::{Context, Result, anyhow};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Threads of the emulator's runtime: while one holds dynoxide's mutex,
/// the other reads and parses the next requests.
const EMULATOR_THREADS: usize = 2;

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

/// Serves `db` on `listener` from a runtime of its own (see [Threads of
/// its own](self#threads-of-its-own)) until `stopped` turns true or its
/// sender is dropped. The handle, on the caller's runtime, ends when the
/// emulator's runtime has.
pub(super) fn serve(
    listener: std::net::TcpListener,
    db: dynoxide::Database,
    mut stopped: watch::Receiver<bool>,
) -> Result<JoinHandle<()>> {
    listener
        .set_nonblocking(true)
        .context("the DynamoDB listener")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(EMULATOR_THREADS)
        .thread_name("dynoxide")
        .enable_all()
        .build()
        .context("the emulator's runtime")?;
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("dynoxide-serve".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "dynoxide's listener");
                        return;
                    }
                };
                let shutdown = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                if let Err(e) = dynoxide::server::serve_with_shutdown(listener, db, shutdown).await
                {
                    tracing::error!(error = %e, "dynoxide stopped");
                }
            });
            // Dropped here, off every async context; idle connections'
            // tasks go with it.
            drop(runtime);
            let _ = done.send(());
        })
        .context("the emulator's thread")?;
    Ok(tokio::spawn(async move {
        let _ = finished.await;
    }))
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

    /// The caller's runtime is idle (nothing drives it while this thread
    /// blocks on a socket), as its workers are when they all wait on
    /// dynoxide's lock: the emulator answers all the same.
    #[test]
    fn the_emulator_answers_while_the_callers_runtime_does_not_run() {
        use std::io::{Read, Write};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (stop, stopped) = watch::channel(false);
        let (addr, handle) = rt.block_on(async {
            let (db, _) = open(None).unwrap();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            (addr, serve(listener, db, stopped).unwrap())
        });
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let body = "{}";
        write!(
            s,
            "POST / HTTP/1.1\r\nHost: {addr}\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\n\
             Content-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\
             Authorization: AWS4-HMAC-SHA256 Credential=local/20261202/us-east-1/dynamodb/aws4_request, \
             SignedHeaders=host, Signature=0\r\nX-Amz-Date: 20261202T000000Z\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("TableNames"), "{answer}");
        stop.send(true).unwrap();
        rt.block_on(handle).unwrap();
    }

    #[test]
    fn two_in_memory_databases_are_apart() {
        let (_a, a) = open(None).unwrap();
        let (_b, b) = open(None).unwrap();
        assert_ne!(a, b);
    }
}
