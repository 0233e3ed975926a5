//! The /dev/shm use chart, one per file system: the pages the traced objects held over time and
//! their sizes (from the model), what statfs measured in use, and the measured size as the
//! ceiling, with the failures on that file system as vertical lines. Also the time scale and axes it
//! shares with the process lanes, so both line up on the page.
use std::fmt::Write as _;

use super::{
    markup::Html,
    timeline::{Device, Mark},
};
use crate::units::human;

/// The SVG's width in user units; CSS scales it to the page.
pub const WIDTH: f64 = 1200.0;
/// Room on the left for lane titles and byte labels.
pub const LEFT: f64 = 210.0;
pub const RIGHT: f64 = 24.0;
const PLOT_HEIGHT: f64 = 170.0;
const TOP: f64 = 18.0;
const BOTTOM: f64 = 26.0;
/// More points than this in one series are reduced to the peak in each pixel column.
const MAX_POINTS: usize = 2400;

/// Boot-time nanoseconds to x, over the window shown; labels count from the trace's start.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// Time zero of the labels: the trace's first record.
    pub origin_ns: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Scale {
    pub fn new(origin_ns: u64, (start_ns, end_ns): (u64, u64)) -> Scale {
        // A window of one instant still gets an axis.
        let end_ns = end_ns.max(start_ns + 1_000_000);
        Scale {
            origin_ns: origin_ns.min(start_ns),
            start_ns,
            end_ns,
        }
    }

    pub fn plot_width() -> f64 {
        WIDTH - LEFT - RIGHT
    }

    /// Times outside the window are drawn at its edge.
    pub fn x(&self, ts_ns: u64) -> f64 {
        let ts = ts_ns.clamp(self.start_ns, self.end_ns);
        LEFT + (ts - self.start_ns) as f64 / (self.end_ns - self.start_ns) as f64
            * Self::plot_width()
    }

    /// Seconds after the trace's start.
    pub fn seconds(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.origin_ns) as f64 / 1e9
    }

    /// About eight round times across the window: `(x, "1.5 s")`.
    pub fn ticks(&self) -> Vec<(f64, String)> {
        let span = (self.end_ns - self.start_ns) as f64 / 1e9;
        let step = nice_step(span / 8.0);
        let decimals = (-step.log10().floor()).max(0.0) as usize;
        let first = (self.seconds(self.start_ns) / step - 1e-9).ceil() as i64;
        let last = self.seconds(self.end_ns);
        (first..)
            .map(|i| i as f64 * step)
            .take_while(|seconds| *seconds <= last + step * 1e-9)
            .map(|seconds| {
                let ts = self.origin_ns + (seconds * 1e9).round() as u64;
                (self.x(ts), format!("{seconds:.decimals$} s"))
            })
            .collect()
    }

    /// `1.234 s` for tooltips.
    pub fn label(&self, ts_ns: u64) -> String {
        format!("{:.3} s", self.seconds(ts_ns))
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1e-6);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|step| *step >= raw * 0.999)
        .unwrap_or(10.0 * power)
}

/// A top for the byte axis a little above `max`, and three to five ticks at multiples of a
/// power of two (256 KiB, 512 KiB, ...), which read well in binary units.
pub fn byte_ticks(max: u64) -> (u64, Vec<u64>) {
    let max = max.max(4096);
    let max = max.saturating_add(max / 20);
    let step = (0..63)
        .map(|shift| 1u64 << shift)
        .find(|step| max.div_ceil(*step) <= 5)
        .unwrap_or(1 << 63);
    let top = max.div_ceil(step).saturating_mul(step);
    (top, (0..=top / step).map(|i| i * step).collect())
}

