//! `--record-dir`: the flight recorder, writing one file per incident into a directory kept
//! under a size quota (oldest recordings deleted first, each deletion counted and logged).
use std::{
    cell::RefCell,
    fs,
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    rc::Rc,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use serde_json::{Value, json};

use super::metrics::Metrics;
use shmtrace_core::{
    event,
    model::World,
    output::json::SCHEMA_VERSION,
    pipeline::Tap,
    record::{
        FlightOptions, FlightRecorder, Record, TargetDescription, TraceHeader, Trigger, Triggered,
        UserRecord,
    },
};

/// JSON lines waiting for the main loop to write them after the pipeline's output, so that
/// both share stdout a whole line at a time.
pub type Log = Rc<RefCell<Vec<Value>>>;

pub struct Incidents {
    /// Present until `finish`.
    recorder: Option<FlightRecorder>,
    dir: PathBuf,
    quota: u64,
    metrics: Metrics,
    log: Log,
    /// The file being written, which the quota must not delete.
    writing: Option<PathBuf>,
}

impl Incidents {
    pub fn open(
        dir: &Path,
        quota: u64,
        window: Duration,
        tail: Duration,
        metrics: Metrics,
        log: Log,
    ) -> Result<Incidents> {
        check_dir(dir)?;
        let mut header = TraceHeader::for_this_host(TargetDescription {
            command: None,
            pids: Vec::new(),
            host_wide: true,
            failed_only: false,
            containers: Vec::new(),
        })
        .context("describing this host for the recordings")?;
        header.host_mntns = crate::kernel_ids::mount_namespace(std::process::id());
        // A name per daemon start: recordings of earlier runs stay, and count in the quota.
        let stamp = jiff::Timestamp::now()
            .strftime("%Y%m%dT%H%M%SZ")
            .to_string();
        let base = dir.join(format!("incident-{stamp}-{}.shmtrace", std::process::id()));
        let options = FlightOptions {
            window,
            tail,
            ..FlightOptions::default()
        };
        let recorder = FlightRecorder::new(&base, header, options)
            .with_context(|| format!("starting the flight recorder in {}", dir.display()))?;
        let mut incidents = Incidents {
            recorder: Some(recorder),
            dir: dir.to_path_buf(),
            quota,
            metrics,
            log,
            writing: None,
        };
        incidents.enforce_quota();
        Ok(incidents)
    }

    fn recorder(&mut self) -> &mut FlightRecorder {
        self.recorder.as_mut().expect("present until finish")
    }

    fn closed(&mut self, path: Option<PathBuf>) {
        let Some(path) = path else { return };
        self.writing = None;
        let bytes = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        self.log.borrow_mut().push(json!({
            "v": SCHEMA_VERSION,
            "event": "recording",
            "path": path.to_string_lossy(),
            "bytes": bytes,
        }));
        self.metrics.recordings_written.inc();
        self.enforce_quota();
    }

    fn failed(&mut self, error: impl std::fmt::Display) {
        self.metrics.recording_errors.inc();
        self.log.borrow_mut().push(json!({
            "v": SCHEMA_VERSION,
            "event": "recording_error",
            "error": error.to_string(),
        }));
    }

    /// Deletes the oldest recordings until the rest fit in the quota.
    fn enforce_quota(&mut self) {
        let mut files = match recordings(&self.dir) {
            Ok(files) => files,
            Err(error) => return self.failed(format!("listing {}: {error}", self.dir.display())),
        };
        let mut total: u64 = files.iter().map(|f| f.bytes).sum();
        files.sort_by(|a, b| (a.modified, &a.path).cmp(&(b.modified, &b.path)));
        for file in files {
            if total <= self.quota {
                break;
            }
            if self.writing.as_deref() == Some(file.path.as_path()) {
                continue;
            }
            match fs::remove_file(&file.path) {
                Ok(()) => {
                    total -= file.bytes;
                    self.metrics.recordings_deleted.inc();
                    self.log.borrow_mut().push(json!({
                        "v": SCHEMA_VERSION,
                        "event": "recording_deleted",
                        "path": file.path.to_string_lossy(),
                        "bytes": file.bytes,
                        "reason": "over --record-quota",
                    }));
                }
                Err(error) => self.failed(format!("deleting {}: {error}", file.path.display())),
            }
        }
    }
}

impl Tap for Incidents {
    fn kernel(&mut self, bytes: &Bytes) -> Result<()> {
        let ts = event::timestamp(bytes).unwrap_or(0);
        match self.recorder().push(ts, Record::Kernel(bytes.clone())) {
            Ok(done) => self.closed(done),
            Err(error) => self.failed(error),
        }
        Ok(())
    }

    fn user(&mut self, ts_ns: u64, record: &UserRecord) -> Result<()> {
        match self.recorder().push(ts_ns, Record::User(record.clone())) {
            Ok(done) => self.closed(done),
            Err(error) => self.failed(error),
        }
        Ok(())
    }

    fn trigger(&mut self, ts_ns: u64, trigger: Trigger) -> Result<()> {
        let detail = trigger.detail.clone();
        let reason = trigger.reason.key();
        match self.recorder().trigger(ts_ns, trigger) {
            Ok(Triggered::Started(path)) => {
                self.log.borrow_mut().push(json!({
                    "v": SCHEMA_VERSION,
                    "event": "incident",
                    "reason": reason,
                    "detail": detail,
                    "path": path.to_string_lossy(),
                }));
                self.writing = Some(path);
            }
            Ok(Triggered::Extended(_)) => {}
            Err(error) => self.failed(error),
        }
        Ok(())
    }

    fn tick(&mut self, _: &World, now_ns: u64) -> Result<()> {
        match self.recorder().tick(now_ns) {
            Ok(done) => self.closed(done),
            Err(error) => self.failed(error),
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>, _: &World, _: u64) -> Result<Option<String>> {
        let recorder = self.recorder.take().expect("finished once");
        let dumps = recorder.stats().dumps;
        let last = recorder.finish()?;
        self.closed(last);
        Ok(Some(format!(
            "{dumps} incident recordings written this run"
        )))
    }
}

/// The directory must be root's and not writable by others: recordings are written there as
/// root, and nobody else may plant a symlink where one will be created.
fn check_dir(dir: &Path) -> Result<()> {
    if let Err(error) = fs::symlink_metadata(dir)
        && error.kind() == std::io::ErrorKind::NotFound
    {
        fs::DirBuilder::new()
            .recursive(true)
            .create(dir)
            .with_context(|| format!("cannot create --record-dir {}", dir.display()))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o750))
            .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
    }
    let meta = fs::symlink_metadata(dir)
        .with_context(|| format!("cannot read --record-dir {}", dir.display()))?;
    if meta.file_type().is_symlink() {
        bail!(
            "--record-dir {} is a symbolic link; give the directory it points to",
            dir.display()
        );
    }
    if !meta.is_dir() {
        bail!("--record-dir {} is not a directory", dir.display());
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 {
        bail!(
            "--record-dir {} must belong to the daemon's user and not be writable by group or \
             others (chown root {0}; chmod go-w {0})",
            dir.display()
        );
    }
    check_writable(dir)
}

/// Makes and removes a file in `dir`, so that a directory the daemon cannot write (a read-only
/// file system, a volume mounted read-only) is refused now, not at the first incident.
fn check_writable(dir: &Path) -> Result<()> {
    let probe = dir.join(format!(".shmtrace-write-check-{}", std::process::id()));
    let made = fs::File::options()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&probe);
    match made {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        Err(error) => bail!(
            "--record-dir {} is not writable ({error}): recordings could not be written there; \
             give a directory on a writable file system (in a container, a volume not mounted \
             read-only)",
            dir.display()
        ),
    }
}

