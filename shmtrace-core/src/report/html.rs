//! `report --html`: one page that needs nothing but itself. Styles are inline, the pictures are
//! inline SVG, there is no script, and nothing is fetched (no fonts, no CDN), so it can be
//! attached to a bug report and opened anywhere, offline.
use std::{fmt::Write as _, io};

use super::{
    About,
    chart::{self, Scale, dev_string},
    lanes::{self, MAX_LANES},
    markup::Html,
    timeline::{MarkKind, Timeline},
};
use crate::{
    diagnose::{Cause, Diagnosis},
    output::{diagnosis, group},
    units::human,
};

const STYLE: &str = include_str!("report.css");

pub fn write(out: &mut dyn io::Write, timeline: &Timeline, about: &About) -> io::Result<()> {
    out.write_all(render(timeline, about).as_bytes())
}

pub fn render(timeline: &Timeline, about: &About) -> String {
    let (start, end) = timeline.range();
    let scale = Scale::new(start, timeline.window());
    let shown = if (scale.start_ns, scale.end_ns) == (start, end) {
        String::new()
    } else {
        format!(
            " The pictures show {:.3} s to {:.3} s, where /dev/shm was in use.",
            scale.seconds(scale.start_ns),
            scale.seconds(scale.end_ns)
        )
    };
    let containers: String = timeline
        .containers()
        .iter()
        .map(|c| format!("<p class=\"container\">{}</p>\n", Html(c)))
        .collect();
    let mut page = String::new();
    let _ = writeln!(
        page,
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="shmtrace {}">
<title>shmtrace report</title>
<style>
{STYLE}</style>
</head>
<body>
<header>
<h1>shmtrace report</h1>
<p class="trace">{}</p>
{containers}<p class="range">From {} for {:.3} s; times below are seconds after that.{shown}</p>
{}
</header>"#,
        Html(&about.tool_version),
        Html(&about.description),
        Html(&about.clock.rfc3339(start)),
        scale.seconds(end),
        counts(timeline),
    );
    // The picture first: what filled /dev/shm, against its size; then why, and who.
    usage(&mut page, timeline, &scale);
    diagnoses(&mut page, timeline.diagnoses());
    processes(&mut page, timeline, &scale);
    let _ = writeln!(
        page,
        r#"<footer>Made by shmtrace {} from a recorded trace. Hover over a bar or a mark for details.</footer>
</body>
</html>"#,
        Html(&about.tool_version)
    );
    page
}

fn counts(timeline: &Timeline) -> String {
    let lost = match timeline.lost() {
        0 => String::new(),
        n => format!(
            "\n<p class=\"lost\">{n} events were lost (the kernel's ring buffer was full): \
             the pictures have gaps. Record with a larger --buffer-size.</p>"
        ),
    };
    let failures = timeline
        .marks()
        .iter()
        .filter(|m| !m.kind.is_death())
        .count();
    let deaths = timeline
        .marks()
        .iter()
        .filter(|m| m.kind.is_death())
        .count();
    let semaphores = match timeline.semaphore_holds() {
        0 => String::new(),
        n => format!(
            " {n} hold{} of POSIX semaphores (/dev/shm/sem.*, a page each) are left out of \
             the picture.",
            plural(n, "s")
        ),
    };
    format!(
        r#"<p class="counts">{} process{} held /dev/shm objects, failed or died ({} more did none of that and are left out); {} hold{} of /dev/shm objects; {} failure{}; {} abnormal exit{}.{semaphores}</p>"#,
        timeline.lanes().len(),
        plural(timeline.lanes().len(), "es"),
        timeline.quiet_processes(),
        timeline.spans().len(),
        plural(timeline.spans().len(), "s"),
        failures,
        plural(failures, "s"),
        deaths,
        plural(deaths, "s"),
    ) + &lost
}

