//! The one translation of SDK errors into [`Error`], and the reading of a
//! transaction's answer: a cancelled one's reasons, for each kind of
//! transaction, and what a committed like transaction's capacity says.

use crate::error::Error;
use crate::store::{RetryReason, TxResult};
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::ConsumedCapacity;
use aws_sdk_dynamodb::types::error::TransactionCanceledException;
use std::fmt::Debug;

/// The one translation of SDK errors into [`Error`], DynamoDB's and the
/// views log's (Kinesis: `crate::store::kinesis`). The SDK has already
/// retried what it retries (throttling, 5xx, timeouts) by the time an error
/// reaches here.
pub(crate) fn translate<E, R>(op: &'static str, err: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: Debug,
{
    let mapped = match &err {
        SdkError::ServiceError(se) => service_error(se.err().code()),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            Error::Unavailable
        }
        _ => Error::Internal,
    };
    match mapped {
        Error::Internal => {
            return Error::internal("AWS call failed", format_args!("{op}: {err:?}"));
        }
        _ => {
            tracing::warn!(op, outcome = mapped.code(), error = %aws_sdk_dynamodb::error::DisplayErrorContext(&err), "AWS call failed")
        }
    }
    mapped
}

/// What a service error's code means for the caller.
fn service_error(code: Option<&str>) -> Error {
    match code {
        Some(
            "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            // Kinesis: a shard's or the account's limits, and the KMS key's
            // request quota behind an encrypted stream.
            | "LimitExceededException"
            | "KMSThrottlingException",
        ) => Error::Throttled,
        // A single-item write (or a transactional read) of an item that a
        // transaction holds in flight, and a transaction whose token's
        // first attempt is still in progress: contention, worth a retry
        // later, not a fault of ours (DynamoDB developer guide,
        // "Transaction conflict handling").
        Some("TransactionConflictException" | "TransactionInProgressException") => Error::Contended,
        Some(
            "InternalServerError"
            | "ServiceUnavailable"
            | "ServiceUnavailableException"
            | "InternalFailure",
        ) => Error::Unavailable,
        // A missing table is an outage of this service, not a bug in the
        // request: readiness checks and clients should see 503.
        Some("ResourceNotFoundException") => Error::Unavailable,
        _ => Error::Internal,
    }
}

/// A request the SDK's builder refused (a required field missing): a fault
/// of ours, logged with `what` was being built.
pub(super) fn request_build_failed(what: &str, e: &dyn Debug) -> Error {
    Error::internal(
        "could not build a DynamoDB request",
        format_args!("{what}: {e:?}"),
    )
}

/// The reason codes of a cancelled transaction, one per item in order.
pub(super) fn cancellation_codes(c: &TransactionCanceledException) -> Vec<&str> {
    c.cancellation_reasons()
        .iter()
        .map(|r| r.code().unwrap_or("None"))
        .collect()
}

/// Whether a cancelled transaction's reasons include throttling.
pub(super) fn throttled(codes: &[&str]) -> bool {
    codes
        .iter()
        .any(|c| matches!(*c, "ThrottlingError" | "ProvisionedThroughputExceeded"))
}

/// What a cancelled like transaction's reasons mean. They come one per
/// action, in the order `write_like` builds them: the like row first, the
/// reel's shard at `shard_at` (transactional mode), the `Idempotency-Key`
/// record (keyed requests) at `record_at` (after the shard's increment in
/// transactional mode; right after the row in stream mode, which writes no
/// shard).
///
/// A conflict or throttling on the shard is the reel's (other users' likes
/// hold it, or its partition is full); on the caller's own row or record
/// only, it is the caller's own (`RetryReason::OwnConflict`,
/// `OwnThrottled`): retried all the same, but it must never grow the reel,
/// or one user racing themselves could grow any reel.
pub(super) fn like_tx_cancellation(
    codes: &[&str],
    shard_at: Option<usize>,
    record_at: usize,
) -> Result<TxResult, Error> {
    if codes.get(record_at) == Some(&"ConditionalCheckFailed") {
        return Ok(TxResult::KeyUsed);
    }
    if codes.first() == Some(&"ConditionalCheckFailed") {
        return Ok(TxResult::AlreadyInState);
    }
    let shard = shard_at.and_then(|i| codes.get(i)).copied();
    if shard == Some("TransactionConflict") {
        return Ok(TxResult::Retry(RetryReason::Conflict));
    }
    if shard.is_some_and(|c| throttled(&[c])) {
        return Ok(TxResult::Retry(RetryReason::Throttled));
    }
    if codes.contains(&"TransactionConflict") {
        return Ok(TxResult::Retry(RetryReason::OwnConflict));
    }
    if throttled(codes) {
        return Ok(TxResult::Retry(RetryReason::OwnThrottled));
    }
    // ValidationError, ItemCollectionSizeLimitExceeded or a reason we do not
    // know: retrying would not help.
    Err(Error::internal(
        "transaction cancelled for an unexpected reason",
        format_args!("{codes:?}"),
    ))
}

