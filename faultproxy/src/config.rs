//! What to inject, and the one text form of it (`FAULTS=...`, `--faults`).

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Probabilities (0–1) of each fault class for one request. The classes that
/// refuse a request before it reaches the emulator (`throttle`,
/// `server_error`, `conflict`) and `lost` are exclusive: one draw picks at
/// most one of them, so their sum is the share of requests that fail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Rates {
    /// Forwarded and committed, then the answer is lost: the connection is
    /// dropped, or held until the client gives up, or replaced by a 500. The
    /// ambiguous case: the client cannot tell whether the write happened.
    pub lost: f64,
    /// Refused before forwarding: `ProvisionedThroughputExceededException`
    /// or `ThrottlingException` (for transactions, also a
    /// `TransactionCanceledException` with a `ThrottlingError` reason).
    pub throttle: f64,
    /// Refused before forwarding: `TransactionCanceledException` with a
    /// `TransactionConflict` reason. Transactions only.
    pub conflict: f64,
    /// Refused before forwarding: 500 `InternalServerError` or 503
    /// `ServiceUnavailable`.
    pub server_error: f64,
    /// `BatchGetItem` only: part of the keys are returned in
    /// `UnprocessedKeys` instead of being read.
    pub unprocessed: f64,
    /// Added latency (up to `max_latency`) before forwarding; independent of
    /// the classes above.
    pub latency: f64,
}

impl Rates {
    fn set(&mut self, field: &str, v: f64) -> Result<(), String> {
        let slot = match field {
            "lost" => &mut self.lost,
            "throttle" => &mut self.throttle,
            "conflict" => &mut self.conflict,
            "server_error" | "error" => &mut self.server_error,
            "unprocessed" => &mut self.unprocessed,
            "latency" => &mut self.latency,
            _ => return Err(format!("unknown fault class {field:?}")),
        };
        *slot = v;
        Ok(())
    }

    /// Every class at `rate`: the "everything at once" setting of the tests.
    pub fn all(rate: f64) -> Rates {
        Rates {
            lost: rate,
            throttle: rate,
            conflict: rate,
            server_error: rate,
            unprocessed: rate,
            latency: rate,
        }
    }
}

/// Probabilities (0–1) of the Kinesis fault classes, which apply only to
/// Kinesis requests (`X-Amz-Target: Kinesis_20131202.*`), and only to its
/// data operations `PutRecords`, `PutRecord` and `GetRecords`: stream
/// management (`CreateStream`, `DescribeStream`, ...) always goes through,
/// so a test's setup is never what fails. The DynamoDB classes of [`Rates`]
/// never apply to Kinesis requests (their error bodies are DynamoDB's).
/// `throttle` and `lost` are exclusive, like the DynamoDB ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct KinesisRates {
    /// Refused before forwarding: 400
    /// `ProvisionedThroughputExceededException`, which the AWS SDKs retry
    /// as a throttling error.
    pub throttle: f64,
    /// Forwarded (the records are written), then the answer is lost exactly
    /// as DynamoDB's `lost`: dropped, stalled, or 500 `InternalFailure`.
    pub lost: f64,
    /// `PutRecords` only, per record: the share of records that fail the
    /// way Kinesis fails them one by one (`ErrorCode`
    /// `ProvisionedThroughputExceededException` or `InternalFailure` in the
    /// answer's `Records`), without reaching the emulator; the others are
    /// forwarded and written.
    pub partial: f64,
}

impl KinesisRates {
    /// Every Kinesis class at `rate`.
    pub fn all(rate: f64) -> KinesisRates {
        KinesisRates {
            throttle: rate,
            lost: rate,
            partial: rate,
        }
    }
}