fn plural(n: usize, suffix: &'static str) -> &'static str {
    if n == 1 { "" } else { suffix }
}

fn diagnoses(page: &mut String, all: &[Diagnosis]) {
    let _ = writeln!(page, r#"<section id="diagnosis"><h2>Diagnosis</h2>"#);
    if all.is_empty() {
        let _ = writeln!(
            page,
            r#"<p class="none">Nothing failed: no process ran out of /dev/shm or died of it.</p>"#
        );
    }
    // One block per story (processes that failed the same way at the same time), the first
    // open, the others folded under their headlines.
    for (i, block) in group::blocks(all).iter().enumerate() {
        let d = block[0];
        let class = if d.cause == Cause::ShmFull {
            "diagnosis shm-full"
        } else {
            "diagnosis"
        };
        let lines = diagnosis::block_lines(block);
        let headline = lines.first().map(|(_, text)| text.as_str()).unwrap_or("");
        let pids: Vec<String> = block.iter().map(|d| d.pid.to_string()).collect();
        let _ = writeln!(
            page,
            r#"<details class="{class}" data-pid="{}"{}><summary>{}</summary><pre>"#,
            pids.join(" "),
            if i == 0 { " open" } else { "" },
            Html(headline)
        );
        for (label, text) in lines.iter().skip(1) {
            // Labels are shmtrace's own words; the text carries traced names.
            let _ = writeln!(page, "{label:<9} {}", Html(text));
        }
        let _ = writeln!(page, "</pre></details>");
    }
    let _ = writeln!(page, "</section>");
}

fn usage(page: &mut String, timeline: &Timeline, scale: &Scale) {
    let _ = writeln!(
        page,
        r#"<section id="usage"><h2>/dev/shm use over time</h2>
<p class="legend"><span class="key held"></span>pages held by the traced processes' objects, as their calls showed
<span class="key demand"></span>their sizes
<span class="key measured"></span>in use, as measured (statfs)
<span class="key capacity"></span>size
<span class="key enospc"></span>ENOSPC <span class="key sigbus"></span>SIGBUS</p>
<p class="note">The sizes can exceed /dev/shm: a file's pages are taken only as they are written,
so a size set with ftruncate costs nothing until it is filled, and filling it is where ENOSPC or
SIGBUS strikes. Pages written through a mapping show in no call: statfs sees them.</p>"#
    );
    let mut any = false;
    // A /dev/shm only measured in passing (a namespace the workload left at once) holds no
    // traced object and tells nothing.
    for (dev, device) in timeline.devices().filter(|(_, d)| d.peak_demand() > 0) {
        any = true;
        let label = device.label.as_deref().unwrap_or("unknown");
        let size = device
            .size()
            .map(|s| format!(", {}", human(s)))
            .unwrap_or_else(|| ", size not measured".to_owned());
        let measured = match device.peak_used() {
            0 => String::new(),
            used => format!(", statfs measured at most {} in use", human(used)),
        };
        let _ = writeln!(
            page,
            r#"<figure><figcaption>/dev/shm of {} (device {}{size}): the traced objects held at most {} in pages (their sizes reached {}){measured}</figcaption>"#,
            Html(label),
            dev_string(dev),
            human(device.peak_held()),
            human(device.peak_demand())
        );
        chart::usage(page, dev, device, timeline.marks(), scale);
        let _ = writeln!(page, "</figure>");
    }
    if !any {
        let _ = writeln!(
            page,
            r#"<p class="none">No /dev/shm object was traced and no /dev/shm was measured.</p>"#
        );
    }
    let _ = writeln!(page, "</section>");
}

fn processes(page: &mut String, timeline: &Timeline, scale: &Scale) {
    let _ = writeln!(
        page,
        r#"<section id="processes"><h2>Processes and their /dev/shm objects</h2>
<p class="legend"><span class="key span"></span>object held (from open or mmap to close, munmap or exit)
<span class="key held-at-end"></span>still held at the end
<span class="mark enospc">▼</span>{}
<span class="mark sigbus">▼</span>{}
<span class="mark error">▼</span>other failure
<span class="mark killed">✕</span>killed by a signal
<span class="mark exited">✕</span>non-zero exit</p>"#,
        MarkKind::Enospc.class().to_uppercase(),
        MarkKind::Sigbus.class().to_uppercase(),
    );
    if timeline.lanes().is_empty() {
        let _ = writeln!(
            page,
            r#"<p class="none">No process held a /dev/shm object, failed or died abnormally.</p>"#
        );
    } else {
        lanes::lanes(page, timeline, scale);
    }
    if timeline.lanes().len() > MAX_LANES {
        let _ = writeln!(
            page,
            r#"<p class="note">{} more processes are left out of the picture.</p>"#,
            timeline.lanes().len() - MAX_LANES
        );
    }
    let _ = writeln!(page, "</section>");
}
