//! What a benchmark run says about the machine it ran on: CPU, kernel, tools, load.
use std::{collections::BTreeMap, fs};

use super::{NICE, variants::Setup};

pub(super) fn machine_description(setup: &Setup) -> String {
    let read = |path: &str| {
        fs::read_to_string(path)
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let first_line = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .map(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.lines().next().unwrap_or("").trim().to_owned()
            })
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| format!("{program}: not found"))
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "Machine: {cores} cores ({cpu}), Linux {}, Debian {}. Load average at the start: {}. \
         Benchmark processes run at nice {NICE}.\n\
         Tools: {}; {}; {}.",
        read("/proc/sys/kernel/osrelease"),
        read("/etc/debian_version"),
        load_average(),
        first_line(&setup.shmtrace.to_string_lossy(), &["--version"]),
        first_line("strace", &["-V"]),
        first_line("perf", &["version"]),
    )
}

/// `123 (cmd args), 456 (...)`, each command cut to 60 characters.
pub(super) fn describe(processes: &BTreeMap<u32, String>) -> String {
    const WIDTH: usize = 60;
    processes
        .iter()
        .map(|(pid, cmd)| {
            let mut short: String = cmd.chars().take(WIDTH).collect();
            if cmd.chars().count() > WIDTH {
                short.push('…');
            }
            format!("{pid} ({short})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