struct Recording {
    path: PathBuf,
    bytes: u64,
    modified: i64,
}

/// The recordings in `dir` (regular files named `*.shmtrace`; symlinks are not ours).
fn recordings(dir: &Path) -> std::io::Result<Vec<Recording>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "shmtrace") {
            continue;
        }
        let meta = entry.metadata()?;
        if meta.file_type().is_file() {
            found.push(Recording {
                path,
                bytes: meta.len(),
                modified: meta.mtime(),
            });
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::symlink, time::SystemTime};

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("daemon-incidents-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn open(dir: &Path, quota: u64) -> Result<(Incidents, Metrics, Log)> {
        let (metrics, _) = Metrics::new();
        let log = Log::default();
        let incidents = Incidents::open(
            dir,
            quota,
            Duration::from_secs(1),
            Duration::from_secs(1),
            metrics.clone(),
            log.clone(),
        )?;
        Ok((incidents, metrics, log))
    }

    #[test]
    fn the_quota_deletes_the_oldest_recordings_and_says_so() {
        let dir = scratch("quota");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).unwrap();
        let day = Duration::from_secs(86_400);
        for (i, name) in ["old.shmtrace", "middle.shmtrace", "new.shmtrace"]
            .iter()
            .enumerate()
        {
            let path = dir.join(name);
            fs::write(&path, vec![0u8; 400]).unwrap();
            let file = fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(SystemTime::now() - day * (3 - i as u32))
                .unwrap();
        }
        // Not ours to delete: a symlink, and a file of another kind.
        symlink("/etc/hostname", dir.join("link.shmtrace")).unwrap();
        fs::write(dir.join("notes.txt"), vec![0u8; 4000]).unwrap();

        let (_incidents, metrics, log) = open(&dir, 1000).unwrap();
        assert!(!dir.join("old.shmtrace").exists());
        assert!(dir.join("middle.shmtrace").exists());
        assert!(dir.join("new.shmtrace").exists());
        assert!(fs::symlink_metadata(dir.join("link.shmtrace")).is_ok());
        assert!(dir.join("notes.txt").exists());
        assert_eq!(metrics.recordings_deleted.get(), 1);
        let lines = log.borrow();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["event"], "recording_deleted");
        assert!(lines[0]["path"].as_str().unwrap().ends_with("old.shmtrace"));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_record_dir_others_could_plant_symlinks_in_is_refused() {
        let dir = scratch("open");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let error = open(&dir, 1 << 20).err().unwrap().to_string();
        assert!(error.contains("chmod go-w"), "{error}");

        let link = scratch("link");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).unwrap();
        symlink(&dir, &link).unwrap();
        let error = open(&link, 1 << 20).err().unwrap().to_string();
        assert!(error.contains("symbolic link"), "{error}");
        let _ = fs::remove_file(&link);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_record_dir_is_made_private() {
        let dir = scratch("new").join("incidents");
        open(&dir, 1 << 20).unwrap();
        let mode = fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o750);
        let _ = fs::remove_dir_all(dir.parent().unwrap());
    }
}
