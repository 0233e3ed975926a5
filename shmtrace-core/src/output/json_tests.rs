//! The JSON line of each kind of event, whole: the keys, their order, which are `null` and
//! which are left out, and how strings are escaped. These lines are the schema users parse
//! (`docs/json.md`); a change to `JsonEvent` that moves, renames or drops a key fails here.
use std::borrow::Cow;

use serde_json::Value;

use super::{
    flag_names::FlagNames,
    json::{JsonWriter, to_json},
};
use crate::{
    diagnose::{Role, RoleKind},
    event::{Body, Call, Event, Exec, Exit, ExitStatus, FileRef, InodeId, Signal, Syscall, escape},
    model::{Annotation, ContainerInfo, FaultSite},
};

const TS: &str = "2026-11-29T16:51:37.000000001Z";
/// `0:27` in the kernel's `dev_t` encoding (major << 20 | minor).
const DEV: u32 = 27;

fn event(body: Body) -> Event {
    Event {
        ts_ns: 1,
        cpu: 0,
        pid: 100,
        tid: 101,
        comm: "pt_data_worker".to_owned(),
        mntns: 4026531841,
        cgroup_id: 7,
        container_match: false,
        body,
    }
}

fn call(syscall: Syscall, ret: i64, args: [u64; 6], path: Option<&str>) -> Body {
    Body::Call(Call {
        syscall,
        fd: Some(3),
        ret,
        args,
        file: Some(FileRef {
            inode: InodeId { dev: DEV, ino: 42 },
            mode: libc::S_IFREG | 0o600,
            size: 4096,
            allocated: 8192,
        }),
        path: path.map(str::to_owned),
        path_truncated: false,
        relative_to_shm: false,
        dir_ino: None,
    })
}

/// The event's line as `show --json` writes it.
fn line_with(
    event: &Event,
    note: &Annotation,
    role: &Role,
    container: Option<&ContainerInfo>,
) -> String {
    let mut flag_names = FlagNames::default();
    let record =
        to_json(event, note, role, container, TS, &mut flag_names).expect("a relevant event");
    let mut out = Vec::new();
    let mut writer = JsonWriter::new(&mut out);
    writer.event(&record).unwrap();
    writer.flush().unwrap();
    drop(writer);
    // The keys written as they are, the line exactly as serde_json writes it.
    assert_eq!(
        String::from_utf8_lossy(&out),
        serde_json::to_string(&record).unwrap() + "\n"
    );
    String::from_utf8(out).unwrap()
}

fn line(event: &Event, note: &Annotation) -> String {
    line_with(event, note, &Role::OTHER, None)
}

fn named(path: &str) -> Annotation {
    Annotation {
        object_path: Some(path.into()),
        ..Annotation::default()
    }
}

