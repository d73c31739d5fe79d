//! Every price the bill uses, in one table: per region, the dollars, the
//! page each was taken from and when, and how sure it is. A price the
//! search of the official pages could not confirm says so in its note
//! (and in BENCHMARKS.md) rather than passing for a quote. First tiers
//! only (no free tier, no volume discount), no taxes.

use anyhow::{Result, anyhow};

/// What is priced, and in which unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Item {
    /// API Gateway HTTP API, per million requests (first 300 million a
    /// month; a request is metered in 512 KB steps).
    HttpApiMillion,
    /// Lambda, per million invocations.
    LambdaMillion,
    /// Lambda on arm64, per GB-second (first 7.5 billion a month).
    LambdaArmGbSecond,
    /// DynamoDB on demand, per million write request units.
    WruMillion,
    /// ... per million read request units.
    RruMillion,
    /// Kinesis on demand, per stream-hour.
    KinesisStreamHour,
    /// ... per GB ingested (each record rounded up to 1 KB).
    KinesisGbIn,
    /// ... per GB retrieved.
    KinesisGbOut,
    /// Kinesis provisioned, per shard-hour.
    KinesisShardHour,
    /// ... per million PUT payload units (25 KB each).
    KinesisPutUnitsMillion,
    /// CloudWatch Logs, Lambda's logs (vended logs' first tier), per GB
    /// ingested.
    LambdaLogsGb,
    /// CloudWatch Logs, other logs (the API's access log), per GB.
    LogsGb,
    /// CloudWatch custom metric, per metric-month (first 10,000).
    MetricMonth,
    /// X-Ray, per million traces recorded.
    XrayMillion,
}

/// When the prices were taken.
pub(crate) const TAKEN: &str = "2026-12-06";

/// One price of one region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Price {
    pub item: Item,
    pub region: &'static str,
    pub dollars: f64,
    /// Empty: confirmed on the official page (or AWS's documentation)
    /// through the search; otherwise what is unsure.
    pub note: &'static str,
}

const EU_UNSURE: &str =
    "not confirmed for eu-west-1: the search found no official figure; check the page";
const MEMORY: &str =
    "from the official page as remembered; the search's copy of the page did not hold the figure";

/// The table. Regions: `us-east-1`, `eu-west-1`.
pub(crate) const PRICES: &[Price] = &[
    p(Item::HttpApiMillion, "us-east-1", 1.00, ""),
    p(Item::HttpApiMillion, "eu-west-1", 1.11, EU_UNSURE),
    p(Item::LambdaMillion, "us-east-1", 0.20, ""),
    p(Item::LambdaMillion, "eu-west-1", 0.20, EU_UNSURE),
    p(Item::LambdaArmGbSecond, "us-east-1", 0.000_013_333_4, ""),
    p(
        Item::LambdaArmGbSecond,
        "eu-west-1",
        0.000_013_333_4,
        EU_UNSURE,
    ),
    p(Item::WruMillion, "us-east-1", 0.625, ""),
    p(Item::WruMillion, "eu-west-1", 0.7065, EU_UNSURE),
    p(Item::RruMillion, "us-east-1", 0.125, ""),
    p(Item::RruMillion, "eu-west-1", 0.1413, EU_UNSURE),
    p(Item::KinesisStreamHour, "us-east-1", 0.04, MEMORY),
    p(Item::KinesisStreamHour, "eu-west-1", 0.045, EU_UNSURE),
    p(Item::KinesisGbIn, "us-east-1", 0.08, MEMORY),
    p(Item::KinesisGbIn, "eu-west-1", 0.088, EU_UNSURE),
    p(Item::KinesisGbOut, "us-east-1", 0.04, MEMORY),
    p(Item::KinesisGbOut, "eu-west-1", 0.044, EU_UNSURE),
    p(Item::KinesisShardHour, "us-east-1", 0.015, MEMORY),
    p(Item::KinesisShardHour, "eu-west-1", 0.017, EU_UNSURE),
    p(Item::KinesisPutUnitsMillion, "us-east-1", 0.014, MEMORY),
    p(Item::KinesisPutUnitsMillion, "eu-west-1", 0.016, EU_UNSURE),
    p(Item::LambdaLogsGb, "us-east-1", 0.50, ""),
    p(Item::LambdaLogsGb, "eu-west-1", 0.57, EU_UNSURE),
    p(Item::LogsGb, "us-east-1", 0.50, ""),
    p(Item::LogsGb, "eu-west-1", 0.57, EU_UNSURE),
    p(Item::MetricMonth, "us-east-1", 0.30, MEMORY),
    p(Item::MetricMonth, "eu-west-1", 0.30, EU_UNSURE),
    p(Item::XrayMillion, "us-east-1", 5.00, MEMORY),
    p(Item::XrayMillion, "eu-west-1", 5.00, EU_UNSURE),
];

