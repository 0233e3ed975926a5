//! The shmtrace binary as a child process of a test. Every run is watched for the BPF objects
//! it holds, and checked to leave none behind when it ends (see [`crate::bpf_objects`]): a test
//! that starts shmtrace gets the leak check without asking for it.
use std::{
    ffi::OsStr,
    fmt,
    ops::{Deref, DerefMut},
    os::unix::process::CommandExt,
    process::{Child, Command, ExitStatus, Output, Stdio},
};

use crate::{
    bpf_objects::{Object, OwnBpfObjects},
    watchdog::Watchdog,
};

/// A `Command` that runs shmtrace (directly, or through a wrapper that execs it in the same
/// process, such as `unshare ... sh -c 'exec "$@"'`). Its builder methods are those of
/// `Command`; `output`, `status` and `spawn` add the leak check.
pub struct ShmtraceCommand {
    command: Command,
    /// Whether the test chose stdin; `output` makes it empty otherwise, as `Command` does.
    stdin_chosen: bool,
}

impl ShmtraceCommand {
    /// Wraps a command that ends up running shmtrace in the process it starts.
    pub fn from_command(command: Command) -> ShmtraceCommand {
        ShmtraceCommand {
            command,
            stdin_chosen: false,
        }
    }

    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        self.command.arg(arg);
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command.args(args);
        self
    }

    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        self.command.envs(vars);
        self
    }

    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.command.env(key, value);
        self
    }

    pub fn current_dir(&mut self, dir: impl AsRef<std::path::Path>) -> &mut Self {
        self.command.current_dir(dir);
        self
    }

    pub fn stdin(&mut self, cfg: impl Into<Stdio>) -> &mut Self {
        self.command.stdin(cfg);
        self.stdin_chosen = true;
        self
    }

    pub fn stdout(&mut self, cfg: impl Into<Stdio>) -> &mut Self {
        self.command.stdout(cfg);
        self
    }

    pub fn stderr(&mut self, cfg: impl Into<Stdio>) -> &mut Self {
        self.command.stderr(cfg);
        self
    }

    pub fn uid(&mut self, id: u32) -> &mut Self {
        self.command.uid(id);
        self
    }

    pub fn gid(&mut self, id: u32) -> &mut Self {
        self.command.gid(id);
        self
    }

    pub fn process_group(&mut self, pgroup: i32) -> &mut Self {
        self.command.process_group(pgroup);
        self
    }

    /// Starts shmtrace and its watcher.
    pub fn spawn(&mut self) -> std::io::Result<ShmtraceChild> {
        let child = self.command.spawn()?;
        let objects = OwnBpfObjects::watch(child.id());
        let watchdog = Watchdog::arm(child.id(), format!("{:?}", self.command));
        Ok(ShmtraceChild {
            child,
            objects: Some(objects),
            _watchdog: watchdog,
        })
    }

    /// Like `Command::output` (stdin empty unless chosen, stdout and stderr captured), then
    /// the leak check.
    pub fn output(&mut self) -> std::io::Result<Output> {
        if !self.stdin_chosen {
            self.command.stdin(Stdio::null());
        }
        self.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = self.spawn()?;
        let output = read_to_end_and_wait(&mut child.child)?;
        child.assert_released();
        Ok(output)
    }

    /// Like `Command::status`, then the leak check.
    pub fn status(&mut self) -> std::io::Result<ExitStatus> {
        let mut child = self.spawn()?;
        let status = child.wait()?;
        child.assert_released();
        Ok(status)
    }
}

impl fmt::Debug for ShmtraceCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.command.fmt(f)
    }
}

/// A running shmtrace. It derefs to its `Child`; when it drops, shmtrace is killed if still
/// running, reaped, and its BPF objects checked to be gone. One that runs past
/// [`crate::watchdog::LIMIT`] is killed.
pub struct ShmtraceChild {
    child: Child,
    objects: Option<OwnBpfObjects>,
    /// Kills a shmtrace that never ends, so a test fails instead of hanging the suite.
    _watchdog: Watchdog,
}

impl ShmtraceChild {
    /// What it holds now, and everything it was seen holding before.
    pub fn bpf_objects(&self) -> std::collections::BTreeSet<Object> {
        self.objects
            .as_ref()
            .map(OwnBpfObjects::snapshot)
            .unwrap_or_default()
    }

    /// Reaps shmtrace (killing it first if it still runs), then checks that its BPF objects
    /// are gone; returns them.
    pub fn assert_released(&mut self) -> std::collections::BTreeSet<Object> {
        self.reap();
        self.objects
            .take()
            .map(OwnBpfObjects::assert_released)
            .unwrap_or_default()
    }

    /// [`assert_released`](Self::assert_released), waiting at most `limit` for the kernel.
    pub fn assert_released_within(
        &mut self,
        limit: std::time::Duration,
    ) -> std::collections::BTreeSet<Object> {
        self.reap();
        self.objects
            .take()
            .map(|objects| objects.assert_released_within(limit))
            .unwrap_or_default()
    }

    fn reap(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// `Child::wait_with_output`, without consuming the `Child` (the guard still needs it).
fn read_to_end_and_wait(child: &mut Child) -> std::io::Result<Output> {
    use std::io::Read;
    let stderr_pipe = child.stderr.take();
    // Read stderr on a thread, so that neither pipe can fill up while the other is read.
    let stderr = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = stderr_pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    });
    let mut stdout = Vec::new();
    if let Some(mut pipe) = child.stdout.take() {
        pipe.read_to_end(&mut stdout)?;
    }
    let stderr = stderr.join().expect("the stderr reader");
    let status = child.wait()?;
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

impl Deref for ShmtraceChild {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for ShmtraceChild {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for ShmtraceChild {
    fn drop(&mut self) {
        self.reap();
        // Dropping the guard checks the objects, unless the test is already failing.
        self.objects.take();
    }
}
