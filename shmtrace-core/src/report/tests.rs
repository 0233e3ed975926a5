//! The pictures from kernel-shaped records run through the real pipeline: what is drawn, what
//! the Perfetto file holds, and that hostile names stay text.
use bytes::Bytes;
use serde_json::Value;
use shmtrace_common::{self as common, EventKind, Header, SyscallEvent, flags};

use super::{About, Pictures, chart, timeline::MarkKind};
use crate::{
    capacity::Capacity,
    clock::Clock,
    diagnose::{Diagnoser, Roles},
    event::{decode, names},
    model::World,
    output::{Format, Output, filter::Filter},
    pipeline::{Pipeline, Recorded},
    record::tests::{self as records, TempDir, bytes_of},
    report::Timeline,
};

const T0: u64 = 5_000_000_000;

fn about() -> About {
    About {
        description: "trace of python3 train.py on test-host".to_owned(),
        clock: Clock::with_offset(1_700_000_000_000_000_000, jiff::tz::TimeZone::UTC),
        tool_version: "0.0.0-test".to_owned(),
    }
}

/// A call on descriptor `fd` of inode `ino` (dev 26) that returned `ret` and left the object
/// `size` bytes long.
struct Call {
    syscall: common::Syscall,
    fd: i32,
    ino: u64,
    ret: i64,
    args: [u64; 6],
    size: i64,
}

fn call(ts_ns: u64, pid: u32, c: Call) -> Vec<u8> {
    bytes_of(&SyscallEvent {
        header: Header {
            flags: flags::FILE,
            ..records::header(EventKind::Syscall, ts_ns, pid, "python3")
        },
        syscall: c.syscall as u16,
        _pad: 0,
        fd: c.fd,
        ret: c.ret,
        args: c.args,
        file: common::FileRef {
            dev: 26,
            mode: 0o100600,
            ino: c.ino,
            size: c.size,
            blocks: (c.size as u64).div_ceil(512),
        },
    })
}

/// Runs records through a pipeline that writes both pictures; returns the page and the JSON.
fn pictures(kernel: &[Vec<u8>], capacity: Option<Capacity>, lost: u64) -> (String, Value) {
    let dir = TempDir::new("report");
    let html = dir.join("report.html");
    let perfetto = dir.join("trace.json");
    let output = Output::new(
        Box::new(std::io::sink()),
        Format::Json,
        about().clock,
        false,
    );
    let observer = Pictures::new(about(), Some(&html), Some(&perfetto), &[]).unwrap();
    let mut pipeline = Pipeline::new(World::new(), Diagnoser::new(0), output, Filter::default())
        .diagnoses_only()
        .with_observer(Box::new(observer));
    if let Some(sample) = capacity {
        pipeline.capacity(sample, None).unwrap();
    }
    let mut last = 0;
    for record in kernel {
        last = decode(record).unwrap().ts_ns;
        pipeline
            .kernel_record(&Bytes::from(record.clone()), &mut Recorded)
            .unwrap();
    }
    if lost > 0 {
        let mut counts = crate::event::LostCounts::default();
        counts.add(shmtrace_common::Loss::RingFull(EventKind::Syscall), lost);
        pipeline.lost(counts, last).unwrap();
    }
    pipeline.finish(1.0, last + 1_000_000).unwrap();
    let page = std::fs::read_to_string(&html).unwrap();
    let json = serde_json::from_str(&std::fs::read_to_string(&perfetto).unwrap()).unwrap();
    (page, json)
}

const MAPPED_AT: u64 = 0x7f00_0000_0000;

/// The record library's DataLoader, with the worker mapping its object before the SIGBUS
/// (whose address falls inside the mapping).
fn dataloader() -> Vec<Vec<u8>> {
    let mut kernel = records::dataloader_records(T0);
    let mmap = call(
        T0 + 4_500,
        4243,
        Call {
            syscall: common::Syscall::Mmap,
            fd: 11,
            ino: 77,
            ret: MAPPED_AT as i64,
            args: [0, 2 << 20, 3, 1, 11, 0],
            size: 2 << 20,
        },
    );
    kernel.insert(5, mmap);
    kernel
}

