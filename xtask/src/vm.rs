//! The kernel matrix: shmtrace on Debian's own kernels, booted under qemu.
//!
//! - `cargo xtask vm-load`: every program loaded and attached on each kernel, in seconds a
//!   kernel (`shmtrace --backend ebpf -- true` in the guest), so a probe change meets the old
//!   verifiers before it lands; a kernel below the minimum must refuse in a sentence.
//! - `cargo xtask vm-test`: the `kernel_*` end-to-end tests inside each guest, the real binary
//!   against the real probes on that kernel, reported per kernel.
//!
//! Kernels come from Debian's archive with apt (`vm/kernels.rs`, through `debian/apt.rs`),
//! x86-64's and arm64's; the guest is an initramfs holding the programs at their host paths
//! (`vm/initramfs.rs`), built for the guest's architecture (`debian/arch.rs`; an arm64 guest's
//! tools come from Debian's arm64 packages, `vm/userland.rs`), whose `/init` runs each step
//! and reports on a serial port (`vm/guest.rs`). The release artifacts come from `dist`.
mod guest;
mod initramfs;
mod kernels;
mod userland;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use guest::Step;
use initramfs::{Initramfs, Libraries};
use kernels::{Ci, Expect, Kernel};

use crate::{
    cargo,
    debian::{Arch, cache_dir},
    root,
};

/// The `kernel_*` suite a guest runs unless told otherwise: every probe (`kernel_probes`, and
/// host-wide deaths' records), the
/// CLI and the demo, signals, recordings, and the diagnoses of the PyTorch-like workloads
/// (`kernel_diagnosis`, with Debian's Python copied in). The tests that need a container
/// runtime or Prometheus stay on the host.
pub const GUEST_SUITE: &[&str] = &[
    "kernel_probes",
    "kernel_host_wide_deaths",
    "kernel_cli",
    "kernel_signals",
    "kernel_recording",
    "kernel_diagnosis",
];

/// The guest suite's binary that needs Python.
const PYTHON_SUITE: &str = "kernel_diagnosis";

/// Debian's Python, which the workload scripts run with (`tests/src/workload.rs`), and the
/// parts of its library they can reach.
fn add_python(image: &mut Initramfs) -> Result<()> {
    let python = Path::new("/usr/bin/python3.11");
    image
        .program(python)
        .context("the workloads run with Debian's Python: apt-get install python3")?;
    image.symlink("/usr/bin/python3", "python3.11");
    image.tree(
        Path::new("/usr/lib/python3.11"),
        &[
            "__pycache__",
            "test",
            "idlelib",
            "tkinter",
            "lib2to3",
            "ensurepip",
            "site-packages",
            "dist-packages",
        ],
    )?;
    image.tree(&root().join("tests/workloads"), &["__pycache__"])
}

/// Test binaries, each with libtest's filters (a test runs if its name contains any).
type Selection = &'static [(&'static str, &'static [&'static str])];

/// What `--ci` runs on a kernel of [`Ci::Smoke`]: a user's first two tries.
const SMOKE: Selection = &[(
    "kernel_cli",
    &[
        "the_demo_explains_both_failures",
        "dd_filling_a_64_mib_shm_shows_the_failed_write",
    ],
)];

/// What `--ci` runs on a kernel of [`Ci::Probes`]: the smoke test, and a test of each probe:
/// open and size (`openat`, `fallocate`, `ftruncate`, `write`), map and unmap (`mmap`,
/// `munmap`, `memfd_create`, `openat2`), unlink and close, System V, SIGBUS, exits (of a
/// signal, and judged deaths), fork, `statfs`, and the container filter.
const PROBES: Selection = &[
    SMOKE[0],
    (
        "kernel_probes",
        &[
            "fallocate_enospc_on_a_full_tmpfs",
            "write_enospc_of_a_semaphore",
            "openat2_memfd_and_partial_munmap",
            "system_v_failures_and_success",
            "sigbus_address_maps_back_to_its_file",
            "exit_by_signal",
            "exits_are_judged_deaths",
            "follows_forks_to_grandchildren",
            "statfs_of_dev_shm_shows_the_free_space_seen",
            "the_container_filter_follows",
        ],
    ),
];