#[test]
fn calls_read_as_the_schema_says() {
    let create = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
    let open = event(call(
        Syscall::Openat,
        3,
        [0, 0, create, 0o600, 0, 0],
        Some("/dev/shm/torch_1"),
    ));
    assert_eq!(
        line(&open, &named("/dev/shm/torch_1")),
        concat!(
            r#"{"v":1,"ts":"2026-11-29T16:51:37.000000001Z","pid":100,"tid":101,"comm":"pt_data_worker","#,
            r#""event":"openat","path":"/dev/shm/torch_1","fd":3,"size":null,"offset":null,"ret":3,"#,
            r#""errno":null,"signal":null,"code":null,"addr":null,"failure":false,"#,
            r#""flags":"O_RDWR|O_CREAT|O_EXCL","mode":"0600","object_size":4096,"object_bytes":8192,"#,
            r#""inode":42,"dev":"0:27","mntns":4026531841,"cgroup_id":7,"role":"other","container":null}"#,
            "\n"
        )
    );

    let full = event(call(
        Syscall::Fallocate,
        -i64::from(libc::ENOSPC),
        [3, 0, 0, 262144, 0, 0],
        None,
    ));
    let worker = Role {
        kind: RoleKind::DataloaderWorker,
        worker_index: Some(1),
        trainer: Some(99),
    };
    assert_eq!(
        line_with(&full, &named("/dev/shm/torch_1"), &worker, None),
        concat!(
            r#"{"v":1,"ts":"2026-11-29T16:51:37.000000001Z","pid":100,"tid":101,"comm":"pt_data_worker","#,
            r#""event":"fallocate","path":"/dev/shm/torch_1","fd":3,"size":262144,"offset":0,"ret":-28,"#,
            r#""errno":"ENOSPC","signal":null,"code":null,"addr":null,"failure":true,"#,
            r#""flags":"0","object_size":4096,"object_bytes":8192,"inode":42,"dev":"0:27","#,
            r#""mntns":4026531841,"cgroup_id":7,"role":"dataloader_worker","worker_index":1,"trainer_pid":99,"#,
            r#""container":null}"#,
            "\n"
        )
    );

    let map = event(call(
        Syscall::Mmap,
        0x7f00_0000_0000,
        [
            0,
            8192,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            libc::MAP_SHARED as u64,
            3,
            0,
        ],
        None,
    ));
    let unmap = event(call(
        Syscall::Munmap,
        0,
        [0x7f00_0000_0000, 8192, 0, 0, 0, 0],
        None,
    ));
    let mut freed = named("/dev/shm/torch_1");
    freed.freed = vec!["/dev/shm/torch_1".to_owned(), "/dev/shm/torch_2".to_owned()];
    assert_eq!(
        line(&map, &named("/dev/shm/torch_1")),
        concat!(
            r#"{"v":1,"ts":"2026-11-29T16:51:37.000000001Z","pid":100,"tid":101,"comm":"pt_data_worker","#,
            r#""event":"mmap","path":"/dev/shm/torch_1","fd":3,"size":8192,"offset":0,"ret":139637976727552,"#,
            r#""errno":null,"signal":null,"code":null,"addr":"0x7f0000000000","failure":false,"#,
            r#""flags":"MAP_SHARED","prot":"PROT_READ|PROT_WRITE","object_size":4096,"object_bytes":8192,"#,
            r#""inode":42,"dev":"0:27","mntns":4026531841,"cgroup_id":7,"role":"other","container":null}"#,
            "\n"
        )
    );
    assert_eq!(
        line(&unmap, &freed),
        concat!(
            r#"{"v":1,"ts":"2026-11-29T16:51:37.000000001Z","pid":100,"tid":101,"comm":"pt_data_worker","#,
            r#""event":"munmap","path":"/dev/shm/torch_1","fd":3,"size":8192,"offset":null,"ret":0,"#,
            r#""errno":null,"signal":null,"code":null,"addr":"0x7f0000000000","failure":false,"#,
            r#""object_size":4096,"object_bytes":8192,"inode":42,"dev":"0:27","#,
            r#""freed":["/dev/shm/torch_1","/dev/shm/torch_2"],"#,
            r#""mntns":4026531841,"cgroup_id":7,"role":"other","container":null}"#,
            "\n"
        )
    );

    let shmget = event(Body::Call(Call {
        syscall: Syscall::Shmget,
        fd: None,
        ret: 65538,
        args: [0x1234, 1 << 20, (libc::IPC_CREAT | 0o600) as u64, 0, 0, 0],
        file: None,
        path: None,
        path_truncated: false,
        relative_to_shm: false,
        dir_ino: None,
    }));
    assert_eq!(
        line(&shmget, &Annotation::default()),
        concat!(
            r#"{"v":1,"ts":"2026-11-29T16:51:37.000000001Z","pid":100,"tid":101,"comm":"pt_data_worker","#,
            r#""event":"shmget","path":null,"fd":null,"size":1048576,"offset":null,"ret":65538,"#,
            r#""errno":null,"signal":null,"code":null,"addr":null,"failure":false,"#,
            r#""flags":"IPC_CREAT|0o600","key":"0x1234","shmid":65538,"#,
            r#""mntns":4026531841,"cgroup_id":7,"role":"other","container":null}"#,
            "\n"
        )
    );
}

