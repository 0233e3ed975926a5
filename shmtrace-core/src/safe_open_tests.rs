//! The rules of `safe_open`, on real files, as any user. The rule about another user's file
//! needs root to make one: it is tested in tests/tests/kernel_output_safety.rs.
use std::{fs, io::Write, os::unix::fs::symlink, path::PathBuf};

use super::*;

/// A fresh directory for one test, removed afterwards.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir =
            std::env::temp_dir().join(format!("harden-safe-open-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        Dir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn refuses_a_planted_symlink_and_leaves_its_target_alone() {
    let dir = Dir::new("symlink");
    let victim = dir.path("victim");
    fs::write(&victim, b"precious").unwrap();
    let out = dir.path("out");
    symlink(&victim, &out).unwrap();
    let error = create(&out, &OpenOptions::new()).unwrap_err();
    assert!(matches!(error, OpenError::Symlink { .. }), "{error}");
    assert!(error.to_string().contains("symbolic link"), "{error}");
    assert!(matches!(
        Replacement::new(&out, &OpenOptions::new()),
        Err(OpenError::Symlink { .. })
    ));
    // A dangling link too: O_CREAT through it would create the file it points to.
    let dangling = dir.path("dangling");
    symlink(dir.path("created-through-link"), &dangling).unwrap();
    assert!(matches!(
        create(&dangling, &OpenOptions::new()),
        Err(OpenError::Symlink { .. })
    ));
    assert!(!dir.path("created-through-link").exists());
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn refuses_hard_links_fifos_devices_and_directories() {
    let dir = Dir::new("kinds");
    let victim = dir.path("victim");
    fs::write(&victim, b"precious").unwrap();
    let link = dir.path("link");
    fs::hard_link(&victim, &link).unwrap();
    let error = create(&link, &OpenOptions::new()).unwrap_err();
    assert!(
        matches!(error, OpenError::HardLinked { links: 2, .. }),
        "{error}"
    );
    assert_eq!(fs::read(&victim).unwrap(), b"precious");

    let fifo = dir.path("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    // Must return at once (no reader), refusing the FIFO.
    let error = create(&fifo, &OpenOptions::new()).unwrap_err();
    assert!(
        matches!(error, OpenError::NotRegular { kind: "a FIFO", .. }),
        "{error}"
    );
    let error = create(Path::new("/dev/zero"), &OpenOptions::new()).unwrap_err();
    assert!(
        matches!(
            error,
            OpenError::NotRegular {
                kind: "a device",
                ..
            }
        ),
        "{error}"
    );
    let error = create(&dir.0, &OpenOptions::new()).unwrap_err();
    assert!(
        matches!(
            error,
            OpenError::NotRegular {
                kind: "a directory",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn refuses_the_input_under_any_name() {
    let dir = Dir::new("input");
    let input = dir.path("t.shmtrace");
    fs::write(&input, b"trace").unwrap();
    let id = FileId::of_path(&input).unwrap();
    let options = OpenOptions::new().not_over(&[id]);
    let error = create(&input, &options).unwrap_err();
    assert!(matches!(error, OpenError::IsInput { .. }), "{error}");
    let link = dir.path("other-name");
    fs::hard_link(&input, &link).unwrap();
    let error = create(&link, &options).unwrap_err();
    assert!(matches!(error, OpenError::IsInput { .. }), "{error}");
    assert!(matches!(
        Replacement::new(&link, &options),
        Err(OpenError::IsInput { .. })
    ));
    assert_eq!(fs::read(&input).unwrap(), b"trace");
}

#[test]
fn a_locked_file_is_refused_and_not_truncated() {
    let dir = Dir::new("lock");
    let out = dir.path("t.shmtrace");
    let mut first = create(&out, &OpenOptions::new().locked()).unwrap();
    first.write_all(b"first recorder").unwrap();
    let error = create(&out, &OpenOptions::new().locked()).unwrap_err();
    assert!(matches!(error, OpenError::Locked { .. }), "{error}");
    assert_eq!(fs::read(&out).unwrap(), b"first recorder");
    drop(first);
    create(&out, &OpenOptions::new().locked()).unwrap();
    assert_eq!(fs::read(&out).unwrap(), b"");
}

#[test]
fn create_new_refuses_what_exists() {
    let dir = Dir::new("new");
    let out = dir.path("t.000001.shmtrace");
    create(&out, &OpenOptions::new().create_new()).unwrap();
    let error = create(&out, &OpenOptions::new().create_new()).unwrap_err();
    assert!(matches!(error, OpenError::Exists { .. }), "{error}");
    let missing = dir.path("no-such-dir/t");
    let error = create(&missing, &OpenOptions::new()).unwrap_err();
    assert!(
        matches!(&error, OpenError::Io { error: source, .. } if source.kind() == io::ErrorKind::NotFound),
        "{error}"
    );
}

#[test]
fn a_replacement_appears_whole_or_not_at_all() {
    let dir = Dir::new("replace");
    let out = dir.path("report.html");
    fs::write(&out, b"old").unwrap();
    let mut replacement = Replacement::new(&out, &OpenOptions::new()).unwrap();
    replacement.file().write_all(b"new").unwrap();
    assert_eq!(fs::read(&out).unwrap(), b"old");
    replacement.commit().unwrap();
    assert_eq!(fs::read(&out).unwrap(), b"new");

    let abandoned = Replacement::new(&out, &OpenOptions::new()).unwrap();
    drop(abandoned);
    assert_eq!(
        fs::read_dir(&dir.0).unwrap().count(),
        1,
        "no temporary file left"
    );

    // A link planted after the check is replaced by the rename, never written through.
    let victim = dir.path("victim");
    fs::write(&victim, b"precious").unwrap();
    let late = dir.path("late.html");
    let mut replacement = Replacement::new(&late, &OpenOptions::new()).unwrap();
    replacement.file().write_all(b"report").unwrap();
    symlink(&victim, &late).unwrap();
    assert!(matches!(
        replacement.commit(),
        Err(OpenError::Symlink { .. })
    ));
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn standard_streams_are_not_truncated_or_checked() {
    assert!(is_stdio(Path::new("-")));
    assert!(is_stdio(Path::new("/dev/stdout")));
    assert!(is_stdio(Path::new("/dev/fd/2")));
    assert!(!is_stdio(Path::new("/dev/stdoutx")));
    create(Path::new("/dev/stderr"), &OpenOptions::new()).unwrap();
}

#[test]
fn dev_null_discards() {
    use std::io::Write;
    let mut null = create(Path::new("/dev/null"), &OpenOptions::new()).unwrap();
    null.write_all(b"thrown away").unwrap();
}