/// What `--ci` runs on a kernel of [`Ci::ProbeSuite`]: the smoke test, and every test of
/// `kernel_probes` and of `kernel_host_wide_deaths` (the exit probe's records host-wide).
const PROBE_SUITE: Selection = &[
    SMOKE[0],
    ("kernel_probes", &[]),
    ("kernel_host_wide_deaths", &[]),
];

/// The tests `--ci` picks on a kernel, if it runs a selection rather than whole binaries.
fn ci_selection(ci: Ci) -> Option<Selection> {
    match ci {
        Ci::Smoke => Some(SMOKE),
        Ci::Probes => Some(PROBES),
        Ci::ProbeSuite => Some(PROBE_SUITE),
        Ci::Full => None,
    }
}

#[derive(clap::Args)]
pub struct VmArgs {
    /// Only these kernels of the matrix (comma-separated; default: all of them).
    #[arg(long, value_delimiter = ',')]
    kernel: Vec<String>,
    /// `vm-test`: what `.ci/run` runs on every submission: every probe's tests on the main
    /// build of each line, a test of each probe on arm64's newer line, the demo and a `dd` on
    /// the other builds (`Kernel::ci`).
    #[arg(long)]
    ci: bool,
    /// `vm-test --ci`: what `.ci/run --full` runs instead: the whole guest suite on the main
    /// builds (`Kernel::full`).
    #[arg(long, requires = "ci")]
    full: bool,
    /// `vm-test`: these test binaries (comma-separated; default: the guest suite).
    #[arg(long, value_delimiter = ',')]
    tests: Vec<String>,
    /// `vm-test`: only tests whose names contain this (libtest's filter).
    #[arg(long)]
    filter: Option<String>,
    /// Run the release binaries `cargo xtask dist` wrote (target/dist/) in the guests instead
    /// of a debug build, and in arm64 guests the demo from the arm64 image's root file system
    /// too: the artifacts users install, on every kernel.
    #[arg(long)]
    dist: bool,
    /// Minutes a guest may run before it counts as hung.
    #[arg(long, default_value_t = 40)]
    timeout_minutes: u64,
}

/// util-linux's own, for the flags the tests give them; they come before busybox on PATH.
const TOOLS: [&str; 6] = [
    "/usr/bin/bash",
    "/usr/bin/unshare",
    "/usr/bin/nsenter",
    "/usr/bin/setpriv",
    "/usr/bin/mount",
    "/usr/bin/umount",
];

/// The shmtrace binary the tests use, and the programs any guest of `arch` needs: the host's
/// own for the host's architecture, Debian's packages' for another.
fn base_image(arch: Arch, shmtrace: &Path) -> Result<Initramfs> {
    let mut image = if arch.cross_target().is_none() {
        let mut image = Initramfs::new(Libraries::Host, "objcopy");
        image
            .file(Path::new("/bin/busybox"), "/bin/busybox")
            .context("the guest's shell and tools are busybox's: apt-get install busybox-static")?;
        for program in TOOLS {
            image.program(Path::new(program))?;
        }
        // coreutils' sleep at its own path: a test of Ctrl-C waits for its execve by that
        // path (kernel_signals). Only x86-64 guests run that suite.
        image.program(Path::new("/usr/bin/sleep"))?;
        // The host's `sh`, dash, ahead of busybox's on PATH: busybox's runs its own applets
        // in place of `sleep` and the others, and the tests are written against the host's.
        image.program(Path::new("/usr/bin/dash"))?;
        image.symlink("/usr/bin/sh", "dash");
        image
    } else {
        let sysroot = userland::sysroot(arch, &cache_dir())?;
        let mut image = Initramfs::new(
            Libraries::Sysroot(sysroot, arch),
            "aarch64-linux-gnu-objcopy",
        );
        image.sysroot_program(Path::new("/bin/busybox"), "/bin/busybox")?;
        for program in TOOLS {
            // Debian 12's packages still put some of them in /bin.
            let name = Path::new(program).file_name().unwrap_or_default();
            image
                .sysroot_program(Path::new(program), program)
                .or_else(|_| image.sysroot_program(&Path::new("/bin").join(name), program))?;
        }
        image
    };
    // The applets of Debian's busybox-static, which is the same build on both architectures:
    // the host's lists them (the guest's cannot run here).
    let applets = Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .context("listing busybox's applets: apt-get install busybox-static")?;
    let list = String::from_utf8_lossy(&applets.stdout);
    for applet in list.split_whitespace().filter(|a| *a != "busybox") {
        image.symlink(Path::new("/bin").join(applet), "busybox");
    }
    for mount_point in ["/proc", "/sys", "/dev", "/tmp", "/run"] {
        image.dir(mount_point);
    }
    image.text("/init", "", 0o755);
    image.text(
        "/etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n",
        0o644,
    );
    image.text("/etc/group", "root:x:0:\nnogroup:x:65534:\n", 0o644);
    image.dir("/root");
    image.built_program(shmtrace)?;
    Ok(image)
}

