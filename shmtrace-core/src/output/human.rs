//! One line per event, strace-like, readable at a glance:
//!
//! ```text
//! 16:51:37.123470  17387 pt_data_worker  fallocate(11</dev/shm/torch_17387_2578467999_0>, 0, 0, 96.0 MiB) = -1 ENOSPC (No space left on device)
//! ```
use std::io::{self, Write};

use anstyle::{AnsiColor, Style};

use crate::{clock::Clock, units::human};
use crate::{
    diagnose::Role,
    event::{
        Body, Call, Event, Exit, ExitStatus, Signal, Syscall,
        names::{self, errno_description, errno_name},
    },
    model::Annotation,
};

/// How much a line should stand out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Normal,
    /// A call that failed.
    Failure,
    /// A fatal signal or a death.
    Death,
    /// Lifecycle bookkeeping (fork, exec, rename): quieter.
    Quiet,
}

/// A formatted event, before colour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub time: String,
    pub pid: u32,
    pub comm: String,
    /// Short role tag (`trainer`, `worker 1`), empty when the process has none.
    pub role: String,
    pub text: String,
    pub severity: Severity,
}

/// Formats one event; `None` for events not worth a line (an `munmap` of other memory).
pub fn format(event: &Event, note: &Annotation, role: &Role, clock: &Clock) -> Option<Line> {
    if note.irrelevant {
        return None;
    }
    let (pid, comm, text, severity) = match &event.body {
        Body::Call(call) => {
            let expected = note.expected_error(call);
            let severity = if call.failed() && expected.is_none() {
                Severity::Failure
            } else {
                Severity::Normal
            };
            let mut text = format!("{} = {}", call_text(call, note), result_text(call));
            if let Some(why) = expected {
                text.push_str(&format!("  ({why}, not a failure)"));
            }
            if let Some(removal) = &note.name_removed {
                text.push_str(&format!(
                    "  (removed by pid {} {} {:.2} s before, while still held)",
                    removal.remover,
                    crate::event::escape::text(&removal.remover_comm),
                    event.ts_ns.saturating_sub(removal.ts_ns) as f64 / 1e9
                ));
            }
            for freed in &note.freed {
                text.push_str(&format!("  [freed {freed}]"));
            }
            (event.pid, event.comm.clone(), text, severity)
        }
        Body::Signal(signal) => {
            let mut text = signal_text(signal, note);
            if signal.target_pid != event.pid {
                text.push_str(&format!(" (sent by pid {} {})", event.pid, event.comm));
            }
            let severity = if event.is_failure() {
                Severity::Death
            } else {
                Severity::Normal
            };
            (
                signal.target_pid,
                signal.target_comm.clone(),
                text,
                severity,
            )
        }
        Body::Fork { child_pid } => (
            event.pid,
            event.comm.clone(),
            format!("fork() = {child_pid}"),
            Severity::Quiet,
        ),
        Body::Exec(exec) => {
            let argv: Vec<String> = exec.argv.iter().map(|a| format!("{a:?}")).collect();
            let more = if exec.argv_truncated { ", ..." } else { "" };
            (
                event.pid,
                event.comm.clone(),
                format!("execve({:?}, [{}{more}])", exec.filename, argv.join(", ")),
                Severity::Quiet,
            )
        }
        Body::Exit(Exit { status, .. }) => {
            let mut text = match status {
                ExitStatus::Code(code) => format!("+++ exited with {code} +++"),
                ExitStatus::Signal { signo, core_dumped } => format!(
                    "+++ killed by {}{} +++",
                    names::signal_name(*signo),
                    if *core_dumped { " (core dumped)" } else { "" }
                ),
            };
            for freed in &note.freed {
                text.push_str(&format!("  [freed {freed}]"));
            }
            match note.killed_by {
                Some(0) => text.push_str("  (a termination request, not a failure)"),
                Some(sender) => text.push_str(&format!("  (ended by pid {sender}, not a failure)")),
                None => {}
            }
            let severity = if status.success() {
                Severity::Quiet
            } else if note.killed_by.is_some() || note.uninvolved_exit {
                Severity::Normal
            } else {
                Severity::Death
            };
            (event.pid, event.comm.clone(), text, severity)
        }
        Body::Rename { pid, tid, comm } => {
            let who = if pid == tid {
                String::new()
            } else {
                format!(" thread {tid}")
            };
            (
                *pid,
                event.comm.clone(),
                format!("rename{who} -> {comm:?}"),
                Severity::Quiet,
            )
        }
        Body::Oom { victim_pid } => (
            *victim_pid,
            event.comm.clone(),
            "!!! chosen by the OOM killer (memory limit reached; tmpfs pages count against it) !!!"
                .to_string(),
            Severity::Death,
        ),
    };
    Some(Line {
        time: clock.time_of_day(event.ts_ns),
        pid,
        comm,
        role: role.tag(),
        text,
        severity,
    })
}