/// The x axis under a plot: ticks, their labels, and light vertical grid lines up to `top`.
pub fn time_axis(out: &mut String, scale: &Scale, top: f64, bottom: f64) {
    let _ = writeln!(out, r#"<g class="time-axis">"#);
    for (x, label) in scale.ticks() {
        let _ = writeln!(
            out,
            r#"<line class="grid" x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{bottom:.1}"/><text class="tick" x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#,
            bottom + 14.0
        );
    }
    let _ = writeln!(out, "</g>");
}

/// How far above the most that was measured or held the byte axis goes, in percent: room to
/// show the objects' sizes rising past the limit, which is what a failure is about, without
/// letting a nominal total of many times the size crush the limit to a line at the bottom.
const DEMAND_SHOWN_PERCENT: u64 = 150;
/// Failure marks closer than this (in user units) share one label.
const MARK_CLUSTER: f64 = 40.0;

/// One file system's chart: the pages the traced objects held (filled), their sizes (an
/// outline, cut at the top of the chart), the use statfs measured, and the size.
pub fn usage(out: &mut String, dev: u32, device: &Device, marks: &[Mark], scale: &Scale) {
    let height = TOP + PLOT_HEIGHT + BOTTOM;
    let size = device.size().unwrap_or(0);
    let ceiling = size.max(device.peak_used()).max(device.peak_held());
    let shown_demand = match ceiling {
        0 => device.peak_demand(),
        ceiling => device
            .peak_demand()
            .min(ceiling * DEMAND_SHOWN_PERCENT / 100),
    };
    let (top_bytes, ticks) = byte_ticks(ceiling.max(shown_demand));
    let y = |bytes: u64| {
        TOP + PLOT_HEIGHT - bytes.min(top_bytes) as f64 / top_bytes as f64 * PLOT_HEIGHT
    };
    let bottom = TOP + PLOT_HEIGHT;
    let _ = writeln!(
        out,
        r#"<svg class="usage-chart" data-dev="{}" data-top="{top_bytes}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="/dev/shm use over time">"#,
        dev_string(dev)
    );
    let _ = writeln!(out, r#"<g class="byte-axis">"#);
    for tick in &ticks {
        let _ = writeln!(
            out,
            r#"<line class="grid" x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            WIDTH - RIGHT,
            LEFT - 6.0,
            y(*tick) + 4.0,
            human(*tick),
            y = y(*tick),
        );
    }
    let _ = writeln!(out, "</g>");
    time_axis(out, scale, TOP, bottom);

    // What the traced objects' pages took: a filled step curve.
    if let Some(d) = step_path(&reduce(&device.held, scale), scale, &y, bottom, true) {
        let _ = writeln!(
            out,
            r#"<path class="usage-held" d="{d}"><title>pages held by the traced processes' objects, as their calls showed (at most {})</title></path>"#,
            human(device.peak_held())
        );
    }
    // Their sizes, which pages fill only as they are written: an outline, cut at the top.
    if let Some(d) = step_path(&reduce(&device.demand, scale), scale, &y, bottom, false) {
        let _ = writeln!(
            out,
            r#"<path class="usage-demand" d="{d}"><title>sizes of the traced processes' live objects (at most {})</title></path>"#,
            human(device.peak_demand())
        );
    }
    if device.peak_demand() > top_bytes {
        let _ = writeln!(
            out,
            r#"<text class="demand-cut" x="{:.1}" y="{:.1}" text-anchor="end">sizes of the objects reach {} (cut at the top): more than /dev/shm can hold</text>"#,
            WIDTH - RIGHT - 6.0,
            TOP + 12.0,
            human(device.peak_demand())
        );
    }

    // What statfs measured: used, and the size as the ceiling.
    let mut all = device.samples.clone();
    all.sort_by_key(|s| s.ts_ns);
    // The window shows the measurements in it, after the last one before it (which still held
    // at its start).
    let first = all
        .iter()
        .rposition(|s| s.ts_ns <= scale.start_ns)
        .unwrap_or(0);
    let shown: Vec<_> = all[first..]
        .iter()
        .filter(|s| s.ts_ns <= scale.end_ns)
        .collect();
    if !shown.is_empty() {
        // A measurement holds until the next one: a step line, not a guess in between.
        let mut used = String::new();
        for (i, sample) in shown.iter().enumerate() {
            let x = scale.x(sample.ts_ns);
            if i == 0 {
                let _ = write!(used, "M{x:.1},{:.1}", y(sample.used));
            } else {
                let _ = write!(
                    used,
                    " L{x:.1},{:.1} L{x:.1},{:.1}",
                    y(shown[i - 1].used),
                    y(sample.used)
                );
            }
        }
        let _ = writeln!(out, r#"<path class="usage-measured" d="{used}"/>"#);
        for sample in shown.iter().take(MAX_POINTS) {
            let _ = writeln!(
                out,
                r#"<circle class="sample" cx="{:.1}" cy="{:.1}" r="2.5"><title>{}: {} of {} used (statfs)</title></circle>"#,
                scale.x(sample.ts_ns),
                y(sample.used),
                scale.label(sample.ts_ns),
                human(sample.used),
                human(sample.size)
            );
        }
    }
    // The size can change (a remount): drawn as measured, across the whole width.
    let mut d = String::new();
    let mut last: Option<u64> = None;
    for sample in &all {
        let x = scale.x(sample.ts_ns);
        match last {
            None => {
                let _ = write!(d, "M{LEFT:.1},{:.1}", y(sample.size));
            }
            Some(size) if size != sample.size => {
                let _ = write!(d, " L{x:.1},{:.1} L{x:.1},{:.1}", y(size), y(sample.size));
            }
            Some(_) => {}
        }
        last = Some(sample.size);
    }
    if let Some(size) = last {
        let _ = write!(d, " L{:.1},{:.1}", WIDTH - RIGHT, y(size));
        let _ = writeln!(
            out,
            r#"<path class="capacity" d="{d}"/><text class="capacity-label" x="{:.1}" y="{:.1}" text-anchor="end">size {}</text>"#,
            WIDTH - RIGHT - 4.0,
            y(size) - 5.0,
            human(size)
        );
    }

    // A line per failure; failures close together share one label (`ENOSPC ×3`), so that
    // labels never sit on one another.
    let mine: Vec<&Mark> = marks
        .iter()
        .filter(|m| m.dev == Some(dev) && !m.kind.is_death())
        .collect();
    for mark in &mine {
        let x = scale.x(mark.ts_ns);
        let _ = writeln!(
            out,
            r#"<g class="marker-line {}"><line x1="{x:.1}" y1="{TOP:.1}" x2="{x:.1}" y2="{bottom:.1}"/><title>{} (pid {}): {}</title></g>"#,
            mark.kind.class(),
            scale.label(mark.ts_ns),
            mark.pid,
            Html(&mark.detail)
        );
    }
    let mut label_end = f64::MIN;
    for cluster in clusters(&mine, scale) {
        let x = scale.x(cluster[0].ts_ns).max(label_end);
        let label = match cluster.len() {
            1 => cluster[0].short.clone(),
            n => format!("{} ×{n}", cluster[0].short),
        };
        label_end = x + 3.0 + label.chars().count() as f64 * 7.5 + 12.0;
        let _ = writeln!(
            out,
            r#"<g class="marker-line {}"><text x="{:.1}" y="{:.1}">{}</text></g>"#,
            cluster[0].kind.class(),
            x + 3.0,
            bottom - 6.0,
            Html(&label)
        );
    }
    let _ = writeln!(
        out,
        r#"<line class="axis" x1="{LEFT}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}"/></svg>"#,
        WIDTH - RIGHT
    );
}

/// Marks of one kind within [`MARK_CLUSTER`] of the first of their group, in time order.
fn clusters<'a>(marks: &[&'a Mark], scale: &Scale) -> Vec<Vec<&'a Mark>> {
    let mut sorted: Vec<&Mark> = marks.to_vec();
    sorted.sort_by_key(|m| m.ts_ns);
    let mut out: Vec<Vec<&Mark>> = Vec::new();
    for mark in sorted {
        match out.last_mut() {
            Some(cluster)
                if cluster[0].kind == mark.kind
                    && scale.x(mark.ts_ns) - scale.x(cluster[0].ts_ns) < MARK_CLUSTER =>
            {
                cluster.push(mark)
            }
            _ => out.push(vec![mark]),
        }
    }
    out
}