/// Why one of the resharder's or reconciler's transactions (a fold, a stray
/// item's removal, a correction) did not commit. Each is conditioned on
/// what its caller read, so a failed condition is an answer, not an error.
pub(super) enum MaintenanceTxFailure {
    /// The condition of the item at this index failed.
    Condition(usize),
    /// Worth another attempt after backoff.
    Retry(RetryReason),
    /// The token was used before with another body.
    Mismatch,
}

/// Reads a failed maintenance `TransactWriteItems` (`what` names it in the
/// logs): failures worth acting on, or an [`Error`] for the rest.
pub(super) fn maintenance_tx_failure<R: Debug>(
    what: &'static str,
    err: SdkError<TransactWriteItemsError, R>,
) -> Result<MaintenanceTxFailure, Error> {
    let se = match err {
        SdkError::ServiceError(se) => se,
        other => return Err(translate("TransactWriteItems", other)),
    };
    match se.err() {
        TransactWriteItemsError::TransactionCanceledException(c) => {
            let codes = cancellation_codes(c);
            if let Some(i) = codes.iter().position(|c| *c == "ConditionalCheckFailed") {
                Ok(MaintenanceTxFailure::Condition(i))
            } else if codes.contains(&"TransactionConflict") {
                Ok(MaintenanceTxFailure::Retry(RetryReason::Conflict))
            } else if throttled(&codes) {
                Ok(MaintenanceTxFailure::Retry(RetryReason::Throttled))
            } else {
                Err(Error::internal(
                    "transaction cancelled for an unexpected reason",
                    format_args!("{what}: {codes:?}"),
                ))
            }
        }
        TransactWriteItemsError::TransactionInProgressException(_) => {
            Ok(MaintenanceTxFailure::Retry(RetryReason::InProgress))
        }
        TransactWriteItemsError::IdempotentParameterMismatchException(_) => {
            Ok(MaintenanceTxFailure::Mismatch)
        }
        _ => match translate("TransactWriteItems", SdkError::ServiceError(se)) {
            Error::Throttled => Ok(MaintenanceTxFailure::Retry(RetryReason::Throttled)),
            other => Err(other),
        },
    }
}

