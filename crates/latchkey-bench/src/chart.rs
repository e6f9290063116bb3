//! The small SVG chart written next to each JSON report: one row per run
//! (workload × clients), with its throughput as a bar on the left and its
//! latency on a log scale on the right (a dot at p50, a thick bar to p99, a
//! thin line to p999), so a reader sees at a glance where a run sits
//! between fast and slow. Text only, no dependencies; every number is the
//! one in the JSON file.

use std::fmt::Write as _;

use crate::measure::RunResult;
use crate::report::ms;

/// Picture width in pixels.
const WIDTH: f64 = 820.0;
/// Height of one run's row.
const ROW: f64 = 26.0;
/// Where the first row starts (below the title and the panel headers).
const TOP: f64 = 76.0;
/// The throughput panel: bars from `OPS_X`, at most `OPS_W` wide.
const OPS_X: f64 = 120.0;
const OPS_W: f64 = 230.0;
/// The latency panel: a log axis from `LAT_X`, `LAT_W` wide, then the
/// numbers.
const LAT_X: f64 = 440.0;
const LAT_W: f64 = 200.0;

/// The chart of `results`, titled `title` and `subtitle` (plain text; the
/// characters `<`, `>` and `&` are dropped, not escaped).
pub fn svg(title: &str, subtitle: &str, results: &[RunResult]) -> String {
    let height = TOP + ROW * results.len() as f64 + 50.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH:.0}" height="{height:.0}" viewBox="0 0 {WIDTH:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{WIDTH:.0}" height="{height:.0}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="20" font-size="14" font-weight="bold">{}</text>"#,
        plain(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="38" fill="#555">{}</text>"##,
        plain(subtitle)
    );
    let _ = writeln!(
        s,
        r#"<text x="{OPS_X}" y="62" font-weight="bold">operations/s</text>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{LAT_X}" y="62" font-weight="bold">latency, ms (log scale)</text>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.0}" y="62" font-weight="bold">p50 / p99 / p999 ms</text>"#,
        LAT_X + LAT_W + 10.0
    );

    let max_ops = results.iter().map(|r| r.ops_per_s).fold(0.0, f64::max);
    let axis = LogAxis::covering(results);
    let bottom = TOP + ROW * results.len() as f64;
    // Grid lines and labels of the latency axis, under the rows.
    for (x, label) in axis.ticks() {
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            TOP - 4.0,
            bottom
        );
        let _ = writeln!(
            s,
            r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#555">{label}</text>"##,
            bottom + 14.0
        );
    }

    let _ = writeln!(
        s,
        r##"<text x="{LAT_X}" y="{:.1}" fill="#555">● p50   ▬ to p99   ─ to p999</text>"##,
        bottom + 32.0
    );

    for (i, r) in results.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let mid = y + ROW / 2.0;
        let _ = writeln!(
            s,
            r#"<text x="10" y="{:.1}">{} x{}</text>"#,
            mid + 4.0,
            plain(r.workload),
            r.clients
        );
        let w = if max_ops > 0.0 {
            (r.ops_per_s / max_ops * OPS_W).max(1.0)
        } else {
            1.0
        };
        let _ = writeln!(
            s,
            r##"<rect class="ops" x="{OPS_X}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="#4a7ebb"/>"##,
            y + 5.0,
            ROW - 10.0
        );
        let errors = if r.errors > 0 {
            format!(r##" <tspan fill="#c00">({} errors)</tspan>"##, r.errors)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}{errors}</text>"#,
            OPS_X + w + 4.0,
            mid + 4.0,
            thousands(r.ops_per_s)
        );
        let l = &r.latency_us;
        if r.ops == 0 {
            let _ = writeln!(
                s,
                r##"<text x="{LAT_X}" y="{:.1}" fill="#c00">no operation succeeded</text>"##,
                mid + 4.0
            );
            continue;
        }
        let (x50, x99, x999) = (axis.x(l.p50_us), axis.x(l.p99_us), axis.x(l.p999_us));
        let _ = writeln!(
            s,
            r##"<line x1="{x50:.1}" y1="{mid:.1}" x2="{x999:.1}" y2="{mid:.1}" stroke="#c0504d"/>"##
        );
        let _ = writeln!(
            s,
            r##"<rect class="p99" x="{x50:.1}" y="{:.1}" width="{:.1}" height="6" fill="#c0504d"/>"##,
            mid - 3.0,
            (x99 - x50).max(1.0)
        );
        let _ = writeln!(
            s,
            r##"<circle class="p50" cx="{x50:.1}" cy="{mid:.1}" r="4" fill="#7b1f1d"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{} / {} / {}</text>"#,
            LAT_X + LAT_W + 10.0,
            mid + 4.0,
            ms(l.p50_us),
            ms(l.p99_us),
            ms(l.p999_us)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// `v` rounded, with thousands separated by commas: 42,244.
fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// `text` without the characters that would be markup.
fn plain(text: &str) -> String {
    text.chars()
        .filter(|c| !matches!(c, '<' | '>' | '&'))
        .collect()
}

/// A base-10 log scale from the power of ten at or below the fastest p50 to
/// the one at or above the slowest p999, in microseconds.
struct LogAxis {
    lo: f64,
    hi: f64,
}

impl LogAxis {
    fn covering(results: &[RunResult]) -> LogAxis {
        let measured = results.iter().filter(|r| r.ops > 0);
        let fastest = measured
            .clone()
            .map(|r| r.latency_us.p50_us)
            .min()
            .unwrap_or(100);
        let slowest = measured.map(|r| r.latency_us.p999_us).max().unwrap_or(1000);
        // At least 10 µs at the low end (a zero would be -inf on a log axis),
        // and at least one decade wide.
        let lo = pow10_floor(fastest.max(10) as f64);
        let hi = pow10_ceil(slowest.max(1) as f64).max(lo * 10.0);
        LogAxis { lo, hi }
    }

    /// Where `us` sits on the axis (clamped to its ends).
    fn x(&self, us: u64) -> f64 {
        let v = (us as f64).clamp(self.lo, self.hi);
        LAT_X + (v / self.lo).log10() / (self.hi / self.lo).log10() * LAT_W
    }

    /// Each power of ten on the axis and its label in milliseconds.
    fn ticks(&self) -> Vec<(f64, String)> {
        let mut out = Vec::new();
        let mut v = self.lo;
        while v <= self.hi * 1.000_001 {
            let label = if v >= 1000.0 {
                format!("{:.0}", v / 1000.0)
            } else {
                format!("{}", v / 1000.0)
            };
            out.push((self.x(v.round() as u64), label));
            v *= 10.0;
        }
        out
    }
}

fn pow10_floor(v: f64) -> f64 {
    10f64.powi(v.log10().floor() as i32)
}

fn pow10_ceil(v: f64) -> f64 {
    10f64.powi(v.log10().ceil() as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Latency;

    fn run(workload: &'static str, clients: usize, ops_per_s: f64, p50: u64) -> RunResult {
        RunResult {
            workload,
            clients,
            ops: (ops_per_s * 3.0) as u64,
            errors: 0,
            seconds: 3.0,
            ops_per_s,
            latency_us: Latency {
                p50_us: p50,
                p90_us: p50 * 2,
                p99_us: p50 * 3,
                p999_us: p50 * 5,
                max_us: p50 * 9,
                mean_us: p50 as f64,
            },
            first_error: None,
            lock: None,
        }
    }

    fn widths(svg: &str, class: &str) -> Vec<f64> {
        svg.lines()
            .filter(|l| l.contains(&format!(r#"class="{class}""#)))
            .filter_map(|l| {
                let rest = l.split(r#"width=""#).nth(1)?;
                rest.split('"').next()?.parse().ok()
            })
            .collect()
    }

    #[test]
    fn one_bar_per_run_scaled_to_the_fastest() {
        let results = [
            run("put", 1, 700.0, 1_400),
            run("put", 64, 14_000.0, 4_000),
            run("get", 64, 42_000.0, 1_500),
        ];
        let svg = svg("latchkey kv", "3 replicas", &results);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let bars = widths(&svg, "ops");
        assert_eq!(bars.len(), 3);
        assert!((bars[2] - OPS_W).abs() < 0.1, "{bars:?}");
        assert!((bars[1] - OPS_W / 3.0).abs() < 0.1, "{bars:?}");
        assert_eq!(svg.matches(r#"class="p50""#).count(), 3);
        assert!(svg.contains("put x64") && svg.contains("42,000"));
        assert!(svg.contains("4.00 / 12.00 / 20.00"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn throughput_reads_with_thousands_separators() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1_000.0), "1,000");
        assert_eq!(thousands(42_244.0), "42,244");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }

    #[test]
    fn slower_p50_sits_further_right_on_the_log_axis() {
        let results = [run("put", 1, 700.0, 1_000), run("put", 64, 9_000.0, 10_000)];
        let axis = LogAxis::covering(&results);
        assert_eq!((axis.lo, axis.hi), (1_000.0, 100_000.0));
        assert!((axis.x(1_000) - LAT_X).abs() < 1e-9);
        assert!((axis.x(10_000) - (LAT_X + LAT_W / 2.0)).abs() < 1e-9);
        assert!((axis.x(100_000) - (LAT_X + LAT_W)).abs() < 1e-9);
        let labels: Vec<String> = axis.ticks().into_iter().map(|(_, l)| l).collect();
        assert_eq!(labels, ["1", "10", "100"]);
    }

    #[test]
    fn empty_failed_and_zero_latency_runs_draw_without_nan() {
        assert!(svg("t", "s", &[]).ends_with("</svg>\n"));
        let mut failed = run("contended", 32, 0.0, 0);
        failed.ops = 0;
        failed.errors = 12;
        let instant = run("get", 1, 5.0, 0);
        let svg = svg("a <b> & c", "s", &[failed, instant]);
        assert!(svg.contains("(12 errors)"));
        assert!(svg.contains("no operation succeeded"));
        assert!(svg.contains("a b  c"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
