//! A real PostgreSQL 15 (Debian's package) in a real Docker container: a parallel query that
//! runs out of /dev/shm is diagnosed with the worker's role from its process title, its pid in
//! the container (the one PostgreSQL's log prints) beside the host's, and advice that works;
//! a healthy parallel query gives no false alarm.
use serde_json::Value;
use shmtrace_tests::{
    docker::require_docker,
    live::LiveTracer,
    postgres::{FORCE_PARALLEL, Postgres},
    require_root, serial,
};

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let guard = serial();
    require_root();
    require_docker();
    guard
}

/// A table big enough for a parallel hash join to need more than 2 MiB of dynamic shared
/// memory.
const TABLE: &str = "CREATE TABLE t AS SELECT g AS a, md5(g::text) AS b \
                     FROM generate_series(1, 300000) g; ANALYZE t;";
const JOIN: &str = "SELECT count(*) FROM t t1 JOIN t t2 USING (a);";

fn parallel_join() -> String {
    format!("{FORCE_PARALLEL} {JOIN}")
}

fn dump(records: &[Value], log: &str) -> String {
    let mut text: Vec<String> = records.iter().map(Value::to_string).collect();
    text.push(format!("shmtrace stderr: {log}"));
    text.join("\n")
}

fn diagnoses(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["event"] == "diagnosis")
        .collect()
}

/// The segments PostgreSQL's log names as failing to resize, as their /dev/shm paths
/// (`segment "/PostgreSQL.N"` is /dev/shm/PostgreSQL.N).
fn segments_in_log(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("could not resize shared memory segment"))
        .filter_map(|l| {
            let start = l.find("segment \"")? + "segment \"".len();
            let end = start + l[start..].find('"')?;
            Some(format!("/dev/shm{}", &l[start..end]))
        })
        .collect()
}

/// The container pids PostgreSQL's log names as failing to resize a segment.
fn pids_in_log(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("could not resize shared memory segment"))
        .filter_map(|l| {
            let start = l.find(" [")? + 2;
            let end = start + l[start..].find(']')?;
            l[start..end].parse().ok()
        })
        .collect()
}

