//! Input shmtrace did not make (issue 11): a rotated set with a file missing or repeated, hostile
//! names in a trace file, a file cut inside a record or with a hostile header, every bad argument
//! of `show`, traces read from pipes, and a `--pid` that is a zombie. Each gets a clear answer,
//! keeps what is readable, and nothing is printed raw. Real probes, root.
use std::{
    io::{BufRead, BufReader},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use shmtrace_tests::{
    command::ShmtraceCommand,
    hardening::{
        FRAME_HEAD_LEN, PREAMBLE_LEN, cbor_value_of, frame_starts, header_cbor, record, run,
        shm_churn, small_trace, text, with_header, with_header_cbor,
    },
    recording::{Replay, replay, wait_for},
    require_root, serial, shmtrace, tempdir,
};

#[test]
fn a_missing_or_repeated_rotated_file_is_reported() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let base = dir.join("rot.shmtrace");
    record(&base, &["--max-size", "64K"], &shm_churn(1500));
    let numbered = |n: u32| dir.join(format!("rot.{n:06}.shmtrace"));
    assert!(
        numbered(3).exists(),
        "the recording made fewer than 4 files"
    );
    std::fs::remove_file(numbered(1)).unwrap();
    let show = run(&["show", base.to_str().unwrap()]);
    let shown = text(&show.stdout) + &text(&show.stderr);
    assert!(
        shown.contains("1 file is missing between file 0 and file 2"),
        "{shown}"
    );
    // A second copy of file 2, numbered as if it came later.
    let mut last = 3;
    while numbered(last + 1).exists() {
        last += 1;
    }
    std::fs::copy(numbered(2), numbered(last + 1)).unwrap();
    let show = run(&["show", base.to_str().unwrap()]);
    let shown = text(&show.stdout) + &text(&show.stderr);
    assert!(shown.contains("repeats file 2"), "{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn hostile_names_in_a_trace_file_are_escaped_in_text() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let file = dir.join("hostile.shmtrace");
    let hostname = "evil\x1b]0;TITLE\x07\x1b[2J\x1b[31mX";
    let mut unshare = Command::new("unshare");
    unshare
        // Through /proc: the kernel takes any bytes, hostname(1) would refuse them.
        .args([
            "--uts",
            "sh",
            "-c",
            r#"printf '%s' "$0" > /proc/sys/kernel/hostname && exec "$@""#,
            hostname,
        ])
        .arg(shmtrace_tests::shmtrace_bin());
    // `exec` keeps the pid: the leak check watches shmtrace itself.
    let output = ShmtraceCommand::from_command(unshare)
        .arg("record")
        .arg("-o")
        .arg(&file)
        .args(["--", "sh", "-c", &shm_churn(1)])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    for args in [vec!["report"], vec!["show"]] {
        let mut all = args.clone();
        all.push(file.to_str().unwrap());
        let output = run(&all);
        assert!(output.status.success(), "{}", text(&output.stderr));
        let printed = [output.stdout.as_slice(), output.stderr.as_slice()].concat();
        assert!(
            !printed.iter().any(|b| *b == 0x1b || *b == 0x07),
            "{args:?} printed raw control bytes: {:?}",
            text(&printed)
        );
        assert!(
            text(&printed).contains("evil\\x1b]0;TITLE"),
            "{}",
            text(&printed)
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn show_rejects_bad_times_and_event_names_and_reads_pipes() {
    let _guard = serial();
    require_root();
    let (dir, file) = small_trace();
    let file_arg = file.to_str().unwrap();
    // Each refused with the reason that applies to it.
    for (bad, reason) in [
        ("1e30", "too far after the start of the trace"),
        ("inf", "too far after the start of the trace"),
        ("NaN", "is a number of seconds, 0 or more"),
        ("-1", "is a number of seconds, 0 or more"),
    ] {
        for flag in ["--since", "--until"] {
            // `--since=-1`: as two words, clap would take -1 for a flag and never ask shmtrace.
            let output = run(&["show", file_arg, &format!("{flag}={bad}")]);
            let stderr = text(&output.stderr);
            assert!(!output.status.success(), "{flag} {bad} was accepted");
            assert!(
                stderr.contains(&format!("{bad}: ")) && stderr.contains(reason),
                "{flag} {bad}: {stderr}"
            );
        }
    }
    let output = run(&["show", file_arg, "--event", "bogus"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("bogus") && stderr.contains("fallocate"),
        "{stderr}"
    );

    let output = run(&["show", dir.to_str().unwrap()]);
    assert!(
        text(&output.stderr).contains("not a trace file (a directory)"),
        "{}",
        text(&output.stderr)
    );

    let expected = run(&["show", file_arg, "--json"]);
    assert!(expected.status.success());
    let events = |output: &Output| {
        text(&output.stdout)
            .lines()
            .filter(|l| l.contains("\"openat\""))
            .count()
    };
    assert!(events(&expected) > 0);
    for source in ["-", "/dev/stdin"] {
        let output = shmtrace()
            .args(["show", source, "--json"])
            .stdin(Stdio::from(std::fs::File::open(&file).unwrap()))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{source}: {}",
            text(&output.stderr)
        );
        assert_eq!(events(&output), events(&expected), "{source}");
    }
    // Through a pipe and a FIFO, which cannot seek.
    let mut cat = Command::new("cat")
        .arg(&file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let output = shmtrace()
        .args(["show", "-", "--json"])
        .stdin(Stdio::from(cat.stdout.take().unwrap()))
        .output()
        .unwrap();
    cat.wait().unwrap();
    assert_eq!(
        events(&output),
        events(&expected),
        "{}",
        text(&output.stderr)
    );
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let writer = {
        let (fifo, file) = (fifo.clone(), file.clone());
        std::thread::spawn(move || std::fs::write(&fifo, std::fs::read(&file).unwrap()))
    };
    let output = run(&["show", fifo.to_str().unwrap(), "--json"]);
    writer.join().unwrap().unwrap();
    assert_eq!(
        events(&output),
        events(&expected),
        "{}",
        text(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_zombie_pid_is_refused_at_once() {
    let _guard = serial();
    require_root();
    // `sleep 0.3 &` exits after the shell that started it became `sleep 30`, which never
    // reaps it.
    let mut parent = Command::new("bash")
        .args(["-c", "sleep 0.3 & echo $!; exec sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(parent.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let zombie = line.trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{zombie}/stat"))
        .unwrap_or_default()
        .contains(") Z")
    {
        assert!(
            Instant::now() < deadline,
            "pid {zombie} never became a zombie"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = Instant::now();
    let mut tracer = shmtrace()
        .args(["--pid", &zombie])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(&mut tracer, Duration::from_secs(20));
    tracer.assert_released();
    let _ = parent.kill();
    let _ = parent.wait();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut tracer.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("zombie"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_damaged_trace_keeps_what_is_readable_and_a_hostile_header_is_named() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let file = dir.join("whole.shmtrace");
    record(&file, &[], &shm_churn(40));
    let whole = std::fs::read(&file).unwrap();
    let opened = |replayed: &Replay| -> Vec<String> {
        replayed
            .of("openat")
            .iter()
            .map(|r| r["path"].to_string())
            .collect()
    };
    let all = opened(replay("show", &file, &[]).assert_ok());

    // Cut inside a record past the middle, as a recorder killed mid-write leaves it.
    let starts = frame_starts(&whole);
    let torn = starts[starts.len() / 2];
    let cut = dir.join("cut.shmtrace");
    let cut_at = torn + FRAME_HEAD_LEN + 7;
    std::fs::write(&cut, &whole[..cut_at]).unwrap();
    for subcommand in ["show", "report"] {
        let replayed = replay(subcommand, &cut, &[]);
        replayed.assert_ok();
        let said = format!(
            "at byte offset {torn}: the file ends inside the record ({} of ",
            cut_at - torn
        );
        assert!(
            replayed.stderr().contains(&said),
            "{subcommand}: {}",
            replayed.stderr()
        );
        if subcommand == "show" {
            let kept = opened(&replayed);
            assert!(
                !kept.is_empty() && kept.len() < all.len(),
                "{} of {} opens kept",
                kept.len(),
                all.len()
            );
            assert_eq!(kept, all[..kept.len()], "the records before the tear");
        }
    }

    // Headers behind a good checksum: hostile, not damaged.
    let layout = with_header(&whole, |header| {
        let at = cbor_value_of(header, "record_layout");
        assert_eq!(header[at], 0x1b, "the layout hash is an 8-byte integer");
        header[at + 1] ^= 0x55;
    });
    let found = {
        let at = PREAMBLE_LEN + cbor_value_of(&layout[PREAMBLE_LEN..], "record_layout") + 1;
        u64::from_be_bytes(layout[at..at + 8].try_into().unwrap())
    };
    let wrong_type = with_header(&whole, |header| {
        let at = cbor_value_of(header, "sequence");
        // An empty text where the sequence number should be.
        header[at] = 0x60;
    });
    let garbage = with_header(&whole, |header| header.fill(0xff));
    let mut bad_checksum = whole.clone();
    bad_checksum[PREAMBLE_LEN + 3] ^= 1;
    for (name, bytes, said) in [
        (
            "layout",
            layout,
            format!("laid out differently (layout {found:016x}"),
        ),
        (
            "wrong-type",
            wrong_type,
            "at byte offset 20: the header could not be decoded".to_owned(),
        ),
        (
            "garbage",
            garbage,
            "at byte offset 20: the header could not be decoded".to_owned(),
        ),
        (
            "bad-checksum",
            bad_checksum,
            "the header is corrupt (its checksum is".to_owned(),
        ),
    ] {
        let path = dir.join(format!("{name}.shmtrace"));
        std::fs::write(&path, bytes).unwrap();
        for subcommand in ["show", "report"] {
            let output = run(&[subcommand, path.to_str().unwrap()]);
            let stderr = text(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(1),
                "{name} {subcommand}: {stderr}"
            );
            assert!(stderr.contains(&said), "{name} {subcommand}: {stderr}");
            assert!(
                stderr.contains(path.to_str().unwrap()),
                "{name} {subcommand} does not name the file: {stderr}"
            );
            assert!(
                output.stdout.is_empty(),
                "{name} {subcommand} printed records: {}",
                text(&output.stdout)
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 25, item 12: a trace file whose header does not decode was answered with Rust's debug
/// text (`Io(Error { kind: UnexpectedEof, ... })`). Every such file gets a sentence that says
/// what is wrong and what to do, through the real binary.
#[test]
fn undecodable_headers_are_named_in_words() {
    let _guard = serial();
    require_root();
    let (dir, file) = small_trace();
    let whole = std::fs::read(&file).unwrap();
    let cbor = header_cbor(&whole).to_vec();
    let cases: [(&str, Vec<u8>, &str); 6] = [
        (
            "cut-in-preamble",
            whole[..10].to_vec(),
            "the file ends inside its header (after 10 bytes, of the 20",
        ),
        (
            "cut-in-header",
            whole[..PREAMBLE_LEN + 9].to_vec(),
            "the file ends inside its header (after 29 bytes",
        ),
        // A header whose length and checksum agree with a CBOR cut short, or with none.
        (
            "short-cbor",
            with_header_cbor(&whole, &cbor[..cbor.len() / 2]),
            "the header could not be decoded: the header ends before its last field",
        ),
        (
            "no-cbor",
            with_header_cbor(&whole, &[]),
            "the header could not be decoded: the header ends before its last field",
        ),
        (
            "not-a-map",
            with_header_cbor(&whole, &[0x01]),
            "the header could not be decoded: the header holds something other than what shmtrace \
             writes",
        ),
        (
            "break",
            with_header_cbor(&whole, &[0x1c; 16]),
            "the header could not be decoded: the header is not valid CBOR at its byte 0",
        ),
    ];
    for (name, bytes, said) in cases {
        let path = dir.join(format!("{name}.shmtrace"));
        std::fs::write(&path, bytes).unwrap();
        let output = run(&["report", path.to_str().unwrap()]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains(said), "{name}: {stderr}");
        for debug in [
            "Error {",
            "kind:",
            "Io(",
            "Semantic(",
            "Syntax(",
            "UnexpectedEof",
        ] {
            assert!(
                !stderr.contains(debug),
                "{name}: debug text {debug:?}: {stderr}"
            );
        }
        // What to do.
        assert!(
            stderr.contains("record again") || stderr.contains("copy it again"),
            "{name}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_rotated_set_whose_files_go_back_in_time_is_reported() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let base = dir.join("rot.shmtrace");
    record(&base, &["--max-size", "64K"], &shm_churn(1500));
    let numbered = |n: u32| dir.join(format!("rot.{n:06}.shmtrace"));
    assert!(
        numbered(3).exists(),
        "the recording made fewer than 4 files"
    );
    let as_recorded = run(&["report", base.to_str().unwrap()]);
    let said = text(&as_recorded.stdout) + &text(&as_recorded.stderr);
    assert!(!said.contains("back in time"), "{said}");
    // Files 1 and 3 trade places, each header's number made to match its new name (and its
    // checksum right again): every number is in order, and time is not.
    let renumbered = |from: u32, to: u8| {
        with_header(&std::fs::read(numbered(from)).unwrap(), |header| {
            let at = cbor_value_of(header, "sequence");
            assert_eq!(header[at], from as u8, "a small CBOR integer");
            header[at] = to;
        })
    };
    let (one, three) = (renumbered(1, 3), renumbered(3, 1));
    std::fs::write(numbered(1), three).unwrap();
    std::fs::write(numbered(3), one).unwrap();
    let report = run(&["report", base.to_str().unwrap()]);
    let said = text(&report.stdout) + &text(&report.stderr);
    println!(
        "{}",
        said.lines()
            .filter(|l| l.contains("back in time"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Both files after the first swapped one start before the end of the file before it: file
    // 2 (the original) before the end of the original file 3, and the original file 1 before
    // the end of file 2. Each gap spans two files' worth of the run (0.2 to 0.4 s here), well
    // past the 50 ms that records of different CPUs may be apart.
    let file = |n: u32| numbered(n).display().to_string();
    let warned = |n: u32| {
        said.contains(&format!("{} starts", file(n)))
            && said.contains(&format!("before the end of {}", file(n - 1)))
    };
    assert!(
        said.contains("go back in time") && warned(2) && warned(3),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
