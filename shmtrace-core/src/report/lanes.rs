//! One lane per process: its life as a thin line, each /dev/shm object it held as a bar from
//! the moment it got hold of it to the moment it let go (labelled with the object's name and
//! size), and its failures (triangles) and death (a cross).
use std::fmt::Write as _;

use super::{
    chart::{LEFT, RIGHT, Scale, WIDTH, time_axis},
    markup::Html,
    timeline::{Lane, Mark, Span, Timeline},
};
use crate::{event::escape::truncate, units::human};

/// Height of one row of bars; a lane has a row per object held at the same time.
const ROW: f64 = 14.0;
/// Overlapping holds beyond this many rows share the last row.
const MAX_ROWS: usize = 16;
/// Room above the bars for failure marks and their labels, and below them.
const PAD_TOP: f64 = 14.0;
const PAD_BOTTOM: f64 = 6.0;
const MIN_LANE: f64 = 36.0;
const AXIS: f64 = 26.0;
/// Lanes beyond this many are left out (and counted).
pub const MAX_LANES: usize = 200;
/// Average width of a label character at the lanes' font size, for fitting labels in bars.
const CHAR_WIDTH: f64 = 6.3;
/// Marks of a kind closer than this (in user units) share one label.
const MARK_CLUSTER: f64 = 60.0;

/// Bars drawn as one: a single hold, or holds too short and close together to tell apart.
struct Bar<'a> {
    x1: f64,
    x2: f64,
    spans: Vec<&'a Span>,
}

impl Bar<'_> {
    fn still_held(&self) -> bool {
        self.spans.iter().any(|s| s.end_ns.is_none())
    }
}

