//! The onset chart (`BENCH_SVG`): how each variant takes the load second
//! by second, which the table's whole-run figures cannot show (`auto`'s
//! refusals before it has grown, and none after).

use super::{BenchOptions, RunResult, Second};
use std::collections::BTreeMap;

/// The onset chart: per variant (its first run), the viral likes accepted
/// (green) and refused (red) each second, against the offered rate
/// (dashed), and the viral reel's shard count (blue, right-hand scale).
/// Plain SVG, no fonts or crates needed to draw it.
pub(super) fn onset_svg(opts: &BenchOptions, results: &BTreeMap<String, Vec<RunResult>>) -> String {
    const W: f64 = 860.0;
    const H: f64 = 190.0;
    const LEFT: f64 = 64.0;
    const RIGHT: f64 = 56.0;
    const TOP: f64 = 26.0;
    const BOTTOM: f64 = 30.0;
    let panels: Vec<(&String, &RunResult)> = results
        .iter()
        .filter_map(|(v, rs)| rs.first().map(|r| (v, r)))
        .collect();
    let height = H * panels.len().max(1) as f64 + 30.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" viewBox=\"0 0 {W} {height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"18\" font-size=\"13\">Viral reel: likes accepted (green) and refused (red) per second, offered rate (dashed), shards (blue, right scale)</text>\n"
    );
    for (i, (variant, r)) in panels.iter().enumerate() {
        // Each panel on its own scale: the stream variant is offered ten
        // times the others' rate.
        let y_max = r
            .timeline
            .iter()
            .map(|p| f64::from(p.accepted.max(p.refused)))
            .fold(r.offered_likes_per_sec, f64::max)
            .max(1.0)
            * 1.1;
        let y0 = 30.0 + H * i as f64;
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let secs = opts.seconds.max(1.0);
        let shards_max = r
            .timeline
            .iter()
            .map(|p| p.shards)
            .max()
            .unwrap_or(1)
            .max(1) as f64
            * 1.2;
        let x = |t: f64| LEFT + pw * (t / secs);
        let y = |v: f64| y0 + TOP + ph * (1.0 - (v / y_max).min(1.0));
        let ys = |v: f64| y0 + TOP + ph * (1.0 - v / shards_max);
        s.push_str(&format!(
            "<text x=\"{LEFT}\" y=\"{:.1}\" font-size=\"12\" font-weight=\"bold\">{variant}</text>\n<rect x=\"{LEFT}\" y=\"{:.1}\" width=\"{pw:.1}\" height=\"{ph:.1}\" fill=\"none\" stroke=\"#999\"/>\n",
            y0 + TOP - 6.0,
            y0 + TOP
        ));
        for k in 0..=4 {
            let v = y_max * f64::from(k) / 4.0;
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>\n",
                LEFT - 4.0,
                y(v) + 4.0
            ));
        }
        for k in 0..=4 {
            let v = shards_max * f64::from(k) / 4.0;
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#1f4fbf\">{v:.0}</text>\n",
                W - RIGHT + 4.0,
                ys(v) + 4.0
            ));
        }
        let step = (secs / 10.0).ceil().max(1.0);
        let mut t = 0.0;
        while t <= secs {
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t:.0} s</text>\n",
                x(t),
                y0 + H - BOTTOM + 14.0
            ));
            t += step;
        }
        let line = |pts: Vec<(f64, f64)>, color: &str, dash: bool| -> String {
            let d: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
            format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\"{} points=\"{}\"/>\n",
                if dash {
                    " stroke-dasharray=\"4 3\""
                } else {
                    ""
                },
                d.join(" ")
            )
        };
        let mid = |p: &Second| f64::from(p.t) + 0.5;
        s.push_str(&line(
            vec![
                (x(0.0), y(r.offered_likes_per_sec)),
                (x(secs), y(r.offered_likes_per_sec)),
            ],
            "#777",
            true,
        ));
        s.push_str(&line(
            r.timeline
                .iter()
                .map(|p| (x(mid(p)), y(f64::from(p.accepted))))
                .collect(),
            "#2a9d3a",
            false,
        ));
        s.push_str(&line(
            r.timeline
                .iter()
                .map(|p| (x(mid(p)), y(f64::from(p.refused))))
                .collect(),
            "#d62728",
            false,
        ));
        let mut steps = Vec::new();
        for p in &r.timeline {
            steps.push((x(f64::from(p.t)), ys(f64::from(p.shards))));
            steps.push((x(f64::from(p.t) + 1.0), ys(f64::from(p.shards))));
        }
        s.push_str(&line(steps, "#1f4fbf", false));
    }
    s.push_str("</svg>\n");
    s
}