/// The proxy's whole fault configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Faults {
    /// Seed of the random schedule. The schedule is a sequence of draws in
    /// arrival order, so a run with the same seed and the same request order
    /// gets the same faults.
    pub seed: u64,
    /// Rates for every operation without an entry in `per_op`.
    pub rates: Rates,
    /// Rates by operation name (`TransactWriteItems`, `BatchGetItem`, ...).
    pub per_op: BTreeMap<String, Rates>,
    /// The capacity model: write units one partition key takes per second
    /// before writes to it are throttled (DynamoDB: 1,000 per partition).
    pub write_cap: Option<f64>,
    /// Read units one partition key takes per second (DynamoDB: 3,000).
    pub read_cap: Option<f64>,
    /// How long a stalled answer is held before the connection is dropped;
    /// longer than the client's attempt timeout, so the client times out.
    pub stall: Duration,
    /// The most latency one request gets added.
    pub max_latency: Duration,
    /// The conflict model (`None`: off): a `TransactWriteItems` holds its
    /// items from being forwarded until its answer goes out, which is held
    /// back this long, and
    /// requests touching a held item get DynamoDB's conflict answers
    /// (`conflicts.rs` says which). The emulator answers in well under a
    /// millisecond, so this hold is what lets transactions overlap.
    pub conflict_hold: Option<Duration>,
    /// Partition key values whose items cannot be read (`unreadable=KEY`):
    /// every `GetItem`, `BatchGetItem` or `TransactGetItems` touching one is
    /// answered 500 `InternalServerError` without being forwarded, every
    /// time; writes (and `Query`, `Scan`) go through. A lost item, as a
    /// partition that stopped answering reads.
    pub unreadable: BTreeSet<String>,
    /// The Kinesis classes (`kinesis_throttle=P`, ...): a proxy in front of
    /// a Kinesis emulator is the same proxy with these set.
    pub kinesis: KinesisRates,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            seed: 1,
            rates: Rates::default(),
            per_op: BTreeMap::new(),
            write_cap: None,
            read_cap: None,
            stall: Duration::from_secs(5),
            max_latency: Duration::from_millis(50),
            conflict_hold: None,
            unreadable: BTreeSet::new(),
            kinesis: KinesisRates::default(),
        }
    }
}

impl Faults {
    /// The rates that apply to `op`.
    pub fn rates_for(&self, op: &str) -> Rates {
        self.per_op.get(op).copied().unwrap_or(self.rates)
    }

    /// Whether this configuration can change any request at all.
    pub fn is_passthrough(&self) -> bool {
        self.write_cap.is_none()
            && self.read_cap.is_none()
            && self.conflict_hold.is_none()
            && self.unreadable.is_empty()
            && self.rates == Rates::default()
            && self.kinesis == KinesisRates::default()
            && self.per_op.values().all(|r| *r == Rates::default())
    }

