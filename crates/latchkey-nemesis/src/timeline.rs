//! The run as a picture: one SVG with a shared time axis.
//!
//! Rows, top to bottom:
//! - one per replica: green where it was the leader (sampled every 250 ms),
//!   red while killed, orange while paused, purple while partitioned,
//!   brown from a disk fault until its outcome was seen, teal while being
//!   repaired (a black tick: a late exit on a damaged disk);
//! - one per lock client process that was paused (orange);
//! - one per lock resource: a bar per grant, from the grant to the moment
//!   its holder stopped believing it held the lock, labelled with the
//!   fencing token when there is room; a red mark for every stale write a
//!   store refused (fence gate above the bar, fenced KV below).
//!
//! Every shape has a tooltip (`<title>`) with the exact numbers.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use latchkey_check::history::{FenceTarget, LockOp};
use latchkey_check::{EventKind, History, Op};

use crate::nemesis::FaultWindow;
use crate::report::LeaderSample;

const LEFT: f64 = 90.0;
const ROW: f64 = 24.0;
const TOP: f64 = 48.0;

struct Canvas {
    body: String,
    /// Where "0 s" is: the start of the run.
    origin: u64,
    /// The window drawn.
    t0: u64,
    t1: u64,
    px_per_s: f64,
}

impl Canvas {
    fn x(&self, t: u64) -> f64 {
        LEFT + (t.saturating_sub(self.t0)) as f64 / 1e9 * self.px_per_s
    }

    /// Seconds since the start of the run, for labels.
    fn secs(&self, t: u64) -> f64 {
        (t.saturating_sub(self.origin)) as f64 / 1e9
    }

    fn visible(&self, t: u64) -> bool {
        (self.t0..=self.t1).contains(&t)
    }

    /// A bar on `row` from `from` to `to`, cut to the window (nothing when
    /// it lies outside).
    fn rect(&mut self, row: usize, from: u64, to: u64, inset: f64, color: &str, title: &str) {
        let (from, to) = (from.max(self.t0), to.min(self.t1));
        if from > to {
            return;
        }
        let x = self.x(from);
        let w = (self.x(to) - x).max(1.0);
        let y = TOP + row as f64 * ROW + inset;
        let h = ROW - 2.0 * inset;
        let _ = writeln!(
            self.body,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{color}"><title>{}</title></rect>"#,
            escape(title)
        );
    }

    fn text(&mut self, x: f64, y: f64, size: u32, anchor: &str, s: &str) {
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" text-anchor="{anchor}">{}</text>"#,
            escape(s)
        );
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A color per holder process, stable across renders.
fn holder_color(process: u64) -> String {
    let hue = (process.wrapping_mul(137)) % 360;
    format!("hsl({hue},55%,62%)")
}

fn fault_color(kind: &str) -> &'static str {
    match kind {
        "kill" | crate::churn::CHURN_KILL => "#d62728",
        "pause" | "pause-client" => "#ff7f0e",
        "partition" => "#9467bd",
        "wipe" | "truncate-wal" | "flip-sst" | "delete-running" => "#8c564b",
        "repair" => "#17becf",
        "late-exit" => "#000000",
        _ => "#7f7f7f",
    }
}

