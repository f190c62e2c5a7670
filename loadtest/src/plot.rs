//! PNG charts (plotters' bitmap backend; text drawn with DejaVu Sans embedded through the
//! `dejavu` crate, so no system fonts are needed):
//!
//! - `<stem>-latency-cdf.png`: write→delivery latency CDF of every series (one per
//!   target, two per target in the `slow` scenario), log-scaled latency axis; the right
//!   panel stretches the tail (p90, p99, p99.9 equally spaced).
//! - `<stem>-rss.png`: RSS growth against watches established, per target, sampled as the
//!   watches were opened in steps; for kcache also kcache + the API server (its upstream).

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::TargetReport;
use crate::scenario::Series;

const FONT: &str = "sans-serif";
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

/// Registers the embedded font once; false if it could not be parsed.
fn font_ready() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    })
}

type Result<T> = std::result::Result<T, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Up to `n` (latency ms, cumulative fraction) points of sorted samples. Sample `i` of
/// `len` sits at (i + 0.5) / len, so the slowest one stays below 1 on the tail axis.
fn cdf(sorted: &[Duration], n: usize) -> Vec<(f64, f64)> {
    let len = sorted.len();
    let step = len.div_ceil(n.max(1)).max(1);
    let at = |i: usize| (ms(sorted[i]).max(1e-3), (i as f64 + 0.5) / len as f64);
    let mut pts: Vec<(f64, f64)> = (0..len).step_by(step).map(at).collect();
    if len > 0 && !(len - 1).is_multiple_of(step) {
        pts.push(at(len - 1));
    }
    pts
}

/// Tail transform of a cumulative fraction: -log10(1 - f), capped at p99.99.
fn tail(f: f64) -> f64 {
    -(1.0 - f).max(1e-4).log10()
}

/// The percentile label of a tail-axis value.
fn tail_label(y: &f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-y));
    let s = format!("{p:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("p{s}")
}

/// Labels 1, 2, 3 and 5 of each decade of a log axis (the other key points stay unlabelled).
fn log_label(x: &f64) -> String {
    let mantissa = x / 10f64.powf(x.log10().floor());
    if [1.0, 2.0, 3.0, 5.0]
        .iter()
        .any(|m| (mantissa - m).abs() < 1e-6)
    {
        let s = format!("{x:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        String::new()
    }
}

fn draw_cdf_panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    series: &[Series],
    (lo, hi): (f64, f64),
    tail_axis: bool,
) -> Result<()> {
    let y_max = if tail_axis { 4.0 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(
            if tail_axis {
                "tail (y: percentile)"
            } else {
                "CDF"
            },
            (FONT, 20),
        )
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..y_max)
        .map_err(err)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc("write -> delivery latency (ms, log scale)")
        .x_labels(20)
        .x_label_formatter(&log_label)
        .label_style((FONT, 14));
    if tail_axis {
        mesh.y_labels(5)
            .y_label_formatter(&tail_label)
            .y_desc("percentile");
    } else {
        mesh.y_desc("fraction of deliveries <= x");
    }
    mesh.draw().map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = cdf(&s.sorted, 2000)
            .into_iter()
            .map(|(x, f)| (x, if tail_axis { tail(f) } else { f }))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?
            .label(format!("{} (n={})", s.label, s.sorted.len()))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(if tail_axis {
            SeriesLabelPosition::UpperLeft
        } else {
            SeriesLabelPosition::LowerRight
        })
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// The latency CDF chart of `series`.
pub fn latency_cdf(path: &Path, title: &str, series: &[Series]) -> Result<()> {
    if !font_ready() {
        return Err("embedded font could not be loaded".into());
    }
    let all = series.iter().flat_map(|s| s.sorted.iter().copied());
    let (lo, hi) = all.fold((f64::INFINITY, 0f64), |(lo, hi), d| {
        (lo.min(ms(d)), hi.max(ms(d)))
    });
    if hi <= 0.0 {
        return Err("no latency samples".into());
    }
    // Start at a power of ten: plotters puts log-axis labels from there on up.
    let lo = 10f64.powf(lo.max(1e-3).log10().floor());
    let hi = hi * 1.5;
    let root = BitMapBackend::new(path, (1400, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, (FONT, 24)).map_err(err)?;
    let panels = root.split_evenly((1, 2));
    draw_cdf_panel(&panels[0], series, (lo, hi), false)?;
    draw_cdf_panel(&panels[1], series, (lo, hi), true)?;
    root.present().map_err(err)
}

/// RSS growth (MiB) against watches established, from each report's steps.
pub fn rss_vs_watches(path: &Path, title: &str, reports: &[TargetReport]) -> Result<()> {
    if !font_ready() {
        return Err("embedded font could not be loaded".into());
    }
    let mib = |kib: i64| kib as f64 / 1024.0;
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in reports {
        let own: Vec<(f64, f64)> = std::iter::once((0.0, 0.0))
            .chain(r.rss_steps.iter().map(|s| {
                (
                    s.watches as f64,
                    mib(s.target_rss_kib as i64 - r.rss_before_kib as i64),
                )
            }))
            .collect();
        lines.push((r.target.clone(), own));
        if r.target == "kcache" {
            let api0 = r.apiserver_rss_before_kib as i64;
            let both: Vec<(f64, f64)> = std::iter::once((0.0, 0.0))
                .chain(r.rss_steps.iter().map(|s| {
                    (
                        s.watches as f64,
                        mib(s.target_rss_kib as i64 - r.rss_before_kib as i64
                            + s.apiserver_rss_kib as i64
                            - api0),
                    )
                }))
                .collect();
            lines.push(("kcache + kube-apiserver (upstream)".into(), both));
        }
    }
    let x_max = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
        .fold(1.0f64, f64::max);
    let (y_min, y_max) = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold((0.0f64, 1.0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max * 1.05, y_min.min(0.0)..y_max * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("watches established")
        .y_desc("RSS growth (MiB)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    for (i, (label, pts)) in lines.into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_axis_labels() {
        assert_eq!(tail_label(&0.0), "p0");
        assert_eq!(tail_label(&1.0), "p90");
        assert_eq!(tail_label(&2.0), "p99");
        assert_eq!(tail_label(&3.0), "p99.9");
        assert!((tail(0.99) - 2.0).abs() < 1e-9);
        assert_eq!(log_label(&20.0), "20");
        assert_eq!(log_label(&0.5), "0.5");
        assert_eq!(log_label(&7.0), "");
    }

    #[test]
    fn draws_both_charts() {
        let dir = std::env::temp_dir().join(format!("kcache-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let s = Series {
            label: "kcache".into(),
            sorted: (1..=1000)
                .map(|i| Duration::from_micros(1000 + i * 10))
                .collect(),
        };
        latency_cdf(&dir.join("cdf.png"), "test", &[s]).expect("cdf");
        let r = TargetReport {
            target: "kcache".into(),
            rss_before_kib: 1000,
            apiserver_rss_before_kib: 4000,
            rss_steps: vec![crate::report::RssStep {
                watches: 100,
                target_rss_kib: 3000,
                apiserver_rss_kib: 5000,
            }],
            ..Default::default()
        };
        rss_vs_watches(&dir.join("rss.png"), "test", &[r]).expect("rss");
        assert!(
            std::fs::metadata(dir.join("cdf.png"))
                .map(|m| m.len())
                .unwrap_or(0)
                > 1000
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