fn one_mib(ts_ns: u64) -> Capacity {
    Capacity {
        dev: 26,
        size: 1 << 20,
        used: 900 << 10,
        ts_ns,
        files: None,
    }
}

#[test]
fn draws_usage_lanes_failures_deaths_and_the_diagnosis() {
    let (page, _) = pictures(&dataloader(), Some(one_mib(T0)), 0);
    assert!(page.starts_with("<!DOCTYPE html>"));
    for needle in [
        r#"class="usage-demand""#,
        r#"class="usage-measured""#,
        r#"class="capacity""#,
        r#"<g class="lane" data-pid="4243" data-role="dataloaderworker">"#,
        r#"<g class="marker enospc" data-pid="4243">"#,
        r#"<g class="marker sigbus" data-pid="4243">"#,
        r#"<g class="marker killed" data-pid="4243">"#,
        r#"<g class="marker-line enospc">"#,
        "worker 0 · pid 4243",
        "fallocate of 96.0 MiB on /dev/shm/torch_4243_1 returned ENOSPC",
        "size 1.0 MiB",
        "torch_4243_1",
    ] {
        assert!(
            page.contains(needle),
            "{needle} missing from the page:\n{page}"
        );
    }
    // The trainer held nothing and did not die: no lane, but counted.
    assert!(!page.contains(r#"data-pid="4242""#));
    // Self-contained: nothing to fetch.
    for remote in ["http://", "https://", "<script", "<link", "@import", "url("] {
        assert!(!page.contains(remote), "{remote} in the page");
    }
}

#[test]
fn perfetto_has_processes_holds_marks_and_counters() {
    let (_, json) = pictures(&dataloader(), Some(one_mib(T0)), 0);
    let events = json["traceEvents"].as_array().unwrap();
    let of = |ph: &str| events.iter().filter(|e| e["ph"] == ph).collect::<Vec<_>>();
    let name = of("M")
        .into_iter()
        .find(|e| e["name"] == "process_name" && e["pid"] == 4243)
        .unwrap();
    assert_eq!(name["args"]["name"], "worker 0 · pid 4243 (pt_data_worker)");
    let begin = of("b");
    assert_eq!(begin.len(), 1);
    assert_eq!(begin[0]["name"], "/dev/shm/torch_4243_1");
    assert_eq!(of("e").len(), 1);
    assert_eq!(of("e")[0]["id"], begin[0]["id"]);
    // The hold ends when the worker dies, 3 µs after it began.
    assert_eq!(
        of("e")[0]["ts"].as_f64().unwrap() - begin[0]["ts"].as_f64().unwrap(),
        3.0
    );
    let instants: Vec<&str> = of("i").iter().map(|e| e["cat"].as_str().unwrap()).collect();
    for cat in ["enospc", "sigbus", "killed", "diagnosis"] {
        assert!(instants.contains(&cat), "{cat} not in {instants:?}");
    }
    let counters: Vec<&str> = of("C")
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for counter in ["held by traced objects", "in use (statfs)", "size"] {
        assert!(counters.contains(&counter), "{counter} not in {counters:?}");
    }
    assert!(
        of("C")
            .iter()
            .all(|e| e["pid"].as_u64().unwrap() >= 1_000_000_000)
    );
}

#[test]
fn hostile_names_stay_text() {
    let evil = r#"/dev/shm/<script>alert(1)</script>"onmouseover="x"#;
    let kernel = vec![
        records::rename(T0, 4243, "<img src=x>"),
        records::openat(T0 + 1_000, 4243, evil, 11, 77),
        records::fallocate_enospc(T0 + 2_000, 4243, 11, 77),
    ];
    let (page, json) = pictures(&kernel, None, 0);
    assert!(!page.contains("<script>"), "{page}");
    assert!(!page.contains("<img"), "{page}");
    assert!(!page.contains(r#""onmouseover"#), "{page}");
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;onmouseover=&quot;x"));
    assert!(page.contains("&lt;img src=x&gt;"));
    // JSON carries it as a string, intact.
    let events = json["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["name"] == evil));
}

#[test]
fn spans_follow_descriptors_mappings_forks_and_exits() {
    use common::Syscall::{Close, Ftruncate, Mmap, Munmap};
    let on = |syscall, ret, args| Call {
        syscall,
        fd: 5,
        ino: 90,
        ret,
        args,
        size: 8192,
    };
    let mut world = World::new();
    let mut timeline = Timeline::new();
    let kernel = [
        records::openat(T0, 4242, "/dev/shm/obj", 5, 90),
        call(T0 + 10, 4242, on(Ftruncate, 0, [5, 8192, 0, 0, 0, 0])),
        records::fork(T0 + 20, 4242, 4243),
        // The child maps it, closes its descriptor: it still holds the mapping.
        call(
            T0 + 30,
            4243,
            on(Mmap, MAPPED_AT as i64, [0, 8192, 3, 1, 5, 0]),
        ),
        call(T0 + 40, 4243, on(Close, 0, [5, 0, 0, 0, 0, 0])),
        // Unmapping lets go.
        call(T0 + 50, 4243, on(Munmap, 0, [MAPPED_AT, 8192, 0, 0, 0, 0])),
        records::exit(T0 + 60, 4242, libc::SIGKILL),
    ];
    for record in &kernel {
        let event = decode(record).unwrap();
        let note = world.apply(&event);
        timeline.event(&event, &note, "host", &world);
    }
    timeline.finish(&world, &Roles::compute(&world), 0, T0 + 100);
    let spans = timeline.spans();
    assert_eq!(spans.len(), 2, "{spans:?}");
    let parent = spans.iter().find(|s| s.pid == 4242).unwrap();
    let child = spans.iter().find(|s| s.pid == 4243).unwrap();
    assert_eq!((parent.start_ns, parent.end_ns), (T0, Some(T0 + 60)));
    assert_eq!((child.start_ns, child.end_ns), (T0 + 20, Some(T0 + 50)));
    assert_eq!(parent.bytes, 8192);
    assert_eq!(parent.name, "/dev/shm/obj");
    let marks = timeline.marks();
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].kind, MarkKind::Killed);
    assert_eq!(
        marks[0].short,
        format!("killed by {}", names::signal_name(libc::SIGKILL))
    );
    // Both processes get a lane: one held an object and died, the other held one.
    assert_eq!(timeline.lanes().len(), 2);
    let (start, end) = timeline.window();
    assert!(start <= T0 && end >= T0 + 60);
}

#[test]
fn axes_read_in_round_numbers() {
    let (top, ticks) = chart::byte_ticks(1 << 20);
    assert_eq!(top, 5 << 18);
    assert_eq!(ticks, (0..=5).map(|i| i << 18).collect::<Vec<u64>>());
    let scale = chart::Scale::new(0, (0, 3_772_000_000));
    let labels: Vec<String> = scale.ticks().into_iter().map(|(_, l)| l).collect();
    assert_eq!(labels.first().unwrap(), "0.0 s");
    assert_eq!(labels.last().unwrap(), "3.5 s");
    // A window later in the trace counts from the trace's start.
    let scale = chart::Scale::new(0, (1_364_000_000, 1_790_000_000));
    let ticks = scale.ticks();
    assert_eq!(ticks[0].1, "1.4 s");
    assert!(ticks.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(ticks.iter().all(|(x, _)| *x >= chart::LEFT));
}

#[test]
fn lost_events_are_said_on_the_page() {
    let (page, _) = pictures(&dataloader(), None, 1234);
    assert!(page.contains("1234 events were lost"), "{page}");
    let (page, _) = pictures(&dataloader(), None, 0);
    assert!(!page.contains("were lost"));
}

/// Issue 33: a chart scaled to the objects' sizes (384 MiB asked of a 64 MiB /dev/shm) drew the
/// limit as a thin line at the bottom, and three ENOSPC at one moment had three labels on top of
/// one another.
#[test]
fn the_chart_is_scaled_to_the_limit_and_what_was_held_and_its_labels_do_not_overlap() {
    use super::timeline::{Device, Mark};
    const MIB: u64 = 1 << 20;
    let device = Device {
        label: Some("container trainer".to_owned()),
        demand: vec![(T0, 0), (T0 + 10, 46 * MIB), (T0 + 20, 384 * MIB)],
        held: vec![(T0, 0), (T0 + 10, 46 * MIB)],
        samples: vec![Capacity {
            dev: 26,
            size: 64 * MIB,
            used: 50 * MIB,
            ts_ns: T0 + 20,
            files: None,
        }],
    };
    let marks: Vec<Mark> = (0..3)
        .map(|i| Mark {
            ts_ns: T0 + 20 + i,
            pid: 100 + i as u32,
            kind: MarkKind::Enospc,
            short: "ENOSPC".to_owned(),
            detail: "fallocate of 46.0 MiB returned ENOSPC".to_owned(),
            dev: Some(26),
        })
        .collect();
    let scale = chart::Scale::new(T0, (T0, T0 + 1_000_000_000));
    let mut svg = String::new();
    chart::usage(&mut svg, 26, &device, &marks, &scale);
    let top: u64 = svg
        .split("data-top=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        (64 * MIB..=128 * MIB).contains(&top),
        "the axis goes to {} MiB, not to the limit and what was held",
        top / MIB
    );
    assert!(svg.contains("sizes of the objects reach 384.0 MiB (cut at the top)"));
    assert_eq!(svg.matches(">ENOSPC ×3<").count(), 1, "{svg}");
    assert!(!svg.contains(">ENOSPC<"), "one label for the three: {svg}");
    assert_eq!(svg.matches("<line x1=").count(), 3, "a line per failure");
}

/// Semaphores are counted, not drawn, unless asked; a compiler's failed probe is no death.
#[test]
fn semaphores_and_uninvolved_exits_stay_out_of_the_picture() {
    let sem = [
        records::openat(T0, 4242, "/dev/shm/sem.mp-1", 5, 91),
        call(
            T0 + 5,
            4242,
            Call {
                syscall: common::Syscall::Close,
                fd: 5,
                ino: 91,
                ret: 0,
                args: [5, 0, 0, 0, 0, 0],
                size: 32,
            },
        ),
    ];
    // Python's ctypes.util.find_library runs gcc, which fails.
    let probe = [
        records::fork(T0 + 20, 4242, 4300),
        records::exec(T0 + 25, 4300, "/usr/bin/gcc", &["gcc"]),
        records::exit(T0 + 30, 4300, 1 << 8),
    ];
    let batch = records::openat(T0 + 40, 4242, "/dev/shm/torch_1", 6, 92);
    let run = |timeline: Timeline| {
        let mut timeline = timeline;
        let mut world = World::new();
        for record in sem.iter().chain(&probe).chain([&batch]) {
            let event = decode(record).unwrap();
            let note = world.apply(&event);
            timeline.event(&event, &note, "host", &world);
        }
        timeline.finish(&world, &Roles::compute(&world), 0, T0 + 100);
        timeline
    };
    let timeline = run(Timeline::new());
    let names: Vec<&str> = timeline.spans().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["/dev/shm/torch_1"]);
    assert_eq!(timeline.semaphore_holds(), 1);
    assert!(timeline.marks().is_empty(), "{:?}", timeline.marks());
    assert_eq!(timeline.lanes().len(), 1);
    let everything = run(Timeline::new().show_all());
    assert_eq!(everything.spans().len(), 2);
}
