//! A redacted copy, checked on its bytes: no original id, host name, image, command line or
//! private path survives anywhere in the file, kernel records included.
use super::*;
use crate::{
    event::{Body, decode},
    record::{
        CapacitySample, ContainerDescription, ShmCapacity, TraceWriter, Trigger, TriggerReason,
        WriterOptions, no_carry, redact_file,
    },
};

const HOST: &str = "gpu-node-secret-7";
const CONTAINER_ID: &str = "3f9ac2d17b5e4a8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e";
const IMAGE: &str = "registry.acme.example/vision/trainer:2024";
const NAME: &str = "acme_trainer_1";
const HOME_PATH: &str = "/home/alice/projects/secret_model/train.py";
const ARG: &str = "--customer=megacorp";

/// Strings that must not survive, each found in the original file first.
fn secrets() -> Vec<&'static [u8]> {
    vec![
        HOST.as_bytes(),
        CONTAINER_ID.as_bytes(),
        &CONTAINER_ID.as_bytes()[..12],
        IMAGE.as_bytes(),
        b"acme",
        NAME.as_bytes(),
        b"alice",
        b"secret_model",
        b"megacorp",
        b"stale-ring-buffer-bytes",
        b"label-value-acme",
        b"mytrainer",
    ]
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn original(path: &Path) {
    let mut header = test_header();
    header.hostname = Some(HOST.into());
    header.target.command = Some(vec!["python3".into(), HOME_PATH.into(), ARG.into()]);
    let mut container = ContainerDescription {
        id: CONTAINER_ID.into(),
        name: Some(NAME.into()),
        runtime: Some("docker".into()),
        image: Some(IMAGE.into()),
        hostname: Some(CONTAINER_ID[..12].into()),
        pid: Some(4242),
        mntns: Some(4026532400),
        cgroup_path: Some(format!("/docker/{CONTAINER_ID}")),
        shm: Some(ShmCapacity {
            dev: 26,
            size_bytes: 64 << 20,
            ..ShmCapacity::default()
        }),
        ..ContainerDescription::default()
    };
    container
        .labels
        .insert("team".into(), "label-value-acme".into());
    container
        .labels
        .insert("com.docker.compose.project".into(), "acme".into());
    container.extra.insert(
        "mounts".into(),
        ciborium::Value::Array(vec![ciborium::Value::Text(format!(
            "/var/lib/docker/containers/{CONTAINER_ID}/shm"
        ))]),
    );
    header.target.containers.push(container.clone());

    let mut writer = TraceWriter::create(path, header, WriterOptions::default()).unwrap();
    let mut snap = snapshot(4242);
    if let UserRecord::Snapshot(s) = &mut snap {
        s.exe = Some("/home/alice/venv/bin/python3".into());
        s.argv = vec!["python3".into(), HOME_PATH.into(), ARG.into()];
        s.fds[0].path = "/dev/shm/acme_cache_4242".into();
    }
    writer.write_user(1, &snap).unwrap();
    writer
        .write_user(2, &UserRecord::Container(Box::new(container)))
        .unwrap();
    writer
        .write_kernel(&exec(
            3,
            4242,
            "/home/alice/venv/bin/python3",
            &["python3", HOME_PATH, ARG],
        ))
        .unwrap();
    // A process name that is the project's own.
    let mut named = fork(4, 4242, 4243);
    named[offset_of_comm()..offset_of_comm() + 9].copy_from_slice(b"mytrainer");
    writer.write_kernel(&named).unwrap();
    writer
        .write_kernel(&rename(5, 4243, "pt_data_worker"))
        .unwrap();
    writer
        .write_kernel(&openat(6, 4243, "/dev/shm/torch_4243_17", 11, 77))
        .unwrap();
    // The ring buffer does not clear memory: bytes after a path's NUL are whatever was there.
    let mut stale = openat(7, 4243, "/dev/shm/acme_cache_4242", 12, 78);
    let at = stale.len() - 100;
    stale[at..at + 23].copy_from_slice(b"stale-ring-buffer-bytes");
    writer.write_kernel(&stale).unwrap();
    writer
        .write_kernel(&openat(8, 4243, "/home/alice/.cache/x", 13, 79))
        .unwrap();
    writer
        .write_kernel(&fallocate_enospc(9, 4243, 11, 77))
        .unwrap();
    writer
        .write_user(
            10,
            &UserRecord::Capacity(CapacitySample {
                pid: Some(4243),
                container: Some(CONTAINER_ID.into()),
                capacity: ShmCapacity::default(),
            }),
        )
        .unwrap();
    writer
        .write_user(
            11,
            &UserRecord::Trigger(Trigger {
                reason: TriggerReason::Enospc,
                pid: Some(4243),
                detail: format!("{HOST}: fallocate in {NAME}"),
            }),
        )
        .unwrap();
    writer
        .write_user(
            12,
            &UserRecord::Note {
                text: format!("ran on {HOST}"),
            },
        )
        .unwrap();
    writer.finish(&mut no_carry).unwrap();
}