/// `fd</dev/shm/name>`, the way strace -y shows descriptors.
fn fd_text(fd: Option<i32>, note: &Annotation) -> String {
    let fd = fd
        .map(|fd| fd.to_string())
        .unwrap_or_else(|| "?".to_owned());
    match &note.object_path {
        Some(path) => format!("{fd}<{path}>"),
        None => fd,
    }
}

fn dirfd_text(dfd: u64) -> String {
    let dfd = dfd as i32;
    if dfd == libc::AT_FDCWD {
        "AT_FDCWD".to_owned()
    } else {
        dfd.to_string()
    }
}

fn path_text(call: &Call) -> String {
    let path = call.path.as_deref().unwrap_or("");
    let cut = if call.path_truncated { "..." } else { "" };
    format!("{path:?}{cut}")
}

fn addr_text(addr: u64) -> String {
    if addr == 0 {
        "NULL".to_owned()
    } else {
        format!("{addr:#x}")
    }
}

fn call_text(call: &Call, note: &Annotation) -> String {
    let a = &call.args;
    let name = call.syscall.name();
    let args = match call.syscall {
        Syscall::Openat => format!(
            "{}, {}, {}, 0{:o}",
            dirfd_text(a[0]),
            path_text(call),
            names::open_flags(a[2]),
            a[3]
        ),
        // Recorded as openat(AT_FDCWD, ...) would be; shown as strace shows it.
        Syscall::Open => format!(
            "{}, {}, 0{:o}",
            path_text(call),
            names::open_flags(a[2]),
            a[3]
        ),
        Syscall::Openat2 => format!(
            "{}, {}, {{flags={}, mode=0{:o}, resolve={:#x}}}",
            dirfd_text(a[0]),
            path_text(call),
            names::open_flags(a[2]),
            a[3],
            a[4]
        ),
        Syscall::Ftruncate => format!("{}, {}", fd_text(call.fd, note), human(a[1])),
        Syscall::Fallocate => format!(
            "{}, {}, {}, {}",
            fd_text(call.fd, note),
            names::fallocate_mode(a[1]),
            human(a[2]),
            human(a[3])
        ),
        Syscall::Write => format!("{}, {}", fd_text(call.fd, note), human(a[2])),
        Syscall::Mmap => format!(
            "{}, {}, {}, {}, {}, {}",
            addr_text(a[0]),
            human(a[1]),
            names::prot_flags(a[2]),
            names::map_flags(a[3]),
            fd_text(call.fd, note),
            a[5]
        ),
        Syscall::Munmap => {
            let what = note
                .object_path
                .as_ref()
                .map(|p| format!("<{p}>"))
                .unwrap_or_default();
            format!("{}{what}, {}", addr_text(a[0]), human(a[1]))
        }
        Syscall::Close => fd_text(call.fd, note),
        Syscall::Unlink => path_text(call),
        Syscall::Unlinkat => format!("{}, {}, {:#x}", dirfd_text(a[0]), path_text(call), a[2]),
        Syscall::MemfdCreate => format!("{}, {:#x}", path_text(call), a[1]),
        Syscall::Shmget => {
            let key = a[0] as i32;
            let key = if key == 0 {
                "IPC_PRIVATE".to_owned()
            } else {
                format!("{:#x}", key as u32)
            };
            format!("{key}, {}, {}", human(a[1]), names::shmget_flags(a[2]))
        }
        Syscall::Shmat => format!("{}, {}, {:#x}", a[0] as i32, addr_text(a[1]), a[2]),
        Syscall::Shmdt => addr_text(a[0]),
        Syscall::Recvmsg => format!("{}, {}", a[0] as i32, names::msg_flags(a[2])),
        Syscall::Shmctl => format!(
            "{}, {}, {}",
            a[0] as i32,
            names::shmctl_command(a[1]),
            addr_text(a[2])
        ),
        Syscall::Statfs => format!("{}, {}", path_text(call), space_text(call)),
        Syscall::Fstatfs => format!("{}, {}", fd_text(call.fd, note), space_text(call)),
    };
    format!("{name}({args})")
}