#[test]
fn a_parallel_query_out_of_shm_is_diagnosed_with_role_title_and_both_pids() {
    let _guard = setup();
    let server = Postgres::start("causes-pg-small", &["--shm-size=2m"], &[]);
    server.query(TABLE);
    let tracer = LiveTracer::start(&["--container", &server.container.name]);
    let failed = server.psql(&parallel_join());
    let (_, log, records) = tracer.stop();
    let server_log = server.log();
    let dump = || format!("{}\nserver log:\n{server_log}", dump(&records, &log));
    assert!(!failed.status.success(), "the join must fail: {}", dump());
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains("could not resize shared memory segment"),
        "{stderr}"
    );

    let logged = pids_in_log(&server_log);
    let segments = segments_in_log(&server_log);
    assert!(!logged.is_empty() && !segments.is_empty(), "{}", dump());
    let found = diagnoses(&records);
    // A parallel worker lives a few milliseconds: on a loaded machine it may fail and exit
    // before shmtrace reads /proc at all, and then neither its container pid nor its title is
    // known (CI rehearsals). Such a diagnosis is found by the segment the log names. When
    // both the leader and a worker failed, the one whose pids and title were read says the
    // most.
    let mut named: Vec<&Value> = found
        .iter()
        .copied()
        .filter(|d| match d["container_pid"].as_u64() {
            Some(pid) => logged.contains(&pid),
            None => d["failures"][0]["path"]
                .as_str()
                .is_some_and(|path| segments.iter().any(|s| s == path)),
        })
        .collect();
    named.sort_by_key(|d| (d["container_pid"].is_null(), d["title"].is_null()));
    let d = named.first().copied().unwrap_or_else(|| {
        panic!(
            "no diagnosis of a process or segment the log names ({logged:?}, {segments:?}):\n{}",
            dump()
        )
    });
    assert_eq!(d["cause"], "shm_full", "{d}");
    assert_eq!(d["program"], "PostgreSQL", "{d}");
    if d["container_pid"].is_null() {
        assert_eq!(
            d["title"],
            Value::Null,
            "a title read, but no container pid: {d}"
        );
    } else {
        assert_ne!(d["pid"], d["container_pid"], "both pids are shown: {d}");
    }
    // The leader (the client's backend) or one of its parallel workers runs out, as timing
    // has it; either way its title says which it is.
    let role = d["program_role"].as_str().unwrap_or_default();
    let title = d["title"].as_str().unwrap_or_default();
    if d["title"].is_null() {
        // Its role is then unknown, and none is made up.
        assert_eq!(d["program_role"], Value::Null, "{d}");
    } else if title.starts_with("postgres: parallel worker for PID ") {
        assert_eq!(role, &title["postgres: ".len()..], "{d}");
    } else {
        // `SELECT` while it runs the query, `idle` once it has reported the error: /proc is
        // read as soon as the failure arrives, which may be either side of that.
        assert!(
            title.starts_with("postgres: postgres postgres [local] "),
            "{d}"
        );
        assert!(
            role.starts_with(
                "backend of user postgres on database postgres from [local], running "
            ),
            "{d}"
        );
    }
    let failure = &d["failures"][0];
    assert_eq!(failure["errno"], "ENOSPC", "{d}");
    assert!(
        failure["path"]
            .as_str()
            .unwrap_or_default()
            .starts_with("/dev/shm/PostgreSQL."),
        "{d}"
    );
    let text = d["text"].to_string();
    assert!(
        role.is_empty() || text.contains(&format!("in its container), PostgreSQL {role}")),
        "{text}"
    );
    let alternatives = d["program_alternatives"].to_string();
    assert!(
        alternatives.contains("dynamic_shared_memory_type")
            && alternatives.contains("max_parallel_workers_per_gather"),
        "{d}"
    );

    assert!(
        d["recommendation"]["min_bytes"].as_u64() > Some(2 << 20),
        "a bigger size is advised: {d}"
    );

    // PostgreSQL's own alternatives work in the same 2 MiB /dev/shm: no parallel workers...
    server.query(&format!(
        "{FORCE_PARALLEL} SET max_parallel_workers_per_gather = 0; {JOIN}"
    ));
    drop(server);
    // ... or dynamic shared memory in System V segments, with the parallel plan.
    let sysv = Postgres::start(
        "causes-pg-sysv",
        &["--shm-size=2m"],
        &["dynamic_shared_memory_type=sysv"],
    );
    sysv.query(TABLE);
    let plan = sysv.query(&format!("{FORCE_PARALLEL} EXPLAIN ANALYZE {JOIN}"));
    assert!(plan.contains("Workers Launched"), "{plan}");
}

#[test]
fn a_healthy_parallel_query_gives_no_false_alarm() {
    let _guard = setup();
    let server = Postgres::start("causes-pg-healthy", &[], &[]);
    server.query(TABLE);
    let tracer = LiveTracer::start(&["--container", &server.container.name]);
    let out = server.query(&format!("{FORCE_PARALLEL} EXPLAIN ANALYZE {JOIN}"));
    let (_, log, records) = tracer.stop();
    let dump = || dump(&records, &log);
    assert!(out.contains("Workers Launched"), "a parallel plan: {out}");
    assert!(
        records.iter().any(|r| r["event"] == "openat"
            && r["ret"].as_i64() >= Some(0)
            && r["path"]
                .as_str()
                .unwrap_or_default()
                .starts_with("/dev/shm/PostgreSQL.")),
        "the query used dynamic shared memory:\n{}",
        dump()
    );
    let failures: Vec<&Value> = records.iter().filter(|r| r["failure"] == true).collect();
    assert_eq!(failures, Vec::<&Value>::new(), "{}", dump());
    assert_eq!(diagnoses(&records), Vec::<&Value>::new(), "{}", dump());
}
