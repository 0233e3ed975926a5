//! `shmtrace daemon` scraped by a real Prometheus while a real Docker container fails in a
//! 1 MiB /dev/shm: Prometheus' HTTP API has the failure counter and the size, used and
//! recommended gauges for that container by name, and nothing for a bystander that only lists
//! /dev/shm; the advised size, applied, lets the same workload succeed. Needs root, Docker and
//! Debian's prometheus package, and fails loudly without them.
use std::{
    io::Write,
    process::{Command, Stdio},
    time::Duration,
};

use shmtrace_tests::{
    bpf_objects::OwnBpfObjects,
    daemon::{Daemon, sample},
    docker::{self, Container},
    prometheus::{Prometheus, value},
    recording::replay,
    require_root, serial,
};

/// Once /work/go exists, fills its 1 MiB /dev/shm with `dd`, then asks for 2 MiB more with
/// `fallocate` (a size stated in the call: files grown by `write()` alone state none, and get
/// no advice), then stays up so that its /dev/shm can be measured. `/work/err` gets what fails.
const WORKLOAD: &str = "while [ ! -e /work/go ]; do sleep 0.1; done; dd if=/dev/zero \
                        of=/dev/shm/fill bs=1M count=1 2>/dev/null; /x/shm-exerciser \
                        fallocate-enospc 2>/work/err; sleep 600";

