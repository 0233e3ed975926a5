//! Running shmtrace as the users of issue 34 do: inside an ordinary container, as user 1000,
//! with every capability dropped, `no-new-privileges` and the runtime's default seccomp
//! profile, the release-less test binary bind-mounted at /x/shmtrace.
use std::process::{Command, Output};

use crate::{
    docker::{image, require_docker},
    shmtrace_bin,
};

/// What every unprivileged container gets: no network, user 1000, no capability, no way to
/// gain one, and the host's libraries and Python read-only.
pub fn docker_flags() -> Vec<String> {
    let mut flags: Vec<String> = [
        "--network",
        "none",
        "--user",
        "1000:1000",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
    ]
    .map(String::from)
    .to_vec();
    for dir in ["/lib", "/lib64", "/usr"] {
        flags.push("-v".into());
        flags.push(format!("{dir}:{dir}:ro"));
    }
    flags.push("-v".into());
    flags.push(format!("{}:/x/shmtrace:ro", shmtrace_bin().display()));
    flags
}

/// A finished `docker run --rm` of `script` (busybox sh) with `extra` flags.
pub struct Run {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(output: Output) -> Run {
        Run {
            status: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    pub fn dump(&self) -> String {
        format!(
            "status {}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `script` in an unprivileged container of the test image, named after `prefix`.
pub fn docker_run(prefix: &str, extra: &[&str], script: &str) -> Run {
    require_docker();
    let name = crate::docker::Container::name_for(prefix);
    let mut args: Vec<String> = vec!["run".into(), "--rm".into(), "--name".into(), name];
    args.extend(docker_flags());
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(image().to_owned());
    args.extend(["sh".into(), "-c".into(), script.into()]);
    Run::from(
        Command::new("docker")
            .args(&args)
            .output()
            .expect("running docker"),
    )
}