/// Renders the timeline of a run from `t0` to `t1` (CLOCK_MONOTONIC ns).
pub fn render(
    history: &History,
    faults: &[FaultWindow],
    leaders: &[LeaderSample],
    markers: &[(u64, String)],
    origin: u64,
    t0: u64,
    t1: u64,
) -> String {
    let span_s = (t1.saturating_sub(t0)) as f64 / 1e9;
    // 20 px a second, within 1,200 and 60,000 px.
    let width = (span_s * 20.0).clamp(1200.0, 60_000.0);
    let px_per_s = width / span_s.max(1.0);

    // Rows.
    let mut rows: Vec<String> = vec!["n1".into(), "n2".into(), "n3".into()];
    let mut clients: Vec<String> = faults
        .iter()
        .filter(|f| f.kind == "pause-client")
        .map(|f| f.target.clone())
        .collect();
    clients.sort();
    clients.dedup();
    rows.extend(clients.iter().cloned());
    let mut resources: Vec<String> = Vec::new();
    for e in history.events() {
        if let Op::Lock(LockOp::Acquire { resource, .. }) = &e.op {
            if !resources.contains(resource) {
                resources.push(resource.clone());
            }
        }
    }
    resources.sort();
    let first_resource_row = rows.len();
    rows.extend(resources.iter().map(|r| format!("lock {r}")));

    let mut c = Canvas {
        body: String::new(),
        origin,
        t0,
        t1,
        px_per_s,
    };
    let height = TOP + rows.len() as f64 * ROW + 40.0;
    let total_w = LEFT + width + 20.0;

    // Row backgrounds and labels.
    for (i, name) in rows.iter().enumerate() {
        let bg = if i % 2 == 0 { "#f4f4f4" } else { "#ffffff" };
        c.rect(i, t0, t1, 0.0, bg, name);
        c.text(
            LEFT - 6.0,
            TOP + i as f64 * ROW + ROW * 0.65,
            12,
            "end",
            name,
        );
    }

    // Leader segments.
    let mut seg: Option<(u64, u64)> = None; // (leader, since)
    for s in leaders {
        match (seg, s.leader) {
            (Some((l, _)), Some(now)) if l == now => {}
            (prev, now) => {
                if let Some((l, since)) = prev {
                    leader_bar(&mut c, l, since, s.time_ns);
                }
                seg = now.map(|l| (l, s.time_ns));
            }
        }
    }
    if let Some((l, since)) = seg {
        let end = leaders.last().map_or(t1, |s| s.time_ns);
        leader_bar(&mut c, l, since, end);
    }

    // Faults.
    for f in faults {
        let row = rows.iter().position(|r| *r == f.target);
        if let Some(row) = row {
            let mut title = format!(
                "{} {} from {:.2}s to {:.2}s",
                f.kind,
                f.target,
                c.secs(f.start_ns),
                c.secs(f.end_ns)
            );
            if let Some(d) = &f.detail {
                title.push_str(": ");
                title.push_str(d);
            }
            c.rect(row, f.start_ns, f.end_ns, 3.0, fault_color(&f.kind), &title);
        }
    }

    // Lock holders and refused writes.
    let mut open: BTreeMap<(String, u64), (u64, u64, String)> = BTreeMap::new();
    for e in history.events() {
        if e.kind != EventKind::Ok {
            continue;
        }
        let Op::Lock(op) = &e.op else { continue };
        match op {
            LockOp::HoldStart {
                resource,
                holder,
                token,
            } => {
                open.insert(
                    (resource.clone(), *token),
                    (e.time_ns, e.process, holder.clone()),
                );
            }
            LockOp::HoldEnd {
                resource, token, ..
            } => {
                if let Some((start, process, holder)) = open.remove(&(resource.clone(), *token)) {
                    if let Some(r) = resources.iter().position(|x| x == resource) {
                        hold_bar(
                            &mut c,
                            first_resource_row + r,
                            start,
                            e.time_ns,
                            process,
                            &holder,
                            *token,
                        );
                    }
                }
            }
            LockOp::FencedWrite {
                resource,
                target,
                holder,
                token,
                accepted: Some(false),
            } => {
                if let Some(r) = resources
                    .iter()
                    .position(|x| x == resource)
                    .filter(|_| c.visible(e.time_ns))
                {
                    let row = first_resource_row + r;
                    let (store, inset) = match target {
                        FenceTarget::Gate => ("fence gate".to_owned(), 0.0),
                        FenceTarget::Kv { key } => (format!("fenced KV {key}"), ROW - 5.0),
                    };
                    let x = c.x(e.time_ns);
                    let y = TOP + row as f64 * ROW + inset;
                    let _ = writeln!(
                        c.body,
                        r##"<rect x="{:.1}" y="{y:.1}" width="3" height="5" fill="#d62728"><title>{}</title></rect>"##,
                        x - 1.0,
                        escape(&format!(
                            "{store} refused stale token {token} from {holder} at {:.3}s",
                            c.secs(e.time_ns)
                        ))
                    );
                }
            }
            _ => {}
        }
    }
    for ((resource, token), (start, process, holder)) in open {
        if let Some(r) = resources.iter().position(|x| *x == resource) {
            hold_bar(
                &mut c,
                first_resource_row + r,
                start,
                t1,
                process,
                &holder,
                token,
            );
        }
    }

    // Time axis.
    let axis_y = TOP + rows.len() as f64 * ROW + 4.0;
    let step = [1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0]
        .into_iter()
        .find(|s| s * px_per_s >= 80.0)
        .unwrap_or(600.0);
    // Ticks at whole multiples of `step` since the start of the run.
    let offset = (t0.saturating_sub(origin)) as f64 / 1e9;
    let mut t = (offset / step).ceil() * step;
    while t <= offset + span_s {
        let x = LEFT + (t - offset) * px_per_s;
        let _ = writeln!(
            c.body,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{axis_y:.1}" stroke="#ccc" stroke-width="0.5"/>"##
        );
        c.text(x, axis_y + 14.0, 11, "middle", &format!("{t:.0}s"));
        t += step;
    }

    for (t, label) in markers {
        if !c.visible(*t) {
            continue;
        }
        let x = c.x(*t);
        let _ = writeln!(
            c.body,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{axis_y:.1}" stroke="#333" stroke-dasharray="4 3"/>"##,
            TOP - 14.0
        );
        c.text(x + 3.0, TOP - 4.0, 11, "start", label);
    }

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0}" height="{height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="16" font-size="13">latchkey nemesis run, {:.0} s to {:.0} s. Replica rows: green = leader, red = killed, orange = paused (SIGSTOP), purple = partitioned, brown = disk fault, teal = repair. Lock rows: one bar per grant (label: fencing token); red marks: stale writes refused (top: fence gate, bottom: fenced KV).</text>"##,
        offset,
        offset + span_s
    );
    svg.push_str(&c.body);
    svg.push_str("</svg>\n");
    svg
}