#[test]
fn prometheus_scrapes_a_containers_failure_size_use_and_advice() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let record_dir = shmtrace_tests::tempdir().join("incidents");
    let daemon = Daemon::start(&[
        "--interval",
        "1s",
        "--record-dir",
        record_dir.to_str().unwrap(),
        "--tail",
        "1",
    ]);
    let bpf = OwnBpfObjects::watch(daemon.pid());
    let prometheus = Prometheus::start("shmtrace", &daemon.addr);

    // It lists /dev/shm again and again (opening the directory), and touches nothing in it:
    // that is no use of /dev/shm, and earns no series.
    let bystander = Container::run(
        "daemon-prom-bystander",
        &[],
        "while true; do ls -la /dev/shm /dev/shm/ >/dev/null; sleep 0.2; done",
    );
    let failing = Container::run("daemon-prom-fail", &["--shm-size", "1m"], WORKLOAD);
    // Let a survey of the runtimes see both before the failure (one runs every second).
    std::thread::sleep(Duration::from_secs(3));
    failing.signal("go");

    let name = failing.name.clone();
    let name = name.as_str();
    let failures = prometheus.wait_for(
        &format!(r#"shmtrace_shm_failures_total{{container="{name}"}}"#),
        Duration::from_secs(30),
    );
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0]["metric"]["errno"], "ENOSPC", "{failures:?}");
    assert_eq!(failures[0]["metric"]["runtime"], "docker", "{failures:?}");
    assert!(value(&failures[0]) >= 1.0, "{failures:?}");

    let size = prometheus.wait_for(
        &format!(r#"shmtrace_shm_size_bytes{{container="{name}"}}"#),
        Duration::from_secs(15),
    );
    assert_eq!(value(&size[0]), (1u64 << 20) as f64, "{size:?}");
    // dd filled it: the tmpfs is full. (Waited for as such: a survey can measure it mid-fill.)
    let used = prometheus.wait_for(
        &format!(
            r#"shmtrace_shm_used_bytes{{container="{name}"}} == {}"#,
            1u64 << 20
        ),
        Duration::from_secs(15),
    );
    assert_eq!(value(&used[0]), (1u64 << 20) as f64, "{used:?}");
    // Which /dev/shm it is, as the container's own mount table says (`major:minor`): what
    // containers sharing one have in common, to count it once.
    assert_eq!(
        used[0]["metric"]["shm"],
        shm_device(failing.pid()),
        "{used:?}"
    );
    // The node's use counts the failing container's /dev/shm, once; the bystander has none in
    // it. Other containers on this machine (other tests') may hold some of their own: the
    // node's figure is the failing container's and theirs, each /dev/shm once, as one scrape
    // of the daemon shows them.
    let shm = used[0]["metric"]["shm"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let scrape = daemon.metrics();
        let node = sample(&scrape, "shmtrace_node_shm_used_bytes", &[]).unwrap_or(0.0);
        let others: f64 = others_used(&scrape, &shm);
        if node == (1u64 << 20) as f64 + others {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node's use is {node}, not 1 MiB + {others} of other containers:\n{scrape}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let recommended = prometheus.wait_for(
        &format!(r#"shmtrace_recommended_shm_bytes{{container="{name}"}}"#),
        Duration::from_secs(15),
    );
    let advised = value(&recommended[0]);
    assert!(advised > (2u64 << 20) as f64, "advised {advised}");

    // Every query of the shipped Grafana dashboard runs in Prometheus, and its first panel
    // (used / size) shows the container.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy/grafana/shmtrace.json"),
        )
        .unwrap(),
    )
    .unwrap();
    for (i, panel) in dashboard["panels"].as_array().unwrap().iter().enumerate() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$instance", ".*")
                .replace("$namespace", ".*")
                .replace("$container", ".*");
            let result = prometheus.query(&expr);
            if i == 0 {
                assert!(
                    result.iter().any(|r| r["metric"]["container"] == name),
                    "{expr}: {result:?}"
                );
            }
        }
    }

    let about_bystander = prometheus.query(&format!(r#"{{container="{}"}}"#, bystander.name));
    assert!(
        about_bystander.is_empty(),
        "a container that only lists /dev/shm has series: {about_bystander:?}"
    );
    assert!(
        !daemon.metrics().contains(&bystander.name),
        "a container that only lists /dev/shm has series"
    );

    // A real scrape passes promtool's checks.
    let scrape = daemon.metrics();
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{scrape}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    // docs/fleet.md's table of metrics is the scrape's: the same families, in the same order,
    // of the same types.
    let exported: Vec<(String, String)> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect();
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/fleet.md"),
    )
    .unwrap();
    let documented: Vec<(String, String)> = docs
        .lines()
        .filter(|l| l.starts_with("| `shmtrace_"))
        .filter_map(|l| {
            let mut cells = l.split('|').skip(1).map(str::trim);
            let name = cells.next()?.trim_matches('`').to_owned();
            Some((name, cells.next()?.to_owned()))
        })
        .collect();
    assert_eq!(
        documented, exported,
        "docs/fleet.md's table of metrics differs from what the daemon exports"
    );
    assert_eq!(
        sample(
            &scrape,
            "shmtrace_shm_failures_total",
            &[("container", name)]
        ),
        Some(1.0),
        "{scrape}"
    );

    // The advice works: the same workload in a /dev/shm of the advised size succeeds.
    let rerun = Container::run(
        "daemon-prom-advised",
        &["--shm-size", &format!("{}", advised as u64)],
        "touch /work/go; dd if=/dev/zero of=/dev/shm/fill bs=1M count=1 && /x/shm-exerciser \
         fallocate-enospc 2>/work/err && [ ! -s /work/err ] && touch /work/ok; sleep 600",
    );
    docker::wait_for(&rerun.work.join("ok"));

    drop(failing);
    drop(bystander);
    drop(rerun);
    let (status, lines, stderr) = daemon.stop();
    assert!(status.success(), "daemon exit {status}: {stderr}");
    // Other processes on the machine fail too: show only what concerns this test.
    let ours = |lines: &[serde_json::Value]| -> String {
        lines
            .iter()
            .filter(|l| l.to_string().contains(name) || l["event"] == "recording")
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let failure = lines
        .iter()
        .find(|l| l["errno"] == "ENOSPC" && l["container"]["name"] == name)
        .unwrap_or_else(|| panic!("no failure line: {}", ours(&lines)));
    assert_eq!(failure["event"], "fallocate", "{failure}");
    let diagnosis = lines
        .iter()
        .find(|l| l["event"] == "diagnosis" && l["container"]["name"] == name)
        .unwrap_or_else(|| panic!("no diagnosis line: {}", ours(&lines)));
    assert_eq!(diagnosis["cause"], "shm_full", "{diagnosis}");
    assert_eq!(
        diagnosis["recommendation"]["min_bytes"].as_f64(),
        Some(advised),
        "{diagnosis}"
    );
    // The incident was recorded, and `shmtrace report` explains it from the file. Other
    // processes on the machine may have had incidents of their own meanwhile: one of the
    // recordings is ours.
    let recordings: Vec<&str> = lines
        .iter()
        .filter(|l| l["event"] == "recording")
        .filter_map(|l| l["path"].as_str())
        .collect();
    assert!(
        !recordings.is_empty(),
        "no recording line: {}",
        ours(&lines)
    );
    let explained = recordings.iter().any(|path| {
        let report = replay("report", std::path::Path::new(path), &[]);
        report.records.iter().any(|r| {
            r["event"] == "diagnosis" && r["cause"] == "shm_full" && r["container"]["name"] == name
        })
    });
    assert!(
        explained,
        "no recording explains the failure: {recordings:?}"
    );
    // Every BPF program, map and link it held is gone from the kernel.
    assert!(
        !bpf.assert_released().is_empty(),
        "the daemon held no BPF object"
    );
}

/// The device (`major:minor`) of the file system on /dev/shm in process `pid`'s mount table.
fn shm_device(pid: u32) -> String {
    let table = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    table
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .find(|fields| fields.get(4) == Some(&"/dev/shm"))
        .and_then(|fields| fields.get(2).map(|dev| (*dev).to_owned()))
        .unwrap_or_else(|| panic!("no /dev/shm in {pid}'s mounts:\n{table}"))
}

/// What the containers followed on a /dev/shm other than `shm` hold, each /dev/shm once, in
/// one scrape of the daemon.
fn others_used(scrape: &str, shm: &str) -> f64 {
    let mut seen = std::collections::BTreeMap::new();
    for line in scrape
        .lines()
        .filter(|l| l.starts_with("shmtrace_shm_used_bytes{"))
    {
        let Some(dev) = line
            .split("shm=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        if dev != shm
            && let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())
        {
            seen.insert(dev.to_owned(), value);
        }
    }
    seen.values().sum()
}
