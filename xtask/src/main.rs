//! Developer chores: `cargo xtask <task>`.
//!
//! - `build-ebpf`: build the eBPF object from `shmtrace-ebpf` (nightly + bpf-linker) and commit
//!   it to `shmtrace/bpf/`, with a hash of the inputs it was built from.
//! - `check-ebpf`: fail if the committed object is stale against those inputs.
//! - `lint-ebpf`: clippy on the eBPF crate for its real target (nightly), warnings as errors.
//! - `test`: build everything and run every test, the suites that need root included (a plain
//!   `cargo test` leaves those out); with `--ci`, all but the long suites.
//! - `bench`: overhead of tracing a PyTorch-like /dev/shm churn, against strace and perf trace.
//! - `ptrace-floor`: run a command stopped where the ptrace source stops the churn, doing
//!   nothing at the stops (the bench's ptrace floor).
//! - `floor`: run a command with empty BPF programs on shmtrace's hooks (the bench's floor), or
//!   with `--records`, one record per call (the bench's record floor).
//! - `gen-cri`: regenerate the committed CRI gRPC client from its vendored proto.
//! - `fuzz`: run each fuzz target of `fuzz/` for a fixed time (nightly, cargo-fuzz).
//! - `check-layers`: the modules of the core and the binary import only downwards, and no
//!   crate has modules that import each other.
//! - `vm-load`, `vm-test`: the kernel matrix, Debian's kernels under qemu (docs/kernels.md).
//! - `dist`: release binaries (glibc 2.31 or newer) and wheels, x86-64 and arm64.
mod bench;
mod debian;
mod dist;
mod ebpf;
mod fuzz;
mod gen_cri;
mod layering;
mod vm;

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the eBPF object and record the hash of its inputs.
    BuildEbpf {
        /// Only check that the sources build; leave the committed object alone.
        #[arg(long)]
        verify_only: bool,
    },
    /// Check that the committed eBPF object was built from the current sources.
    CheckEbpf,
    /// Run clippy on the eBPF crate for the BPF target (nightly), warnings as errors.
    LintEbpf,
    /// Check that no module imports upwards against docs/architecture.md's layers.
    CheckLayers,
    /// Build, then run the whole test suite, the suites that need root included (root).
    Test {
        /// What `.ci/run` runs on every submission: every suite but the long ones (the tests
        /// crate's `long` feature), which `.ci/run --full` runs too.
        #[arg(long)]
        ci: bool,
        /// Extra arguments for `cargo test`, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Measure tracing overhead on a /dev/shm churn workload (see docs/BENCHMARKS.md).
    Bench(bench::BenchArgs),
    /// Regenerate the CRI client in shmtrace/src/container/cri (needs protoc).
    GenCri,
    /// Run every fuzz target for a fixed time from its seed corpus (nightly, cargo-fuzz).
    Fuzz(fuzz::FuzzArgs),
    /// Load every program on each kernel of the matrix, under qemu (docs/kernels.md).
    VmLoad(vm::VmArgs),
    /// Run the `kernel_*` tests inside each kernel of the matrix, under qemu.
    VmTest(vm::VmArgs),
    /// Release binaries and wheels for x86-64 and arm64 in target/dist/ (docs/install.md).
    Dist(dist::DistArgs),
    /// The benchmark's workload (run by `bench`).
    #[command(hide = true)]
    Churn(bench::ChurnArgs),
    /// The bench's bystander loops: calls that do not concern /dev/shm (run by `bench`).
    #[command(hide = true)]
    Bystander(bench::BystanderArgs),
    /// Run a command with empty BPF programs on shmtrace's hooks: the floor of tracing cost.
    #[command(hide = true)]
    Floor {
        /// Write one (empty) record per call into a ring buffer, where shmtrace reports it: the floor of a tracer that
        /// reports every call.
        #[arg(long)]
        records: bool,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run a command stopped by ptrace where shmtrace's ptrace source stops the churn, doing
    /// nothing at the stops: the floor of that source's cost.
    #[command(hide = true)]
    PtraceFloor {
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// The bench's fork storm: PROCESSES children, each creating and unlinking one object.
    #[command(hide = true)]
    Storm {
        #[arg(long)]
        processes: u64,
        #[arg(long, default_value = "storm")]
        tag: String,
    },
    /// Print the monotonic clock (the bench times shmtrace's start-up around it).
    #[command(hide = true)]
    Stamp,
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::BuildEbpf { verify_only } => ebpf::build(verify_only),
        Task::CheckEbpf => ebpf::check(),
        Task::LintEbpf => ebpf::lint(),
        Task::CheckLayers => layering::run(),
        Task::Test { ci, args } => test(ci, &args),
        Task::Bench(args) => bench::run(&args),
        Task::Churn(args) => bench::churn(&args),
        Task::Bystander(args) => bench::bystander(&args),
        Task::Floor { records, command } => bench::floor(&command, records),
        Task::PtraceFloor { command } => bench::ptrace_floor(&command),
        Task::Storm { processes, tag } => bench::storm(processes, &tag),
        Task::Stamp => {
            bench::stamp();
            Ok(())
        }
        Task::GenCri => gen_cri::run(),
        Task::Fuzz(args) => fuzz::run_all(&args),
        Task::VmLoad(args) => vm::load(&args),
        Task::VmTest(args) => vm::test(&args),
        Task::Dist(args) => dist::run_dist(&args),
    }
}

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `cargo metadata --format-version 1` of the workspace at `dir`, with `options` besides.
pub fn cargo_metadata(dir: &std::path::Path, options: &[&str]) -> Result<serde_json::Value> {
    let output = cargo()
        .current_dir(dir)
        .args(["metadata", "--format-version", "1"])
        .args(options)
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("parsing cargo metadata's output")
}

pub fn run(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

/// The features that declare the test suites that need root, and among them the long ones
/// that `.ci/run` leaves to `--full` (tests/Cargo.toml).
pub const ROOT_SUITES: &str = "shmtrace-tests/root";
pub const LONG_SUITES: &str = "shmtrace-tests/long";

fn test(ci: bool, extra: &[String]) -> Result<()> {
    // The default members: everything but the eBPF crate, which builds only for the BPF
    // target (`build-ebpf`); with the suites that need root, which a plain `cargo test`
    // leaves out, and the long ones unless for `--ci`.
    let features = if ci {
        // What is left out is said, by name, so that no suite goes missing unnoticed.
        let metadata = cargo_metadata(&root(), &["--no-deps"])?;
        println!(
            "cargo xtask test --ci: leaving out the long suites {} (cargo xtask test runs them)",
            long_suites(&metadata)?.join(", ")
        );
        ROOT_SUITES.to_owned()
    } else {
        format!("{ROOT_SUITES},{LONG_SUITES}")
    };
    run(cargo()
        .current_dir(root())
        .args(["build", "--all-targets", "--features", &features]))?;
    run(cargo()
        .current_dir(root())
        .args(["test", "--no-fail-fast", "--features", &features])
        .args(extra))
}

/// The tests crate's test targets, each with its required features, from `cargo metadata`.
fn test_suites(metadata: &serde_json::Value) -> Result<Vec<(String, Vec<String>)>> {
    let tests = metadata["packages"]
        .as_array()
        .context("cargo metadata: no packages")?
        .iter()
        .find(|package| package["name"] == "shmtrace-tests")
        .context("cargo metadata: no shmtrace-tests package")?;
    let mut suites = Vec::new();
    for target in tests["targets"].as_array().into_iter().flatten() {
        let is_test = target["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "test"));
        if !is_test {
            continue;
        }
        let name = target["name"].as_str().context("a target without a name")?;
        let features = target["required-features"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str().map(str::to_owned))
            .collect();
        suites.push((name.to_owned(), features));
    }
    Ok(suites)
}

/// The long suites, by name, sorted: those behind the tests crate's `long` feature.
fn long_suites(metadata: &serde_json::Value) -> Result<Vec<String>> {
    let mut long: Vec<String> = test_suites(metadata)?
        .into_iter()
        .filter(|(_, features)| features.iter().any(|f| f == "long"))
        .map(|(name, _)| name)
        .collect();
    long.sort();
    Ok(long)
}

#[cfg(test)]
mod tests {
    /// The tests crate's suites that need root, by their names (docs/architecture.md): each is
    /// behind the `root` feature, so that a plain `cargo test` as any user leaves it out, and no
    /// other is, so that a plain `cargo test` runs it. The long ones, which `.ci/run` leaves to
    /// `--full`, are those README.md names.
    #[test]
    fn the_suites_that_need_root_and_only_they_are_behind_the_feature() {
        let metadata = super::cargo_metadata(&super::root(), &["--no-deps"]).unwrap();
        let suites = super::test_suites(&metadata).unwrap();
        for (name, features) in &suites {
            let needs_root = ["kernel_", "docker_", "podman_", "containerd_"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
                || name == "prometheus_daemon";
            let behind = features.iter().any(|f| f == "root");
            assert_eq!(
                needs_root, behind,
                "{name}: needs root: {needs_root}; behind the root feature: {behind} \
                 (tests/Cargo.toml)"
            );
        }
        assert!(suites.len() >= 30, "{} test targets", suites.len());
        // The README says what .ci/run leaves out: the long suites, each by name.
        let long_suites = super::long_suites(&metadata).unwrap();
        assert!(!long_suites.is_empty(), "no long suites");
        let readme = std::fs::read_to_string(super::root().join("README.md")).unwrap();
        let start = readme
            .find("- the long suites")
            .expect("README.md lists the long suites");
        let item = &readme[start..start + readme[start..].find(";\n").expect("an item")];
        let named: Vec<String> = item
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|span| span.contains('_'))
            .map(str::to_owned)
            .collect();
        assert_eq!(
            named, long_suites,
            "README.md's list of the long suites: {item:?}"
        );
    }
}
