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
        "Run started {}.\n\
         Machine: {cores} cores ({cpu}), Linux {}, Debian {}. Load average at the start: {}. \
         Benchmark processes run at nice {NICE}.\n\
         Tools: {}; {}; {}.",
        utc_now(),
        read("/proc/sys/kernel/osrelease"),
        read("/etc/debian_version"),
        load_average(),
        first_line(&setup.shmtrace.to_string_lossy(), &["--version"]),
        first_line("strace", &["-V"]),
        first_line("perf", &["version"]),
    )
}

/// Now, as `2026-12-03 11:53 UTC`: a saved run says when it ran.
fn utc_now() -> String {
    // SAFETY: all zeroes is a valid `tm` (integers, and a null zone name); time(NULL) has no
    // preconditions; gmtime_r writes only into `tm`, which is ours.
    let (converted, tm) = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        let now = libc::time(std::ptr::null_mut());
        (!libc::gmtime_r(&now, &mut tm).is_null(), tm)
    };
    if !converted {
        return "at a time the clock could not give".into();
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min
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

#[cfg(test)]
mod tests {
    #[test]
    fn now_reads_as_a_utc_date_and_time() {
        let now = super::utc_now();
        let (date, time) = now
            .strip_suffix(" UTC")
            .and_then(|t| t.split_once(' '))
            .unwrap_or_else(|| panic!("{now}"));
        let parts: Vec<u32> = date.split('-').map(|p| p.parse().unwrap()).collect();
        assert!(parts[0] >= 2024 && (1..=12).contains(&parts[1]) && (1..=31).contains(&parts[2]));
        assert_eq!(time.len(), 5, "{now}");
    }
}