fn guest_env(shmtrace: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin".to_owned()),
        ("HOME", "/root".to_owned()),
        ("TMPDIR", "/tmp".to_owned()),
        ("RUST_BACKTRACE", "1".to_owned()),
        // Emulation is several times slower than the host: the tests' deadlines stretch.
        ("SHMTRACE_TEST_TIME_SCALE", "4".to_owned()),
        // The tests' `shmtrace_bin()` builds with cargo, which the guest has not.
        ("SHMTRACE_BIN", shmtrace.display().to_string()),
    ]
}

/// `cargo <subcommand>` for programs of `arch`: for arm64, cross-built with Debian's
/// `gcc-aarch64-linux-gnu` as the linker and statically linked, so that the guest needs no
/// arm64 glibc for them.
fn guest_cargo(arch: Arch, subcommand: &str) -> Command {
    let mut command = cargo();
    command.current_dir(root()).arg(subcommand);
    if let Some(triple) = arch.cross_target() {
        let variable = triple.to_uppercase().replace('-', "_");
        command
            .args(["--target", triple])
            .env(
                format!("CARGO_TARGET_{variable}_LINKER"),
                "aarch64-linux-gnu-gcc",
            )
            .env(
                format!("CARGO_TARGET_{variable}_RUSTFLAGS"),
                "-C target-feature=+crt-static",
            );
    }
    command
}

/// The shmtrace binary the guests of `arch` run: the release binary of `cargo xtask dist`
/// with `--dist`, else a debug build, as the tests run it on the host.
fn guest_shmtrace(arch: Arch, args: &VmArgs) -> Result<PathBuf> {
    if !args.dist {
        return build_shmtrace(arch);
    }
    let binary = crate::dist::binary(arch)?;
    if !binary.exists() {
        bail!(
            "{} is missing: run `cargo xtask dist` first",
            binary.display()
        );
    }
    Ok(binary)
}

/// `cargo build` of the debug shmtrace binary, as the tests run it.
fn build_shmtrace(arch: Arch) -> Result<PathBuf> {
    crate::run(guest_cargo(arch, "build").args([
        "--quiet",
        "--package",
        "shmtrace",
        "--bin",
        "shmtrace",
    ]))
    .with_context(|| match arch.cross_target() {
        Some(triple) => format!(
            "cross-building for {triple} needs `rustup target add {triple}` and \
             `apt-get install gcc-aarch64-linux-gnu`"
        ),
        None => "building shmtrace".to_owned(),
    })?;
    Ok(arch.debug_dir(&target_dir()).join("shmtrace"))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// The test binaries cargo builds for `tests`, by name.
fn build_tests(arch: Arch, tests: &[String]) -> Result<Vec<(String, PathBuf)>> {
    let mut command = guest_cargo(arch, "test");
    // The workspace's default members with the root suites' feature, as `cargo xtask test
    // --ci` builds them: the same features of every dependency, so an x86-64 guest's test
    // binaries are the ones the tests step built, not a second build of their dependencies.
    command
        .args(["--no-run", "--features", crate::ROOT_SUITES])
        .args(["--message-format", "json-render-diagnostics"]);
    for test in tests {
        command.args(["--test", test]);
    }
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    if !output.status.success() {
        bail!("building the tests failed");
    }
    let mut built = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "test"));
        if let (true, Some(name), Some(path)) = (
            is_test,
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) {
            built.push((name.to_owned(), PathBuf::from(path)));
        }
    }
    for test in tests {
        if !built.iter().any(|(name, _)| name == test) {
            bail!("cargo built no test binary {test}");
        }
    }
    Ok(built)
}