/// A step curve through `points`, to the right edge: closed down to `bottom` to be filled, or
/// open (an outline). `None` without points.
fn step_path(
    points: &[(u64, u64)],
    scale: &Scale,
    y: &dyn Fn(u64) -> f64,
    bottom: f64,
    filled: bool,
) -> Option<String> {
    let first = points.first()?;
    let mut d = format!("M{:.1},{bottom:.1}", scale.x(first.0));
    let mut last_y = bottom;
    for (ts, bytes) in points {
        let x = scale.x(*ts);
        let _ = write!(d, " L{x:.1},{last_y:.1}");
        last_y = y(*bytes);
        let _ = write!(d, " L{x:.1},{last_y:.1}");
    }
    let _ = write!(d, " L{:.1},{last_y:.1}", WIDTH - RIGHT);
    if filled {
        let _ = write!(d, " L{:.1},{bottom:.1} Z", WIDTH - RIGHT);
    }
    Some(d)
}

/// `major:minor`.
pub fn dev_string(dev: u32) -> String {
    shmtrace_common::KernelDev(dev).to_string()
}

/// A step series with about one change per pixel column at most: each column keeps its peak,
/// so that how close use came to the ceiling stays visible, and the level it ended at.
fn reduce(points: &[(u64, u64)], scale: &Scale) -> Vec<(u64, u64)> {
    if points.len() <= MAX_POINTS {
        return points.to_vec();
    }
    struct Column {
        index: i64,
        first_ts: u64,
        peak: u64,
        last_ts: u64,
        last: u64,
    }
    let mut out = Vec::new();
    let mut flush = |column: &Column| {
        out.push((column.first_ts, column.peak));
        if column.last != column.peak {
            out.push((column.last_ts, column.last));
        }
    };
    let mut current: Option<Column> = None;
    for (ts, bytes) in points {
        let index = scale.x(*ts) as i64;
        match &mut current {
            Some(column) if column.index == index => {
                column.peak = column.peak.max(*bytes);
                column.last_ts = *ts;
                column.last = *bytes;
            }
            _ => {
                if let Some(column) = &current {
                    flush(column);
                }
                current = Some(Column {
                    index,
                    first_ts: *ts,
                    peak: *bytes,
                    last_ts: *ts,
                    last: *bytes,
                });
            }
        }
    }
    if let Some(column) = &current {
        flush(column);
    }
    out
}
