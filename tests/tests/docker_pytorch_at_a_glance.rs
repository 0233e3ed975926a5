//! What a user reads (issue 33), on the scenario PyTorch users meet: a trainer in a Docker
//! container with Docker's default 64 MiB of /dev/shm, a DataLoader of 4 workers and 46 MiB
//! batches (real PyTorch from PyPI), and a 10 MiB file left in /dev/shm before it starts.
//!
//! One real run, recorded; the terminal text (`show`, which a live trace prints the same), the
//! HTML report (rendered by headless Chromium) and `report --size` are each read as a user
//! would: no semaphore traffic, one diagnosis block for the workers, no peak above the
//! /dev/shm's size, the arithmetic of the failure, and a budget that cannot pass.
use std::collections::HashSet;

use shmtrace_tests::{
    docker::{Container, require_docker, wait_for},
    pytorch,
    recording::{Recorder, rendered_dom, screenshot},
    require_root, serial, shmtrace,
    sizing::{self, MIB},
};

const SHM: u64 = 64 * MIB;
const WORKERS: usize = 4;

#[test]
fn a_dataloader_out_of_docker_s_64m_reads_at_a_glance() {
    require_root();
    require_docker();
    let _serial = serial();
    let venv = pytorch::venv().display().to_string();
    let mut flags = vec![format!("--shm-size={SHM}b")];
    flags.extend(sizing::workloads_mount());
    flags.extend(pytorch::docker_mounts());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let script = format!(
        "dd if=/dev/zero of=/dev/shm/leftover bs=1M count=10 2>/dev/null; touch /work/ready; \
         while [ ! -e /work/go ]; do sleep 0.05; done; cd /w && {venv}/bin/python -B \
         torch_dataloader.py --workers {WORKERS} --batch-bytes 46M --prefetch 2 --batches 12 \
         --step 0.05 --timeout 10"
    );
    let container = Container::run("glance", &flags, &script);
    wait_for(&container.work.join("ready"));
    let dir = shmtrace_tests::tempdir();
    let file = dir.join("dataloader.shmtrace");
    let recorder = Recorder::start(
        &[
            "-o",
            file.to_str().unwrap(),
            "--color",
            "never",
            "--container",
            &container.name,
        ],
        &dir.join("record.txt"),
        "shmtrace: tracing",
    );
    container.signal("go");
    let status = container.wait();
    assert_ne!(
        status, 0,
        "4 workers of 46 MiB batches must not fit in 64 MiB"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (_, stderr) = recorder.interrupt();

    // Attaching says what the container's /dev/shm holds already, and the end says it again.
    assert!(
        stderr.contains(&format!(
            "shmtrace: container {}: /dev/shm 64.0 MiB, 10.0 MiB used",
            container.name
        )) && stderr.contains("1 file in it: leftover (10.0 MiB)"),
        "{stderr}"
    );
    let recorded = std::fs::read_to_string(dir.join("record.txt")).unwrap();
    assert!(
        recorded.contains(&format!(
            "shmtrace: container {} at the end:",
            container.name
        )),
        "{recorded}"
    );

    terminal(&file);
    html(&file, &dir);
    size(&file);
    let _ = std::fs::remove_dir_all(dir);
}

/// The text a live trace prints, as `show` replays it.
fn terminal(file: &std::path::Path) {
    let output = shmtrace()
        .args(["show", "--color", "never"])
        .arg(file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{text}");
    // No semaphore traffic, and none of the processes that had nothing to do with /dev/shm;
    // one summary line each.
    let event_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.as_bytes().get(2) == Some(&b':'))
        .collect();
    assert!(
        !event_lines.iter().any(|l| l.contains("/dev/shm/sem.")),
        "{text}"
    );
    assert!(!event_lines.iter().any(|l| l.contains(" gcc ")), "{text}");
    assert!(
        text.contains("POSIX semaphores (/dev/shm/sem.*, a page each) of "),
        "{text}"
    );
    assert!(
        text.contains("that touched no /dev/shm object, failed nothing and started none"),
        "{text}"
    );
    // One block for the workers that failed together, its headline explaining their status 0.
    let blocks: Vec<&str> = text.split("━━━ shmtrace diagnosis ━━━\n").skip(1).collect();
    let workers: Vec<&&str> = blocks
        .iter()
        .filter(|b| b.contains("DataLoader worker"))
        .filter(|b| !b.contains("PyTorch trainer, exited"))
        .collect();
    assert_eq!(workers.len(), 1, "one block for the workers:\n{text}");
    let block = workers[0];
    assert!(
        block.starts_with("DataLoader workers ") && block.contains("each failed to fallocate"),
        "{block}"
    );
    assert!(block.contains("status 0  not a success"), "{block}");
    // The failure's arithmetic: what the call asked, what was free of how much, who else asked.
    let arithmetic = block
        .lines()
        .find(|l| l.trim_start().starts_with("/dev/shm"))
        .unwrap_or_else(|| panic!("no /dev/shm line: {block}"));
    assert!(
        arithmetic.contains("fallocate asked 46.0 MiB; ")
            && arithmetic.contains(" free of 64.0 MiB"),
        "{arithmetic}"
    );
    // Which failed first: one answer.
    let first = block
        .lines()
        .find_map(|l| l.split("failed    pid ").nth(1))
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no first failure: {block}"));
    assert!(
        text.contains(&format!("its DataLoader worker pid {first} failed first")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "see the diagnosis of pid {first}, which failed first"
        )),
        "{text}"
    );
    // No peak above the size in the closing table.
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("PAGES HELD"))
        .skip(1)
        .take_while(|l| l.starts_with("  ") && !l.starts_with("  (") && !l.starts_with("  *"))
        .collect();
    assert!(!table.is_empty(), "{text}");
    for row in table {
        let held = row
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .find_map(|w| bytes(w[0], w[1]))
            .unwrap_or_else(|| panic!("no size in {row}"));
        assert!(held <= SHM, "pages held above the /dev/shm's size: {row}");
    }
}