/// A scratch directory for one kernel's guest files and logs, under `target/vm/`.
fn work_dir(kernel: &Kernel) -> Result<PathBuf> {
    let dir = target_dir().join("vm").join(kernel.name);
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// How one kernel fared.
struct Outcome {
    kernel: &'static Kernel,
    release: String,
    passed: usize,
    failed: Vec<String>,
    seconds: f64,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.failed.is_empty()
    }
}

/// The guest's run of `shmtrace --backend ebpf -- true`: every program loads and attaches,
/// or, on a kernel below the minimum, shmtrace refuses in a sentence naming the kernel and the
/// minimum. The probes are asked for by name: by default shmtrace falls back to ptrace where
/// they cannot load, and `true` then exits 0 on any kernel.
fn load_step(shmtrace: &Path) -> Step {
    Step::Command {
        name: "load".to_owned(),
        argv: vec![
            shmtrace.display().to_string(),
            "--backend".into(),
            "ebpf".into(),
            "--".into(),
            "true".into(),
        ],
    }
}

/// Where an arm64 guest holds the image's root file system.
const IMAGE_ROOT: &str = "/image";

/// The demo from the image's root file system, entered with chroot, with the kernel's file
/// systems bound inside and the root a mount point of its own (the demo makes every mount
/// private, which the kernel refuses for a root that is not one).
fn image_demo_step() -> Step {
    let script = format!(
        "set -e; mount --bind {IMAGE_ROOT} {IMAGE_ROOT}; \
         for d in proc sys dev; do mount --rbind /$d {IMAGE_ROOT}/$d; done; \
         chroot {IMAGE_ROOT} {} demo --color never",
        crate::dist::BINARY_IN_IMAGE
    );
    Step::Command {
        name: IMAGE_DEMO.to_owned(),
        argv: vec!["sh".into(), "-c".into(), script],
    }
}

const IMAGE_DEMO: &str = "image-demo";

/// What the image's demo says, as failures: it must explain both of its failures.
fn judge_image_demo(step: &guest::StepResult) -> Vec<String> {
    let explained = step.output.contains("ENOSPC (No space left on device)")
        && step.output.contains("+++ killed by SIGBUS +++")
        && step.output.contains("shmtrace diagnosis");
    if step.status == Some(0) && explained {
        return Vec::new();
    }
    vec![format!(
        "{IMAGE_DEMO}: the demo from the image's root file system exited with {:?} without \
         explaining both failures:\n{}",
        step.status,
        tail(&step.output, 40)
    )]
}

/// What the load step's result says, as failures.
fn judge_load(kernel: &Kernel, release: &str, step: &guest::StepResult) -> Vec<String> {
    let output = step.output.trim();
    let mut failures = Vec::new();
    match kernel.expect {
        Expect::Works => {
            if step.status != Some(0) {
                failures.push(format!(
                    "load: `shmtrace --backend ebpf -- true` exited with {:?}:\n{output}",
                    step.status
                ));
            }
        }
        Expect::Refused => {
            let sentence_ok = output.contains(release)
                && output.contains("needs Linux 5.15 or newer")
                && !output.to_lowercase().contains("verifier");
            if step.status == Some(0) || step.status.is_none() || !sentence_ok {
                failures.push(format!(
                    "load: expected a refusal naming {release} and the minimum, got status {:?}:\n{output}",
                    step.status
                ));
            }
        }
    }
    failures
}

fn boot_kernel(
    kernel: &'static Kernel,
    image: &mut Initramfs,
    steps: &[Step],
    env: &[(&str, String)],
    timeout: Duration,
) -> Result<(guest::Boot, String)> {
    let cache = cache_dir();
    let fetched = kernels::fetch(kernel, &cache).with_context(|| {
        format!(
            "fetching kernel {} from Debian {}",
            kernel.name, kernel.suite
        )
    })?;
    let work = work_dir(kernel)?;
    image.text("/init", &guest::init_script(kernel.arch, steps, env), 0o755);
    let initrd = work.join("initrd.cpio");
    image.write(&initrd)?;
    println!(
        "==> {} ({}, {}): booting {}",
        kernel.name, kernel.suite, kernel.who, fetched.package
    );
    let boot = guest::boot(kernel.arch, &fetched.vmlinuz, &initrd, &work, timeout)?;
    Ok((boot, fetched.package))
}