#[test]
fn signals_and_process_events_read_as_the_schema_says() {
    let bus = event(Body::Signal(Signal {
        signo: libc::SIGBUS,
        code: 2, // BUS_ADRERR
        errno: 0,
        result: 0,
        addr: 0x7f00_0000_1000,
        target_pid: 100,
        target_tid: 102,
        target_comm: "python3".to_owned(),
        target_maps_shm: false,
    }));
    let fault = Annotation {
        fault: Some(FaultSite {
            path: "/dev/shm/torch_1".to_owned(),
            inode: InodeId { dev: DEV, ino: 42 },
            file_offset: 4096,
            mapping_start: 0x7f00_0000_0000,
            mapping_len: 8192,
            file_size: 8192,
        }),
        ..Annotation::default()
    };
    assert_eq!(
        line(&bus, &fault),
        concat!(
            r#"{"v":1,"ts":"2026-11-29T16:51:37.000000001Z","pid":100,"tid":102,"comm":"python3","#,
            r#""event":"signal","path":"/dev/shm/torch_1","fd":null,"size":null,"offset":4096,"ret":null,"#,
            r#""errno":null,"signal":"SIGBUS","code":"BUS_ADRERR","addr":"0x7f0000001000","failure":true,"#,
            r#""object_size":8192,"inode":42,"dev":"0:27","mntns":4026531841,"cgroup_id":7,"role":"other","#,
            r#""container":null}"#,
            "\n"
        )
    );

    let kill = event(Body::Signal(Signal {
        signo: libc::SIGKILL,
        code: 0,
        errno: 0,
        result: 0,
        addr: 0,
        target_pid: 200,
        target_tid: 200,
        target_comm: "worker".to_owned(),
        target_maps_shm: false,
    }));
    let by_parent = Annotation {
        killed_by: Some(100),
        ..Annotation::default()
    };
    assert_eq!(
        line(&kill, &by_parent),
        concat!(
            r#"{"v":1,"ts":"2026-11-29T16:51:37.000000001Z","pid":200,"tid":200,"comm":"worker","#,
            r#""event":"signal","path":null,"fd":null,"size":null,"offset":null,"ret":null,"#,
            r#""errno":null,"signal":"SIGKILL","code":"SI_USER","addr":null,"failure":false,"#,
            r#""killed_by_pid":100,"target_pid":100,"mntns":4026531841,"cgroup_id":7,"role":"other","#,
            r#""container":null}"#,
            "\n"
        )
    );

    let common = concat!(
        r#""path":null,"fd":null,"size":null,"offset":null,"ret":null,"#,
        r#""errno":null,"signal":null,"code":null,"addr":null,"#
    );
    let head = r#"{"v":1,"ts":"2026-11-29T16:51:37.000000001Z","pid":100,"tid":101,"comm":"pt_data_worker","#;
    let tail = r#""mntns":4026531841,"cgroup_id":7,"role":"other","container":null}"#;
    let cases = [
        (
            Body::Fork { child_pid: 300 },
            format!(r#"{head}"event":"fork",{common}"failure":false,"child_pid":300,{tail}"#),
        ),
        (
            Body::Exec(Exec {
                filename: "/usr/bin/python3".to_owned(),
                argv: vec!["python3".to_owned(), "-c".to_owned(), String::new()],
                argv_truncated: false,
            }),
            format!(
                r#"{head}"event":"exec",{common}"failure":false,"filename":"/usr/bin/python3","argv":["python3","-c",""],{tail}"#
            ),
        ),
        (
            Body::Exit(ExitStatus::Code(1).into()),
            format!(
                r#"{head}"event":"exit",{common}"failure":true,"exit_code":1,"shm_death":false,{tail}"#
            ),
        ),
        (
            Body::Rename {
                pid: 100,
                tid: 103,
                comm: "pt_pin_memory".to_owned(),
            },
            format!(
                r#"{head}"event":"rename",{common}"failure":false,"target_pid":100,"target_tid":103,"new_comm":"pt_pin_memory",{tail}"#
            ),
        ),
        (
            Body::Oom { victim_pid: 104 },
            format!(r#"{head}"event":"oom_kill",{common}"failure":true,"victim_pid":104,{tail}"#),
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(line(&event(body), &Annotation::default()), expected + "\n");
    }

    // A death by a signal: `signal` is set among the fields every event has, and core_dumped
    // appears (also when false), as shm_death does.
    for core_dumped in [true, false] {
        let died = event(Body::Exit(Exit {
            status: ExitStatus::Signal {
                signo: libc::SIGBUS,
                core_dumped,
            },
            shm_death: core_dumped,
        }));
        let common = common.replace(r#""signal":null"#, r#""signal":"SIGBUS""#);
        assert_eq!(
            line(&died, &Annotation::default()),
            format!(
                r#"{head}"event":"exit",{common}"failure":true,"core_dumped":{core_dumped},"shm_death":{core_dumped},{tail}"#
            ) + "\n"
        );
    }
}

#[test]
fn an_event_in_a_container_carries_the_container() {
    let container = ContainerInfo {
        runtime: "docker".into(),
        id: "0123456789ab".into(),
        name: "trainer".into(),
        image: Some("pytorch:2.4".into()),
        shm_size: Some(64 << 20),
        ipc: "private".into(),
        ..ContainerInfo::default()
    };
    let fork = event(Body::Fork { child_pid: 300 });
    let text = line_with(
        &fork,
        &Annotation::default(),
        &Role::OTHER,
        Some(&container),
    );
    let tail = text
        .split_once(r#""role":"other","container":"#)
        .expect("the container comes last, after the role")
        .1;
    // Serde's own rendering of the container, so a field added to ContainerInfo is followed.
    assert_eq!(tail, serde_json::to_string(&container).unwrap() + "}\n");
    assert!(
        tail.starts_with(r#"{"runtime":"docker","id":"0123456789ab","name":"trainer","#),
        "{tail}"
    );
}

/// Names are chosen by whoever runs in the container. Whatever they hold, each event stays
/// one line of valid JSON that gives the name back exactly.
#[test]
fn hostile_names_stay_one_line_and_come_back_exact() {
    // Raw control characters, quotes, backslashes, DEL, a line separator, a bidirectional
    // override, non-ASCII and an emoji, as text that was never escaped.
    let raw = "q\"b\\s\u{1}\u{1f}\n\t\r\u{8}\u{c}\u{7f}\u{80}\u{2028}é\u{202e}😀";
    // And what the decoder makes of bytes that are not UTF-8 (escaped, so nothing is lost).
    let not_utf8 = escape::bytes(b"torch_\xff\xfe\"\n\x1b[31m");
    assert!(
        not_utf8.contains("\\xff") && not_utf8.contains("\\x1b"),
        "{not_utf8}"
    );
    for name in [raw, not_utf8.as_str(), ""] {
        let path = format!("/dev/shm/{name}");
        let container = ContainerInfo {
            name: name.to_owned(),
            ..ContainerInfo::default()
        };
        let mut note = named(&path);
        note.freed = vec![name.to_owned()];
        let mut open = event(call(Syscall::Openat, 3, [0; 6], Some(&path)));
        open.comm = name.to_owned();
        let exec = event(Body::Exec(Exec {
            filename: name.to_owned(),
            argv: vec![name.to_owned(), "x".to_owned()],
            argv_truncated: false,
        }));
        let rename = event(Body::Rename {
            pid: 1,
            tid: 1,
            comm: name.to_owned(),
        });
        for (event, note) in [
            (&open, &note),
            (&exec, &Annotation::default()),
            (&rename, &Annotation::default()),
        ] {
            let text = line_with(event, note, &Role::OTHER, Some(&container));
            let body = text.strip_suffix('\n').expect("a line ends with a newline");
            assert!(
                !body.bytes().any(|b| b < 0x20),
                "a control character left raw in {body:?}"
            );
            let parsed: Value = serde_json::from_str(body).unwrap();
            assert_eq!(parsed["container"]["name"], name);
            match &event.body {
                Body::Call(_) => {
                    assert_eq!(parsed["comm"], name);
                    assert_eq!(parsed["path"], path.as_str());
                    assert_eq!(parsed["freed"][0], name);
                }
                Body::Exec(_) => {
                    assert_eq!(parsed["filename"], name);
                    assert_eq!(parsed["argv"][0], name);
                }
                _ => assert_eq!(parsed["new_comm"], name),
            }
        }
    }
}

/// The escapes themselves are JSON's short ones where it has them, `\u00XX` for the other
/// control characters, and everything else (DEL, non-ASCII, line separators) left as it is.
#[test]
fn strings_are_escaped_as_json_requires_and_no_more() {
    let (fork, note) = (event(Body::Fork { child_pid: 1 }), Annotation::default());
    let mut flag_names = FlagNames::default();
    let mut record = to_json(&fork, &note, &Role::OTHER, None, TS, &mut flag_names).unwrap();
    let comm = "q\"b\\s\u{1}\u{1f}\n\t\r\u{8}\u{c}\u{7f}\u{2028}é😀";
    record.comm = comm;
    record.path = Some(Cow::Borrowed("\u{0}"));
    let text = serde_json::to_string(&record).unwrap();
    assert!(
        text.contains(r#""comm":"q\"b\\s\u0001\u001f\n\t\r\b\f"#),
        "{text}"
    );
    assert!(text.contains("\u{7f}\u{2028}é😀\""), "{text}");
    assert!(text.contains(r#""path":"\u0000""#), "{text}");
}