const fn p(item: Item, region: &'static str, dollars: f64, note: &'static str) -> Price {
    Price {
        item,
        region,
        dollars,
        note,
    }
}

impl Item {
    /// What the price is per, as the tables write it.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Item::HttpApiMillion => "million HTTP API requests",
            Item::LambdaMillion => "million Lambda invocations",
            Item::LambdaArmGbSecond => "Lambda GB-second, arm64",
            Item::WruMillion => "million write request units",
            Item::RruMillion => "million read request units",
            Item::KinesisStreamHour => "Kinesis on-demand stream-hour",
            Item::KinesisGbIn => "GB into Kinesis on demand (records rounded up to 1 KB)",
            Item::KinesisGbOut => "GB read from Kinesis on demand",
            Item::KinesisShardHour => "Kinesis provisioned shard-hour",
            Item::KinesisPutUnitsMillion => "million Kinesis PUT payload units (25 KB)",
            Item::LambdaLogsGb => "GB of Lambda logs into CloudWatch Logs (first tier)",
            Item::LogsGb => "GB of other logs into CloudWatch Logs (Standard)",
            Item::MetricMonth => "CloudWatch custom metric-month",
            Item::XrayMillion => "million X-Ray traces recorded",
        }
    }

    /// The official page the price is on.
    pub(crate) fn source(self) -> &'static str {
        match self {
            Item::HttpApiMillion => "https://aws.amazon.com/api-gateway/pricing/",
            Item::LambdaMillion | Item::LambdaArmGbSecond => {
                "https://aws.amazon.com/lambda/pricing/"
            }
            Item::WruMillion | Item::RruMillion => {
                "https://aws.amazon.com/dynamodb/pricing/on-demand/"
            }
            Item::KinesisStreamHour
            | Item::KinesisGbIn
            | Item::KinesisGbOut
            | Item::KinesisShardHour
            | Item::KinesisPutUnitsMillion => {
                "https://aws.amazon.com/kinesis/data-streams/pricing/"
            }
            Item::LambdaLogsGb | Item::LogsGb | Item::MetricMonth => {
                "https://aws.amazon.com/cloudwatch/pricing/"
            }
            Item::XrayMillion => "https://aws.amazon.com/xray/pricing/",
        }
    }
}

/// The prices of one region.
#[derive(Clone, Debug)]
pub(crate) struct Prices {
    pub region: String,
    rows: Vec<Price>,
}

impl Prices {
    /// `region`'s prices; an error naming the regions there are.
    pub(crate) fn of(region: &str) -> Result<Prices> {
        let rows: Vec<Price> = PRICES
            .iter()
            .filter(|p| p.region == region)
            .copied()
            .collect();
        if rows.is_empty() {
            let mut known: Vec<&str> = PRICES.iter().map(|p| p.region).collect();
            known.dedup();
            return Err(anyhow!(
                "BENCH_REGION={region:?}: no prices; known: {}",
                known.join(", ")
            ));
        }
        Ok(Prices {
            region: region.to_owned(),
            rows,
        })
    }

    /// The dollars of `item` (every item has a price in every region).
    pub(crate) fn get(&self, item: Item) -> f64 {
        self.price(item).map_or(f64::NAN, |p| p.dollars)
    }

    pub(crate) fn price(&self, item: Item) -> Option<&Price> {
        self.rows.iter().find(|p| p.item == item)
    }

    /// Every price of the region, in the table's order.
    pub(crate) fn all(&self) -> &[Price] {
        &self.rows
    }
}