fn leader_bar(c: &mut Canvas, leader: u64, from: u64, to: u64) {
    if (1..=3).contains(&leader) {
        let title = format!("n{leader} leads");
        c.rect((leader - 1) as usize, from, to, 8.0, "#2ca02c", &title);
    }
}

fn hold_bar(
    c: &mut Canvas,
    row: usize,
    from: u64,
    to: u64,
    process: u64,
    holder: &str,
    token: u64,
) {
    let title = format!(
        "token {token} held by {holder} from {:.3}s to {:.3}s",
        c.secs(from),
        c.secs(to)
    );
    c.rect(row, from, to, 5.0, &holder_color(process), &title);
    let (from, to) = (from.max(c.t0), to.min(c.t1));
    if from > to {
        return;
    }
    let w = c.x(to) - c.x(from);
    let label = token.to_string();
    if w > 7.0 * label.len() as f64 {
        let x = (c.x(from) + c.x(to)) / 2.0;
        let y = TOP + row as f64 * ROW + ROW * 0.65;
        c.text(x, y, 10, "middle", &label);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_check::history::ops;
    use latchkey_check::HistoryBuilder;

    #[test]
    fn draws_every_kind_of_row() {
        let mut h = HistoryBuilder::new();
        h.invoke(1, 1_000_000_000, ops::acquire("res0", "p1/s1", None));
        h.ok(1, 1_100_000_000, ops::acquire("res0", "p1/s1", Some(7)));
        h.ok(1, 1_100_000_001, ops::hold_start("res0", "p1/s1", 7));
        h.invoke(1, 1_200_000_000, ops::gate_write("res0", "p1/s1", 7, None));
        h.ok(
            1,
            1_300_000_000,
            ops::gate_write("res0", "p1/s1", 7, Some(false)),
        );
        h.ok(1, 4_000_000_000, ops::hold_end("res0", "p1/s1", 7));
        let history = h.build().unwrap();
        let faults = vec![
            FaultWindow {
                kind: "kill".into(),
                target: "n2".into(),
                start_ns: 2_000_000_000,
                end_ns: 3_000_000_000,
                detail: None,
            },
            FaultWindow {
                kind: "pause-client".into(),
                target: "w1".into(),
                start_ns: 2_000_000_000,
                end_ns: 5_000_000_000,
                detail: None,
            },
            FaultWindow {
                kind: "repair".into(),
                target: "n3".into(),
                start_ns: 6_000_000_000,
                end_ns: 8_000_000_000,
                detail: Some("ok in 2.0 s".into()),
            },
        ];
        let leaders = vec![
            LeaderSample {
                time_ns: 0,
                leader: Some(1),
                term: Some(1),
            },
            LeaderSample {
                time_ns: 3_000_000_000,
                leader: Some(3),
                term: Some(2),
            },
        ];
        let markers = vec![(6_000_000_000, "faults end".to_owned())];
        let svg = render(&history, &faults, &leaders, &markers, 0, 0, 10_000_000_000);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("kill n2 from 2.00s to 3.00s"));
        assert!(svg.contains("pause-client w1"));
        assert!(svg.contains("repair n3 from 6.00s to 8.00s: ok in 2.0 s"));
        assert!(svg.contains("#17becf"));
        assert!(svg.contains("n1 leads") && svg.contains("n3 leads"));
        assert!(svg.contains("token 7 held by p1/s1"));
        assert!(svg.contains("fence gate refused stale token 7"));
        assert!(svg.contains(">lock res0<"));
        assert!(svg.contains(">faults end<"));

        // A window: only what overlaps it, labelled in run time.
        let svg = render(
            &history,
            &faults,
            &leaders,
            &markers,
            0,
            2_500_000_000,
            3_500_000_000,
        );
        assert!(svg.contains("kill n2 from 2.00s to 3.00s"));
        assert!(svg.contains("token 7 held by p1/s1"));
        assert!(
            !svg.contains("refused stale token"),
            "the refusal at 1.3 s is outside"
        );
        assert!(!svg.contains(">faults end<"));
        assert!(svg.contains(">3s<"));
    }
}