    /// Parses the text form: comma-separated `name=value` pairs.
    ///
    /// * `seed=N`
    /// * `all=P`: every fault class at probability P
    /// * `lost=P`, `throttle=P`, `conflict=P`, `error=P` (or
    ///   `server_error=P`), `unprocessed=P`, `latency=P`
    /// * `Op.class=P`: a rate for one operation only, e.g.
    ///   `TransactWriteItems.lost=0.2` (the operation starts from the
    ///   defaults given before it)
    /// * `write_cap=U`, `read_cap=U`: capacity units per partition key per
    ///   second
    /// * `stall_ms=N`, `max_latency_ms=N`
    /// * `conflict_hold_ms=N`: the conflict model on, each transaction
    ///   holding its items N ms longer than the emulator took, its answer
    ///   held back as long (0: only while in flight)
    /// * `unreadable=KEY`: the items whose partition key value is KEY cannot
    ///   be read ([`Faults::unreadable`]); repeat it for more keys
    /// * `kinesis_throttle=P`, `kinesis_lost=P`, `kinesis_partial=P`, or
    ///   `kinesis_all=P` for the three: the Kinesis classes
    ///   ([`KinesisRates`]); `all` leaves them alone
    ///
    /// `""` or `off` is no faults at all.
    pub fn parse(spec: &str) -> Result<Faults, String> {
        let mut f = Faults::default();
        let spec = spec.trim();
        if spec.is_empty() || spec == "off" {
            return Ok(f);
        }
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected name=value"))?;
            let (name, value) = (name.trim(), value.trim());
            let prob = || -> Result<f64, String> {
                match value.parse::<f64>() {
                    Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
                    _ => Err(format!("{name}={value:?}: expected a probability in 0..=1")),
                }
            };
            let whole = || -> Result<u64, String> {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{name}={value:?}: expected a whole number"))
            };
            let units = || -> Result<f64, String> {
                match value.parse::<f64>() {
                    Ok(u) if u > 0.0 && u.is_finite() => Ok(u),
                    _ => Err(format!("{name}={value:?}: expected a positive number")),
                }
            };
            match name {
                "seed" => f.seed = whole()?,
                "all" => f.rates = Rates::all(prob()?),
                "write_cap" => f.write_cap = Some(units()?),
                "read_cap" => f.read_cap = Some(units()?),
                "stall_ms" => f.stall = Duration::from_millis(whole()?),
                "max_latency_ms" => f.max_latency = Duration::from_millis(whole()?),
                "conflict_hold_ms" => f.conflict_hold = Some(Duration::from_millis(whole()?)),
                "unreadable" if value.is_empty() => {
                    return Err("unreadable=: expected a partition key value".into());
                }
                "unreadable" => {
                    f.unreadable.insert(value.to_owned());
                }
                "kinesis_all" => f.kinesis = KinesisRates::all(prob()?),
                "kinesis_throttle" => f.kinesis.throttle = prob()?,
                "kinesis_lost" => f.kinesis.lost = prob()?,
                "kinesis_partial" => f.kinesis.partial = prob()?,
                _ => match name.split_once('.') {
                    Some((op, class)) => {
                        let base = f.rates;
                        f.per_op
                            .entry(op.to_owned())
                            .or_insert(base)
                            .set(class, prob()?)?
                    }
                    None => f.rates.set(name, prob()?)?,
                },
            }
        }
        let sums = std::iter::once(&f.rates).chain(f.per_op.values());
        for r in sums {
            if r.lost + r.throttle + r.conflict + r.server_error > 1.0 {
                return Err("lost + throttle + conflict + error must not exceed 1".into());
            }
        }
        if f.kinesis.lost + f.kinesis.throttle > 1.0 {
            return Err("kinesis_lost + kinesis_throttle must not exceed 1".into());
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_setting() {
        let f = Faults::parse(
            "seed=7, all=0.1, TransactWriteItems.lost=0.3, write_cap=50, read_cap=300, stall_ms=900, max_latency_ms=20, conflict_hold_ms=30",
        )
        .unwrap();
        assert_eq!(f.seed, 7);
        assert_eq!(f.rates, Rates::all(0.1));
        let tx = f.rates_for("TransactWriteItems");
        assert_eq!(tx.lost, 0.3);
        assert_eq!(tx.throttle, 0.1);
        assert_eq!(f.rates_for("GetItem"), Rates::all(0.1));
        assert_eq!(f.write_cap, Some(50.0));
        assert_eq!(f.read_cap, Some(300.0));
        assert_eq!(f.stall, Duration::from_millis(900));
        assert_eq!(f.max_latency, Duration::from_millis(20));
        assert_eq!(f.conflict_hold, Some(Duration::from_millis(30)));
        assert!(!f.is_passthrough());
        // The conflict model alone is a reason to stand between.
        assert!(
            !Faults::parse("conflict_hold_ms=0")
                .unwrap()
                .is_passthrough()
        );
        assert_eq!(Faults::default().conflict_hold, None);
        let u = Faults::parse("unreadable=007#reel#r1#likes, unreadable=k2").unwrap();
        assert_eq!(
            u.unreadable.iter().map(String::as_str).collect::<Vec<_>>(),
            ["007#reel#r1#likes", "k2"]
        );
        assert!(!u.is_passthrough());
        let k = Faults::parse("all=0.1, kinesis_all=0.2, kinesis_partial=0.5").unwrap();
        assert_eq!(k.rates, Rates::all(0.1), "kinesis_* leave DynamoDB alone");
        assert_eq!(
            k.kinesis,
            KinesisRates {
                throttle: 0.2,
                lost: 0.2,
                partial: 0.5
            }
        );
        assert_eq!(
            Faults::parse("all=0.2").unwrap().kinesis,
            KinesisRates::default(),
            "all leaves Kinesis alone"
        );
        assert!(
            !Faults::parse("kinesis_partial=0.1")
                .unwrap()
                .is_passthrough()
        );
        assert!(Faults::parse("off").unwrap().is_passthrough());
        assert!(Faults::parse("").unwrap().is_passthrough());
    }

    #[test]
    fn refuses_nonsense() {
        for bad in [
            "lost",
            "lost=2",
            "lost=-0.1",
            "nope=0.1",
            "write_cap=0",
            "conflict_hold_ms=-1",
            "seed=x",
            "X.nope=0.1",
            "lost=0.5,throttle=0.6",
            "unreadable=",
            "kinesis_partial=1.5",
            "kinesis_lost=0.5,kinesis_throttle=0.6",
            "kinesis_nope=0.1",
        ] {
            assert!(Faults::parse(bad).is_err(), "{bad}");
        }
    }
}