fn offset_of_comm() -> usize {
    std::mem::offset_of!(shmtrace_common::Header, comm)
}

#[test]
fn no_identifying_string_survives_in_the_bytes() {
    let dir = TempDir::new("redact");
    let input = dir.join("trace.shmtrace");
    let output = dir.join("shareable.shmtrace");
    original(&input);
    let before = std::fs::read(&input).unwrap();
    for secret in secrets() {
        assert!(
            contains(&before, secret),
            "the test must start with {:?} in the file",
            String::from_utf8_lossy(secret)
        );
    }

    let stats = redact_file(&input, &output, WriterOptions::default()).unwrap();
    assert!(stats.input_error.is_none());
    assert_eq!((stats.records, stats.kernel_dropped), (12, 0));

    let after = std::fs::read(&output).unwrap();
    for secret in secrets() {
        assert!(
            !contains(&after, secret),
            "{:?} survived redaction",
            String::from_utf8_lossy(secret)
        );
    }

    // Still a trace: marked redacted, every record decodes, the diagnosis material is intact.
    let reader = TraceReader::open(&output).unwrap();
    let header = reader.header().clone();
    assert!(header.redacted);
    assert_eq!(
        header.target.containers[0].runtime.as_deref(),
        Some("docker")
    );
    assert_eq!(
        header.target.containers[0].shm.unwrap().size_bytes,
        64 << 20
    );
    assert_eq!(header.target.containers[0].id.len(), 64);
    assert!(
        header.target.containers[0]
            .labels
            .contains_key("com.docker.compose.project")
    );
    let (entries, error) = read_entries(reader);
    assert!(error.is_none());
    let events: Vec<_> = entries
        .iter()
        .filter_map(|e| match &e.record {
            Record::Kernel(bytes) => Some(decode(bytes).unwrap()),
            _ => None,
        })
        .collect();
    let Body::Exec(exec) = &events[0].body else {
        panic!("exec first")
    };
    assert_eq!(exec.argv.len(), 3, "as many arguments, pseudonymous");
    assert!(exec.filename.starts_with("/redacted/"));
    assert_eq!(
        events[2].body,
        Body::Rename {
            pid: 4243,
            tid: 4243,
            comm: "pt_data_worker".into()
        }
    );
    let paths: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.body {
            Body::Call(call) => call.path.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(
        paths[0], "/dev/shm/torch_4243_17",
        "PyTorch's names are kept"
    );
    assert!(paths[1].starts_with("/dev/shm/") && paths[1].ends_with("_cache_4242"));
    assert!(paths[2].starts_with("/redacted/"));
    // The same name gets the same pseudonym in a snapshot and in a kernel record.
    let Record::User(UserRecord::Snapshot(snap)) = &entries[0].record else {
        panic!("snapshot first")
    };
    assert_eq!(snap.fds[0].path, paths[1]);
    assert_eq!(snap.exe.as_deref(), Some(exec.filename.as_str()));
    assert_eq!(snap.argv, exec.argv);
    assert_eq!(
        events[6].body,
        decode(&fallocate_enospc(9, 4243, 11, 77)).unwrap().body
    );

    // A second redaction uses another key: pseudonyms do not link two shared files.
    let again = dir.join("again.shmtrace");
    redact_file(&input, &again, WriterOptions::default()).unwrap();
    let (entries_again, _) = read_all(&again);
    assert_ne!(entries_again[0].record, entries[0].record);
}

#[test]
fn redacting_onto_the_input_is_refused() {
    let dir = TempDir::new("redact-same");
    let input = dir.join("trace.shmtrace");
    original(&input);
    assert!(matches!(
        redact_file(&input, &input, WriterOptions::default()),
        Err(crate::record::RedactError::SamePath)
    ));
}
