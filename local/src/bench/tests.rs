//! The bench's own tests.

use super::*;

#[test]
fn settings_name_every_measurement_variable_with_its_value() {
    let settings = test_options().settings();
    let names: Vec<&str> = settings.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "BENCH_RATE",
            "BENCH_STREAM_RATE",
            "BENCH_STREAM_SCALE_RATE",
            "BENCH_BACKGROUND_RATE",
            "BENCH_READ_RATE",
            "BENCH_SECONDS",
            "BENCH_WRITE_CAP",
            "BENCH_SHARDS",
            "BENCH_RUNS",
            "BENCH_VIEWS_WORKERS",
            "BENCH_VIEWS_VIEWERS",
            "BENCH_PLATFORM_RATE",
            "BENCH_PLATFORM_SECONDS",
            "BENCH_PLATFORM_ROLL_RECORDS",
            "BENCH_TRENDING_RATE",
            "BENCH_TRENDING_SECONDS",
            "BENCH_VARIANTS",
            "BENCH_WRU_PRICE",
            "BENCH_RRU_PRICE",
            "BENCH_REGION",
        ]
    );
    let get = |n: &str| settings.iter().find(|(k, _)| *k == n).unwrap().1.clone();
    // As a shell would take them back: no trailing ".0".
    assert_eq!(get("BENCH_RATE"), "75");
    assert_eq!(get("BENCH_STREAM_RATE"), "750");
    assert_eq!(get("BENCH_WRU_PRICE"), "0.625");
    assert_eq!(
        get("BENCH_VARIANTS"),
        "naive,fixed,fixed-nocache,auto,stream,stream-scale,stream-scale-mixed,views,costs,platform,trending"
    );
    assert_eq!(get("BENCH_VIEWS_VIEWERS"), "200000");
}