fn outcome_of(kernel: &'static Kernel, boot: &guest::Boot, package: String) -> Outcome {
    let release = boot.release.clone().unwrap_or(package);
    let mut outcome = Outcome {
        kernel,
        release: release.clone(),
        passed: 0,
        failed: Vec::new(),
        seconds: boot.seconds,
    };
    if boot.release.is_none() {
        outcome.failed.push(format!(
            "the guest never started its script; console: {}",
            boot.console.display()
        ));
        return outcome;
    }
    for step in &boot.steps {
        // The steps that are not test binaries, each judged by what it printed.
        let judged = match step.name.as_str() {
            "load" => Some(judge_load(kernel, &release, step)),
            IMAGE_DEMO => Some(judge_image_demo(step)),
            _ => None,
        };
        if let Some(failures) = judged {
            outcome.passed += usize::from(failures.is_empty());
            outcome.failed.extend(failures);
            continue;
        }
        let (passed, failed) = step.tests();
        outcome.passed += passed.len();
        outcome
            .failed
            .extend(failed.iter().map(|name| format!("{}: {name}", step.name)));
        if step.status != Some(0) && failed.is_empty() {
            outcome.failed.push(format!(
                "{}: exited with {:?} with no test failed:\n{}",
                step.name,
                step.status,
                tail(&step.output, 30)
            ));
        }
        if step.status != Some(0) {
            println!(
                "--- {} on {}:\n{}",
                step.name,
                kernel.name,
                tail(&step.output, 200)
            );
        }
    }
    if !boot.finished {
        outcome.failed.push(format!(
            "the guest did not finish within its time (console: {})",
            boot.console.display()
        ));
    }
    outcome
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn report(outcomes: &[Outcome]) -> Result<()> {
    println!(
        "\n{:<10} {:<34} {:>7} {:>7} {:>8}",
        "KERNEL", "RELEASE", "PASSED", "FAILED", "TIME"
    );
    for o in outcomes {
        println!(
            "{:<10} {:<34} {:>7} {:>7} {:>7.0}s",
            o.kernel.name,
            o.release,
            o.passed,
            o.failed.len(),
            o.seconds
        );
    }
    let passed: usize = outcomes.iter().map(|o| o.passed).sum();
    let failed: usize = outcomes.iter().map(|o| o.failed.len()).sum();
    for o in outcomes.iter().filter(|o| !o.ok()) {
        println!("\nfailed on {} ({}):", o.kernel.name, o.release);
        for failure in &o.failed {
            println!("  {failure}");
        }
    }
    // The plain closing line CI reads.
    println!("\nvm: {passed} passed, {failed} failed");
    if failed > 0 {
        bail!("{failed} failures in the kernel matrix");
    }
    Ok(())
}

/// The architectures of `kernels`, each once, in matrix order.
fn arches(kernels: &[&Kernel]) -> Vec<Arch> {
    let mut arches: Vec<Arch> = Vec::new();
    for kernel in kernels {
        if !arches.contains(&kernel.arch) {
            arches.push(kernel.arch);
        }
    }
    arches
}

pub fn load(args: &VmArgs) -> Result<()> {
    let selected = kernels::select(&args.kernel)?;
    let mut outcomes = Vec::new();
    for arch in arches(&selected) {
        let shmtrace = guest_shmtrace(arch, args)?;
        let mut image = base_image(arch, &shmtrace)?;
        let env = guest_env(&shmtrace);
        let steps = [load_step(&shmtrace)];
        for kernel in selected.iter().copied().filter(|k| k.arch == arch) {
            let timeout = Duration::from_secs(args.timeout_minutes.min(5) * 60);
            let (boot, package) = boot_kernel(kernel, &mut image, &steps, &env, timeout)?;
            outcomes.push(outcome_of(kernel, &boot, package));
        }
    }
    report(&outcomes)
}

pub fn test(args: &VmArgs) -> Result<()> {
    let selected = kernels::select(&args.kernel)?;
    let requested: Vec<String> = if args.tests.is_empty() {
        GUEST_SUITE.iter().map(|t| (*t).to_owned()).collect()
    } else {
        args.tests.clone()
    };
    let ci_of = |kernel: &Kernel| if args.full { kernel.full } else { kernel.ci };
    let selection = |kernel: &Kernel| ci_selection(ci_of(kernel)).filter(|_| args.ci);
    let timeout = Duration::from_secs(args.timeout_minutes * 60);
    let mut outcomes = Vec::new();
    for arch in arches(&selected) {
        let kernels: Vec<&Kernel> = selected
            .iter()
            .copied()
            .filter(|k| k.arch == arch)
            .collect();
        // Only the selections' binaries for an architecture whose kernels all run a selection.
        let mut tests = if kernels.iter().all(|k| selection(k).is_some()) {
            Vec::new()
        } else {
            requested.clone()
        };
        for (binary, _) in kernels.iter().filter_map(|k| selection(k)).flatten() {
            if !tests.iter().any(|t| t == binary) {
                tests.push((*binary).to_owned());
            }
        }
        // kernel_signals runs Python too, for its pseudo-terminal.
        let needs_python =
            |t: &String| t == PYTHON_SUITE || t == "kernel_sizing" || t == "kernel_signals";
        if arch.cross_target().is_some() && tests.iter().any(needs_python) {
            // The host's Python is x86-64's; no arm64 Python is unpacked for the guest.
            println!(
                "==> {arch:?}: leaving out {}, whose workloads need Python, which the guest has not",
                tests
                    .iter()
                    .filter(|t| needs_python(t))
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            tests.retain(|t| !needs_python(t));
        }
        let shmtrace = guest_shmtrace(arch, args)?;
        // No test to run (kernels booted for the load step alone): nothing to build.
        let binaries = if tests.is_empty() {
            Vec::new()
        } else {
            build_tests(arch, &tests)?
        };
        let mut image = base_image(arch, &shmtrace)?;
        // The image's root file system, where the host cannot run it.
        let image_demo = args.dist && arch.cross_target().is_some();
        if image_demo {
            image.unpacked_tar(&crate::dist::image_root(arch)?, Path::new(IMAGE_ROOT))?;
        }
        // The scenario program the tests run, next to their binaries' directory.
        if !binaries.is_empty() {
            image.built_program(&arch.debug_dir(&target_dir()).join("shm-exerciser"))?;
        }
        for (_, binary) in &binaries {
            image.built_program(binary)?;
        }
        if tests.iter().any(needs_python) {
            add_python(&mut image)?;
        }
        let env = guest_env(&shmtrace);
        for kernel in kernels {
            let mut steps = vec![load_step(&shmtrace)];
            if image_demo && kernel.expect == Expect::Works {
                steps.push(image_demo_step());
            }
            for (name, binary) in &binaries {
                let filters: Vec<String> = if let Some(selection) = selection(kernel) {
                    let Some((_, filters)) = selection.iter().find(|(binary, _)| binary == name)
                    else {
                        continue;
                    };
                    filters.iter().map(|f| (*f).to_owned()).collect()
                } else if !requested.contains(name) {
                    continue;
                } else {
                    args.filter.iter().cloned().collect()
                };
                if kernel.expect == Expect::Refused {
                    continue;
                }
                let mut test_args = vec!["--color".to_owned(), "never".to_owned()];
                test_args.extend(filters);
                for skipped in arch.skipped_tests() {
                    test_args.extend(["--skip".to_owned(), (*skipped).to_owned()]);
                }
                steps.push(Step::Test {
                    name: name.clone(),
                    binary: binary.clone(),
                    args: test_args,
                });
            }
            let (boot, package) = boot_kernel(kernel, &mut image, &steps, &env, timeout)?;
            let outcome = outcome_of(kernel, &boot, package);
            println!(
                "    {}: {} passed, {} failed in {:.0}s",
                kernel.name,
                outcome.passed,
                outcome.failed.len(),
                outcome.seconds
            );
            outcomes.push(outcome);
        }
    }
    report(&outcomes)
}