pub fn lanes(out: &mut String, timeline: &Timeline, scale: &Scale) {
    let lanes = &timeline.lanes()[..timeline.lanes().len().min(MAX_LANES)];
    let laid: Vec<(&Lane, Vec<Vec<Bar<'_>>>)> = lanes
        .iter()
        .map(|lane| (lane, rows(lane.pid, timeline.spans(), scale)))
        .collect();
    let heights: Vec<f64> = laid
        .iter()
        .map(|(_, rows)| (rows.len().max(1) as f64 * ROW + PAD_TOP + PAD_BOTTOM).max(MIN_LANE))
        .collect();
    let total: f64 = heights.iter().sum::<f64>() + AXIS;
    let _ = writeln!(
        out,
        r#"<svg class="lanes" viewBox="0 0 {WIDTH} {total:.1}" role="img" aria-label="/dev/shm objects held by each process over time">"#
    );
    time_axis(out, scale, 0.0, total - AXIS);
    let mut top = 0.0;
    for (i, ((lane, rows), height)) in laid.iter().zip(&heights).enumerate() {
        let marks: Vec<&Mark> = timeline
            .marks()
            .iter()
            .filter(|m| m.pid == lane.pid)
            .collect();
        draw_lane(out, lane, rows, &marks, scale, top, *height, i % 2 == 1);
        top += height;
    }
    let _ = writeln!(out, "</svg>");
}

#[allow(clippy::too_many_arguments)]
fn draw_lane(
    out: &mut String,
    lane: &Lane,
    rows: &[Vec<Bar<'_>>],
    marks: &[&Mark],
    scale: &Scale,
    top: f64,
    height: f64,
    shaded: bool,
) {
    let _ = writeln!(
        out,
        r#"<g class="lane" data-pid="{}" data-role="{}">"#,
        lane.pid,
        Html(&role_name(lane))
    );
    if shaded {
        let _ = writeln!(
            out,
            r#"<rect class="lane-bg" x="0" y="{top:.1}" width="{WIDTH}" height="{height:.1}"/>"#
        );
    }
    let mid = top + height / 2.0;
    let subtitle = [lane.comm.as_str(), lane.place.as_str()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" · ");
    let _ = writeln!(
        out,
        r#"<text class="lane-title" x="{:.1}" y="{:.1}" text-anchor="end">{}</text><text class="lane-subtitle" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
        LEFT - 8.0,
        mid - 2.0,
        Html(&truncate(&lane.title(), 30)),
        LEFT - 8.0,
        mid + 11.0,
        Html(&truncate(&subtitle, 34)),
    );
    let end = lane.exit.map(|(ts, _)| ts).unwrap_or(scale.end_ns);
    let _ = writeln!(
        out,
        r#"<line class="life" x1="{:.1}" y1="{mid:.1}" x2="{:.1}" y2="{mid:.1}"/>"#,
        scale.x(lane.first_ns),
        scale.x(end)
    );
    for (r, row) in rows.iter().enumerate() {
        let y = top + PAD_TOP + r as f64 * ROW;
        for (i, bar) in row.iter().enumerate() {
            // Where the next bar of the row starts: room for a label beside a short bar.
            let next = row.get(i + 1).map_or(WIDTH - RIGHT, |next| next.x1);
            draw_bar(out, bar, scale, y, next);
        }
    }
    let mut label_end = f64::MIN;
    for (i, mark) in marks.iter().enumerate() {
        let x = scale.x(mark.ts_ns);
        let (shape, label_y) = if mark.kind.is_death() {
            (
                format!(
                    "M{:.1},{:.1} L{:.1},{:.1} M{:.1},{:.1} L{:.1},{:.1}",
                    x - 5.0,
                    mid - 5.0,
                    x + 5.0,
                    mid + 5.0,
                    x - 5.0,
                    mid + 5.0,
                    x + 5.0,
                    mid - 5.0
                ),
                mid + 4.0,
            )
        } else {
            (
                format!(
                    "M{:.1},{:.1} L{:.1},{:.1} L{x:.1},{:.1} Z",
                    x - 6.0,
                    top + 1.0,
                    x + 6.0,
                    top + 1.0,
                    top + 11.0
                ),
                top + 11.0,
            )
        };
        // Marks of a kind close together share one label, `ENOSPC ×2`, given by the first:
        // labels never sit on one another or on the bars.
        let (label_x, label) = if x + 8.0 < label_end {
            (x + 8.0, String::new())
        } else {
            let alike = marks[i..]
                .iter()
                .take_while(|m| m.kind == mark.kind && scale.x(m.ts_ns) - x < MARK_CLUSTER)
                .count();
            let label = match alike {
                1 => mark.short.clone(),
                n => format!("{} ×{n}", mark.short),
            };
            // After the last mark it stands for, clear of their shapes.
            let label_x = scale.x(marks[i + alike - 1].ts_ns) + 8.0;
            label_end = label_x + label.chars().count() as f64 * CHAR_WIDTH;
            (label_x, label)
        };
        let _ = writeln!(
            out,
            r#"<g class="marker {}" data-pid="{}"><path d="{shape}"/><text x="{label_x:.1}" y="{label_y:.1}">{}</text><title>{} · pid {}: {}</title></g>"#,
            mark.kind.class(),
            mark.pid,
            Html(&label),
            scale.label(mark.ts_ns),
            mark.pid,
            Html(&mark.detail)
        );
    }
    let _ = writeln!(out, "</g>");
}

fn draw_bar(out: &mut String, bar: &Bar<'_>, scale: &Scale, y: f64, next: f64) {
    let width = (bar.x2 - bar.x1).max(1.5);
    let class = if bar.still_held() {
        "span held-at-end"
    } else {
        "span"
    };
    let first = bar.spans[0];
    let (label, title) = if bar.spans.len() == 1 {
        let end = match first.end_ns {
            Some(end) => scale.label(end),
            None => "the end (still held)".to_owned(),
        };
        (
            // The size first: what is left of a label cut short should be what matters.
            format!("{} · {}", human(first.bytes), short_name(&first.name)),
            format!(
                "{} ({}), held from {} to {}",
                first.name,
                human(first.bytes),
                scale.label(first.start_ns),
                end
            ),
        )
    } else {
        let largest = bar.spans.iter().map(|s| s.bytes).max().unwrap_or(0);
        (
            format!("{} objects", bar.spans.len()),
            format!(
                "{} objects held one after another between {} and {}, up to {} each: {}, …",
                bar.spans.len(),
                scale.label(first.start_ns),
                scale.label(
                    bar.spans
                        .iter()
                        .filter_map(|s| s.end_ns)
                        .max()
                        .unwrap_or(scale.end_ns)
                ),
                human(largest),
                first.name
            ),
        )
    };
    let _ = write!(
        out,
        r#"<g class="{class}" data-object="{}"><rect x="{:.1}" y="{:.1}" width="{width:.1}" height="{:.1}" rx="2"/>"#,
        Html(&first.name),
        bar.x1,
        y + 1.0,
        ROW - 3.0
    );
    let fits = ((width - 6.0) / CHAR_WIDTH).floor() as usize;
    // A count cut short says nothing: `×17375` rather than `17375…`.
    let label = match bar.spans.len() {
        n if n > 1 && label.chars().count() > fits => format!("×{n}"),
        _ => label,
    };
    // Beside the bar when it is too short for its label and the row leaves room after it.
    let beside = ((next - bar.x1 - width - 6.0) / CHAR_WIDTH).floor() as usize;
    if fits < label.chars().count().min(12) && beside > fits && beside >= 8 {
        let _ = write!(
            out,
            r#"<text class="beside" x="{:.1}" y="{:.1}">{}</text>"#,
            bar.x1 + width + 3.0,
            y + ROW - 5.0,
            Html(&truncate(&label, beside))
        );
    } else if fits >= 4 && (bar.spans.len() == 1 || label.chars().count() <= fits) {
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            bar.x1 + 3.0,
            y + ROW - 5.0,
            Html(&truncate(&label, fits))
        );
    }
    let _ = writeln!(out, "<title>{}</title></g>", Html(&title));
}

/// `torch_46_3375573818_2` for `/dev/shm/torch_46_3375573818_2`: the directory is the same for
/// all.
fn short_name(name: &str) -> &str {
    name.strip_prefix("/dev/shm/").unwrap_or(name)
}

fn role_name(lane: &Lane) -> String {
    format!("{:?}", lane.role.kind).to_lowercase()
}

/// The process's holds, packed into rows so that holds at the same time sit one above the
/// other, and merged where they are too short to draw apart.
fn rows<'a>(pid: u32, spans: &'a [Span], scale: &Scale) -> Vec<Vec<Bar<'a>>> {
    let mut mine: Vec<&Span> = spans.iter().filter(|s| s.pid == pid).collect();
    mine.sort_by_key(|s| (s.start_ns, s.end_ns.unwrap_or(u64::MAX)));
    let mut rows: Vec<Vec<Bar<'_>>> = Vec::new();
    for span in mine {
        let x1 = scale.x(span.start_ns);
        let x2 = scale.x(span.end_ns.unwrap_or(scale.end_ns)).max(x1);
        let free = rows
            .iter()
            .position(|row| row.last().is_none_or(|bar| bar.x2 <= x1 + 0.5));
        let row = match free {
            Some(row) => row,
            None if rows.len() < MAX_ROWS => {
                rows.push(Vec::new());
                rows.len() - 1
            }
            // Crowded: the row that frees up first.
            None => rows
                .iter()
                .enumerate()
                .min_by(|a, b| {
                    let end = |row: &Vec<Bar<'_>>| row.last().map_or(0.0, |bar| bar.x2);
                    end(a.1).total_cmp(&end(b.1))
                })
                .map(|(i, _)| i)
                .unwrap_or(0),
        };
        let row = &mut rows[row];
        match row.last_mut() {
            // Too short to see apart from the bar before it (itself short, or already standing
            // for several): one bar, counted.
            Some(bar)
                if x2 - x1 < 3.0
                    && x1 - bar.x2 < 2.0
                    && (bar.spans.len() > 1 || bar.x2 - bar.x1 < 3.0) =>
            {
                bar.x2 = bar.x2.max(x2);
                bar.spans.push(span);
            }
            _ => row.push(Bar {
                x1,
                x2,
                spans: vec![span],
            }),
        }
    }
    // The rows with the biggest objects on top: a batch matters more than a semaphore.
    rows.sort_by_key(|row| {
        std::cmp::Reverse(
            row.iter()
                .flat_map(|bar| &bar.spans)
                .map(|s| s.bytes)
                .max()
                .unwrap_or(0),
        )
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::InodeId;

    fn span(start_ns: u64, end_ns: u64, ino: u64) -> Span {
        Span {
            pid: 7,
            inode: InodeId { dev: 26, ino },
            name: format!("/dev/shm/burst_{ino}"),
            bytes: 4096,
            start_ns,
            end_ns: Some(end_ns),
        }
    }

    #[test]
    fn a_burst_of_short_holds_is_one_counted_bar_and_long_holds_stay_apart() {
        let scale = Scale::new(0, (0, 1_000_000_000));
        // A thousand holds of 10 µs one after another, then one held for half the trace.
        let mut spans: Vec<Span> = (0..1000)
            .map(|i| span(i * 100_000, i * 100_000 + 10_000, i))
            .collect();
        spans.push(span(400_000_000, 900_000_000, 5000));
        spans.push(span(900_000_100, 900_010_000, 5001));
        let laid = rows(7, &spans, &scale);
        assert_eq!(laid.len(), 1);
        let counts: Vec<usize> = laid[0].iter().map(|bar| bar.spans.len()).collect();
        assert_eq!(counts, [1000, 1, 1]);
        // Holds at the same time get rows of their own, the biggest on top.
        let mut overlapping = vec![span(0, 500_000_000, 1), span(100, 400_000_000, 2)];
        overlapping[1].bytes = 1 << 20;
        let laid = rows(7, &overlapping, &scale);
        assert_eq!(laid.len(), 2);
        assert_eq!(laid[0][0].spans[0].bytes, 1 << 20);
    }
}