/// `12.5 MiB` as bytes (rounded), if these two words are a size.
fn bytes(number: &str, unit: &str) -> Option<u64> {
    let number: f64 = number.trim_end_matches('*').parse().ok()?;
    let unit = match unit.trim_end_matches('*') {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => MIB as f64,
        "GiB" => 1024.0 * MIB as f64,
        _ => return None,
    };
    Some((number * unit) as u64)
}

/// The HTML report, rendered: no semaphore lane, one block for the workers, a chart scaled to
/// the limit, no peak above the size.
fn html(file: &std::path::Path, dir: &std::path::Path) {
    let page = dir.join("report.html");
    let output = shmtrace()
        .arg("report")
        .arg(file)
        .arg("--html")
        .arg(&page)
        .args(["-o", "/dev/null"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let dom = rendered_dom(&page);
    assert!(
        !dom.contains(r#"data-object="/dev/shm/sem."#),
        "a semaphore drawn"
    );
    assert!(
        dom.contains("holds of POSIX semaphores"),
        "semaphores not counted"
    );
    // The chart before the diagnoses.
    let chart = dom.find(r#"<section id="usage">"#).expect("a chart");
    let diagnosis = dom.find(r#"<section id="diagnosis">"#).expect("diagnoses");
    assert!(chart < diagnosis, "the chart comes first");
    // Its byte axis goes a little above 64 MiB, not to the hundreds of MiB the sizes reached.
    let top: u64 = dom
        .split("data-top=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .expect("the chart's top");
    assert!((SHM..=2 * SHM).contains(&top), "axis top {top}");
    // One block names the workers; the one open first is theirs.
    let blocks: Vec<&str> = dom.split(r#"<details class="diagnosis"#).skip(1).collect();
    let pids_of = |block: &str| -> HashSet<String> {
        block
            .split("data-pid=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .map(|pids| pids.split(' ').map(str::to_owned).collect())
            .unwrap_or_default()
    };
    assert!(
        blocks[0].contains(" open") && pids_of(blocks[0]).len() >= 2,
        "the first block, open, is of the workers together: {}",
        blocks[0]
    );
    // The caption's pages held: within the size.
    let caption = dom
        .split("the traced objects held at most ")
        .nth(1)
        .expect("a caption");
    let words: Vec<&str> = caption.split_whitespace().collect();
    let held = bytes(words[0], words[1]).expect("a size");
    assert!(held <= SHM, "{caption}");
    let png = std::env::temp_dir().join("shmtrace-glance-report.png");
    screenshot(&page, &png, 1400, 1600);
    eprintln!("screenshot of the report: {}", png.display());
}

/// `report --size`: the rows under the peak add up to it, the failures say the peak is only
/// what fitted, and a budget cannot pass a run that failed for lack of /dev/shm.
fn size(file: &std::path::Path) {
    let output = shmtrace()
        .args(["report", "--size", "--budget", "1g"])
        .arg(file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(5), "{text}");
    assert!(
        text.contains("budget    NOT MEASURED: the workload ran out of /dev/shm"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "failed    {WORKERS} processes failed for lack of /dev/shm while it was measured"
        )),
        "{text}"
    );
    assert!(!text.contains("shm_full"), "internal words: {text}");
    let peak_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("peak "))
        .expect("a peak");
    let words: Vec<&str> = peak_line.split_whitespace().collect();
    let peak = bytes(words[1], words[2]).expect("the peak");
    assert!(peak <= SHM, "{peak_line}");
    let rows: u64 = text
        .lines()
        .filter(|l| l.trim_start().starts_with("made by") || l.trim_start().starts_with("unseen"))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words
                .windows(2)
                .find_map(|w| bytes(w[0], w[1]))
                .unwrap_or_else(|| panic!("no size in {l}"))
        })
        .sum();
    // Each row is rounded to a tenth of its unit.
    assert!(
        rows.abs_diff(peak) <= MIB / 5,
        "the rows add up to {rows}, the peak is {peak}:\n{text}"
    );
    // Semaphores live at the peak are one entry, not a line each.
    assert!(
        !text
            .lines()
            .any(|l| l.contains("/dev/shm/sem.") && !l.contains("POSIX semaphores")),
        "{text}"
    );
}
