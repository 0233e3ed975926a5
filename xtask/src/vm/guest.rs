//! One guest: what it runs (its `/init`), booting it under qemu, and reading what it reported.
//!
//! An x86-64 guest writes its results to its second serial port (`/dev/ttyS1`), which qemu
//! writes to a file; the first carries the kernel's console, kept beside it for when a guest
//! goes wrong. An arm64 guest (`virt` has one UART) writes them to its console, between the
//! same markers, after hushing the kernel's messages there.
use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::debian::Arch;

/// Marks the guest's own lines among the tests' output.
pub const MARK: &str = "shmtrace-vm:";

/// What `/init` runs, in order, after mounting what the tests need.
pub enum Step {
    /// A test binary with its arguments, under a name for the report.
    Test {
        name: String,
        binary: PathBuf,
        args: Vec<String>,
    },
    /// A command whose status and output are reported whole.
    Command { name: String, argv: Vec<String> },
}

/// The init script: mounts, then each step between markers, then power off.
pub fn init_script(arch: Arch, steps: &[Step], env: &[(&str, String)]) -> String {
    let mut script = String::from(
        "#!/bin/sh\n\
         # Written by `cargo xtask vm-*`: the guest's whole life.\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n\
         mount -t tracefs nodev /sys/kernel/tracing\n\
         mount -t bpf bpf /sys/fs/bpf\n\
         # cgroup v2 alone, as on most nodes: the container filter's test makes a cgroup there.\n\
         mount -t cgroup2 none /sys/fs/cgroup\n\
         mkdir -p /dev/shm /tmp /run\n\
         mount -t tmpfs -o size=64m tmpfs /dev/shm\n\
         # Not a tmpfs on /tmp: the programs copied in live at their host paths, and a checkout\n\
         # under /tmp (CI's) would be hidden. The initramfs is writable memory already.\n\
         mount -t tmpfs tmpfs /run\n\
         # Terminals: a test of Ctrl-C runs shmtrace on a pseudo-terminal.\n\
         mkdir -p /dev/pts\n\
         mount -t devpts -o ptmxmode=0666 devpts /dev/pts\n\
         ln -s /proc/self/fd /dev/fd\n\
         hostname shmtrace-vm\n\
         ip link set lo up 2>/dev/null\n",
    );
    if arch.results_on_console() {
        // Only emergencies from the kernel on the console from now on, so that its messages
        // do not break into the results' lines.
        script.push_str("dmesg -n 1\n");
    }
    let _ = writeln!(script, "exec 3>{}", arch.results_device());
    for (key, value) in env {
        let _ = writeln!(script, "export {key}={}", shell_quote(value));
    }
    let _ = writeln!(script, "echo \"{MARK} kernel $(uname -r)\" >&3");
    let _ = writeln!(script, "cd /tmp");
    for step in steps {
        let (name, argv) = match step {
            Step::Test { name, binary, args } => {
                let mut argv = vec![binary.display().to_string()];
                argv.extend(args.iter().cloned());
                (name, argv)
            }
            Step::Command { name, argv } => (name, argv.clone()),
        };
        let command: Vec<String> = argv.iter().map(|a| shell_quote(a)).collect();
        let _ = writeln!(script, "echo \"{MARK} begin {name}\" >&3");
        let _ = writeln!(script, "{} >&3 2>&3 </dev/null", command.join(" "));
        let _ = writeln!(script, "echo \"{MARK} end {name} $?\" >&3");
    }
    let _ = writeln!(script, "echo \"{MARK} done\" >&3");
    script.push_str("sync\npoweroff -f\n");
    script
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// One step's outcome, as the guest reported it.
pub struct StepResult {
    pub name: String,
    /// `None` when the guest never said the step ended (it hung, or the guest died).
    pub status: Option<i32>,
    pub output: String,
}

impl StepResult {
    /// Test names libtest reported as passed and as failed.
    pub fn tests(&self) -> (Vec<&str>, Vec<&str>) {
        let mut passed = Vec::new();
        let mut failed = Vec::new();
        for line in self.output.lines() {
            let Some(rest) = line.strip_prefix("test ") else {
                continue;
            };
            if let Some(name) = rest.strip_suffix(" ... ok") {
                passed.push(name);
            } else if let Some(name) = rest.strip_suffix(" ... FAILED") {
                failed.push(name);
            }
        }
        (passed, failed)
    }
}

pub struct Boot {
    pub release: Option<String>,
    pub steps: Vec<StepResult>,
    /// The guest reached the end of its script.
    pub finished: bool,
    pub seconds: f64,
    pub console: PathBuf,
}

/// Boots `vmlinuz` with `initrd` under TCG and waits, at most `timeout`, for it to power off.
pub fn boot(
    arch: Arch,
    vmlinuz: &Path,
    initrd: &Path,
    work: &Path,
    timeout: Duration,
) -> Result<Boot> {
    let console = work.join("console.log");
    let results = if arch.results_on_console() {
        console.clone()
    } else {
        work.join("results.log")
    };
    let _ = fs::remove_file(&results);
    let started = Instant::now();
    // KVM is there but nested KVM fails in the kernel's decompressor: software emulation,
    // with a thread per virtual CPU.
    let mut qemu = Command::new(arch.qemu());
    qemu.args(arch.machine_args())
        .args(["-smp", "2", "-m", "4096"])
        .args(["-display", "none", "-monitor", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!("console={} panic=-1 quiet", arch.console()))
        .arg("-serial")
        .arg(format!("file:{}", console.display()));
    if !arch.results_on_console() {
        qemu.arg("-serial")
            .arg(format!("file:{}", results.display()));
    }
    let mut child = qemu.stdin(Stdio::null()).spawn().with_context(|| {
        format!(
            "starting {} (apt-get install {})",
            arch.qemu(),
            arch.qemu_package()
        )
    })?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let seconds = started.elapsed().as_secs_f64();
    if let Some(status) = status
        && !status.success()
    {
        bail!(
            "qemu failed ({status}); the guest's console is in {}",
            console.display()
        );
    }
    let text = fs::read(&results).unwrap_or_default();
    let mut boot = parse(&String::from_utf8_lossy(&text));
    boot.seconds = seconds;
    boot.console = console;
    Ok(boot)
}

fn parse(text: &str) -> Boot {
    let mut boot = Boot {
        release: None,
        steps: Vec::new(),
        finished: false,
        seconds: 0.0,
        console: PathBuf::new(),
    };
    let mut current: Option<StepResult> = None;
    for line in text.lines() {
        // A serial line may carry a carriage return.
        let line = line.trim_end_matches('\r');
        let Some(rest) = line.strip_prefix(MARK).map(str::trim) else {
            if let Some(step) = current.as_mut() {
                step.output.push_str(line);
                step.output.push('\n');
            }
            continue;
        };
        if let Some(release) = rest.strip_prefix("kernel ") {
            boot.release = Some(release.to_owned());
        } else if let Some(name) = rest.strip_prefix("begin ") {
            boot.steps.extend(current.take());
            current = Some(StepResult {
                name: name.to_owned(),
                status: None,
                output: String::new(),
            });
        } else if let Some(end) = rest.strip_prefix("end ") {
            if let Some(mut step) = current.take() {
                step.status = end.rsplit(' ').next().and_then(|s| s.parse().ok());
                boot.steps.push(step);
            }
        } else if rest == "done" {
            boot.finished = true;
        }
    }
    boot.steps.extend(current.take());
    boot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guests_report_parses_into_steps() {
        let text = "shmtrace-vm: kernel 6.1.0-50-cloud-amd64\r\n\
                    shmtrace-vm: begin kernel_probes\n\
                    running 2 tests\n\
                    test exit_by_signal ... ok\n\
                    test sigbus ... FAILED\n\
                    shmtrace-vm: end kernel_probes 101\n\
                    shmtrace-vm: begin demo\n\
                    half\n";
        let boot = parse(text);
        assert_eq!(boot.release.as_deref(), Some("6.1.0-50-cloud-amd64"));
        assert!(!boot.finished);
        assert_eq!(boot.steps.len(), 2);
        assert_eq!(boot.steps[0].status, Some(101));
        assert_eq!(
            boot.steps[0].tests(),
            (vec!["exit_by_signal"], vec!["sigbus"])
        );
        assert_eq!(boot.steps[1].status, None, "a step that never ended");
        assert_eq!(boot.steps[1].output, "half\n");
    }
}