/// What a committed like transaction's `ConsumedCapacity` says about it.
///
/// DynamoDB documents, for `ClientRequestToken` ("TransactWriteItems", API
/// reference): "If the ReturnConsumedCapacity parameter is set, then the
/// initial TransactWriteItems call returns the amount of write capacity
/// units consumed in making the changes. Subsequent TransactWriteItems calls
/// with the same client token return the number of read capacity units
/// consumed in reading the item." With `INDEXES` the answer holds a
/// `Capacity` per table, whose `ReadCapacityUnits` and `WriteCapacityUnits`
/// are documented ("the total number of read/write capacity units consumed
/// on a table"); the aggregate's fields of the same names are read too.
/// Write units anywhere: applied by this call. Read units and no write
/// units: a replay. Neither (only `CapacityUnits`, or nothing): the two
/// cannot be told apart, and the answer says so.
pub(super) fn commit_kind(capacities: &[ConsumedCapacity]) -> TxResult {
    let (mut read, mut wrote) = (false, false);
    for c in capacities {
        let table = c.table();
        let units = [
            (c.read_capacity_units(), c.write_capacity_units()),
            (
                table.and_then(|t| t.read_capacity_units()),
                table.and_then(|t| t.write_capacity_units()),
            ),
        ];
        for (r, w) in units {
            read |= r.unwrap_or(0.0) > 0.0;
            wrote |= w.unwrap_or(0.0) > 0.0;
        }
    }
    match (wrote, read) {
        (true, _) => TxResult::Committed { replayed: false },
        (false, true) => TxResult::Committed { replayed: true },
        (false, false) => TxResult::CommittedUnsure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_outside_a_transaction_is_contention_not_a_fault() {
        // What DynamoDB answers a PutItem/UpdateItem/DeleteItem on an item
        // a transaction holds, and a token whose first attempt is still in
        // flight: a 429 the client retries, never a 500.
        for code in [
            "TransactionConflictException",
            "TransactionInProgressException",
        ] {
            assert_eq!(service_error(Some(code)), Error::Contended, "{code}");
        }
        assert_eq!(service_error(Some("ThrottlingException")), Error::Throttled);
        assert_eq!(service_error(Some("SomethingElse")), Error::Internal);
    }

    #[test]
    fn cancellation_reasons_are_classified() {
        // A transactional like: the row, the shard, the key's record.
        let ok = |codes: &[&str]| like_tx_cancellation(codes, Some(1), 2).unwrap();
        assert_eq!(
            ok(&["ConditionalCheckFailed", "None"]),
            TxResult::AlreadyInState
        );
        assert_eq!(
            ok(&["None", "TransactionConflict"]),
            TxResult::Retry(RetryReason::Conflict)
        );
        assert_eq!(
            ok(&["TransactionConflict", "TransactionConflict"]),
            TxResult::Retry(RetryReason::Conflict)
        );
        assert_eq!(
            ok(&["None", "ThrottlingError"]),
            TxResult::Retry(RetryReason::Throttled)
        );
        // The caller's own row or record only: not the reel's contention
        // (these were `Conflict` and `Throttled`, which grew the reel).
        assert_eq!(
            ok(&["TransactionConflict", "None"]),
            TxResult::Retry(RetryReason::OwnConflict)
        );
        assert_eq!(
            ok(&["None", "None", "TransactionConflict"]),
            TxResult::Retry(RetryReason::OwnConflict)
        );
        assert_eq!(
            ok(&["ProvisionedThroughputExceeded", "None"]),
            TxResult::Retry(RetryReason::OwnThrottled)
        );
        // Stream mode writes no shard: every conflict is the caller's own.
        assert_eq!(
            like_tx_cancellation(&["TransactionConflict", "None"], None, 1).unwrap(),
            TxResult::Retry(RetryReason::OwnConflict)
        );
        assert_eq!(
            like_tx_cancellation(&["ValidationError", "None"], Some(1), 2),
            Err(Error::Internal)
        );
    }

    #[test]
    fn a_commit_is_told_by_the_documented_capacity_fields() {
        use aws_sdk_dynamodb::types::Capacity;
        let table = |r: Option<f64>, w: Option<f64>| {
            ConsumedCapacity::builder()
                .table_name("t")
                .capacity_units(2.0)
                .table(
                    Capacity::builder()
                        .capacity_units(2.0)
                        .set_read_capacity_units(r)
                        .set_write_capacity_units(w)
                        .build(),
                )
                .build()
        };
        assert_eq!(
            commit_kind(&[table(None, Some(2.0))]),
            TxResult::Committed { replayed: false }
        );
        assert_eq!(
            commit_kind(&[table(Some(2.0), None)]),
            TxResult::Committed { replayed: true }
        );
        // The aggregate's own split counts too.
        let aggregate = ConsumedCapacity::builder()
            .capacity_units(2.0)
            .read_capacity_units(2.0)
            .build();
        assert_eq!(
            commit_kind(&[aggregate]),
            TxResult::Committed { replayed: true }
        );
        // Only the total: cannot tell, and says so.
        let total = ConsumedCapacity::builder().capacity_units(2.0).build();
        assert_eq!(commit_kind(&[total]), TxResult::CommittedUnsure);
        assert_eq!(commit_kind(&[]), TxResult::CommittedUnsure);
    }
}