/// A `statfs` answer as strace shows its buffer, with the figures a program decides from.
fn space_text(call: &Call) -> String {
    match call.space_seen() {
        Some(seen) => format!(
            "{{size={}, free={}{}}}",
            human(seen.size),
            human(seen.free),
            if seen.tmpfs { "" } else { ", not a tmpfs" }
        ),
        None => addr_text(call.args[1]),
    }
}

fn result_text(call: &Call) -> String {
    if let Some(errno) = call.errno() {
        return format!("-1 {} ({})", errno_name(errno), errno_description(errno));
    }
    match call.syscall {
        Syscall::Mmap | Syscall::Shmat => format!("{:#x}", call.ret),
        Syscall::Recvmsg => format!(
            "{} [{}: the descriptors sent were dropped, out of file descriptors?]",
            call.ret,
            names::msg_flags(call.args[3])
        ),
        _ => call.ret.to_string(),
    }
}

fn signal_text(signal: &Signal, note: &Annotation) -> String {
    let mut fields = vec![format!(
        "si_code={}",
        names::si_code_name(signal.signo, signal.code)
    )];
    if signal.addr != 0 {
        let mut addr = format!("si_addr={:#x}", signal.addr);
        if let Some(site) = &note.fault {
            addr.push_str(&format!(
                " in {} at offset {}",
                site.path,
                human(site.file_offset)
            ));
            if site.file_size >= 0 {
                addr.push_str(&format!(" of {}", human(site.file_size as u64)));
            }
        }
        fields.push(addr);
    }
    format!(
        "--- {} {{{}}} ---",
        names::signal_name(signal.signo),
        fields.join(", ")
    )
}

/// Writes lines, in colour when asked to.
pub struct HumanWriter<W: Write> {
    out: W,
    color: bool,
}

impl<W: Write> HumanWriter<W> {
    pub fn new(out: W, color: bool) -> HumanWriter<W> {
        HumanWriter { out, color }
    }

    fn paint(&self, style: Style, text: &str) -> String {
        if self.color && style != Style::new() {
            format!("{style}{text}{style:#}")
        } else {
            text.to_owned()
        }
    }

    /// `place`: the container (or `host`) to show first, when containers are involved.
    pub fn line(&mut self, line: &Line, place: Option<&str>) -> io::Result<()> {
        let dim = Style::new().dimmed();
        let red = Style::new().fg_color(Some(AnsiColor::Red.into())).bold();
        let magenta = Style::new()
            .fg_color(Some(AnsiColor::Magenta.into()))
            .bold();
        let (pid_style, text_style) = match line.severity {
            Severity::Normal => (Style::new(), Style::new()),
            Severity::Quiet => (Style::new(), dim),
            Severity::Failure => (red, red),
            Severity::Death => (magenta, magenta),
        };
        let place = place
            .map(|p| format!("{} ", self.paint(Style::new().bold(), &format!("{p:<12}"))))
            .unwrap_or_default();
        let text = format!(
            "{}  {place}{} {:<15} {:<9} {}",
            self.paint(dim, &line.time),
            self.paint(pid_style, &format!("{:>7}", line.pid)),
            line.comm,
            self.paint(dim, &line.role),
            self.paint(text_style, &line.text)
        );
        writeln!(self.out, "{text}")
    }

    /// A message about the trace itself (lost events, the traced command exiting).
    pub fn notice(&mut self, text: &str) -> io::Result<()> {
        let style = Style::new().fg_color(Some(AnsiColor::Yellow.into()));
        let text = self.paint(style, &format!("shmtrace: {text}"));
        writeln!(self.out, "{text}")
    }

    pub fn plain(&mut self, text: &str) -> io::Result<()> {
        writeln!(self.out, "{text}")
    }

    pub fn diagnosis(&mut self, lines: &[String], shm_is_the_cause: bool) -> io::Result<()> {
        let title = Style::new().bold();
        let cause = if shm_is_the_cause {
            Style::new().fg_color(Some(AnsiColor::Red.into())).bold()
        } else {
            Style::new().fg_color(Some(AnsiColor::Yellow.into())).bold()
        };
        for (i, line) in lines.iter().enumerate() {
            let style = if i == 0 {
                title
            } else if line.trim_start().starts_with("cause") {
                cause
            } else {
                Style::new()
            };
            let text = self.paint(style, line);
            writeln!(self.out, "{text}")?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}
