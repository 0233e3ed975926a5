//! `shmtrace report` and `shmtrace show`: a recorded trace, through the same pipeline as a
//! live one.
use std::{path::Path, process::ExitCode, time::Duration};

use anyhow::{Context, Result, bail};

use super::{DefaultStream, open_output_not_over};
use crate::cli::{ReportArgs, ShowArgs};
use shmtrace_core::{
    diagnose::Diagnoser,
    event::escape,
    model::World,
    output::filter::{Filter, event_names},
    pipeline::{Pipeline, Recorded},
    record::{self, Record, TraceHeader, TraceSet, WriterOptions},
    report::{About, Pictures},
};

pub fn report(args: &ReportArgs) -> Result<ExitCode> {
    if args.redact {
        let out = args.output.as_deref().context("--redact needs -o FILE")?;
        return redact(&args.file, out);
    }
    let set = open(&args.file)?;
    let header = set.header().clone();
    let inputs = set.file_ids().to_vec();
    let output = open_output_not_over(
        args.output.as_deref(),
        args.json,
        args.color,
        DefaultStream::Stdout,
        header.clock(),
        &inputs,
    )?;
    let mut pipeline =
        Pipeline::new(World::new(), diagnoser(&header), output, Filter::default()).diagnoses_only();
    if args.html.is_some() || args.perfetto.is_some() {
        let about = About {
            description: describe(&header),
            clock: header.clock(),
            tool_version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        let mut pictures = Pictures::new(
            about,
            args.html.as_deref(),
            args.perfetto.as_deref(),
            &inputs,
        )?;
        if args.show_all {
            pictures = pictures.show_all();
        }
        pipeline = pipeline.with_observer(Box::new(pictures));
    }
    pipeline.notice(&describe(&header))?;
    replay(set, &mut pipeline)
}

pub fn show(args: &ShowArgs) -> Result<ExitCode> {
    check_event_names(&args.event)?;
    let set = open(&args.file)?;
    let header = set.header().clone();
    let filter = Filter {
        failed_only: args.failed,
        pids: args.pid.clone(),
        roles: args.role.clone(),
        events: args.event.clone(),
        places: args.container.clone(),
        since_ns: args
            .since
            .as_deref()
            .map(|t| boot_time(&header, t))
            .transpose()?,
        until_ns: args
            .until
            .as_deref()
            .map(|t| boot_time(&header, t))
            .transpose()?,
    };
    let mut output = open_output_not_over(
        args.output.output.as_deref(),
        args.output.json,
        args.output.color,
        DefaultStream::Stdout,
        header.clock(),
        set.file_ids(),
    )?;
    if args.output.show_all {
        output.show_all();
    }
    let mut pipeline = Pipeline::new(World::new(), diagnoser(&header), output, filter);
    pipeline.notice(&describe(&header))?;
    replay(set, &mut pipeline)
}

/// `show --event` names kinds of events: a misspelt one would silently show nothing.
fn check_event_names(wanted: &[String]) -> Result<()> {
    let valid = event_names();
    for name in wanted {
        if !valid.contains(&name.as_str()) {
            bail!(
                "--event {}: no such kind of event; the kinds are {}",
                escape::text(name),
                valid.join(", ")
            );
        }
    }
    Ok(())
}

pub fn open(path: &Path) -> Result<TraceSet> {
    TraceSet::open(path).map_err(|error| anyhow::anyhow!("{error}"))
}

pub fn diagnoser(header: &TraceHeader) -> Diagnoser {
    Diagnoser::new(header.host_mntns.unwrap_or(0))
}

/// `trace of python train.py on gpu-01 (Linux 6.8.0), recorded 2026-11-29 16:51:37 UTC`.
pub fn describe(header: &TraceHeader) -> String {
    let what = match (&header.target.command, header.target.host_wide) {
        (Some(argv), _) => argv
            .iter()
            .map(|arg| escape::stored(arg))
            .collect::<Vec<_>>()
            .join(" "),
        (None, true) => "every process".to_owned(),
        (None, false) if !header.target.pids.is_empty() => format!(
            "pid {}",
            header
                .target
                .pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ if !header.target.containers.is_empty() => header
            .target
            .containers
            .iter()
            .map(|c| {
                let name = c
                    .name
                    .clone()
                    .unwrap_or_else(|| c.id.chars().take(12).collect());
                format!("container {}", escape::text(&name))
            })
            .collect::<Vec<_>>()
            .join(", "),
        // `record --container` learns its containers after the header is written: their
        // records in the trace name them.
        _ => "containers".to_owned(),
    };
    // Every string of the header comes from the file, which may come from a stranger.
    let host = escape::text(header.hostname.as_deref().unwrap_or("?"));
    let start = header.clock().rfc3339(header.start_boot_ns);
    let mut text = format!(
        "trace of {what} on {host} (Linux {}), recorded {start}",
        escape::text(&header.kernel_release)
    );
    if header.source.as_deref() == Some("ptrace") {
        text.push_str(", with ptrace (unprivileged)");
    }
    if header.redacted {
        text.push_str(", redacted");
    }
    if let Some(flight) = &header.flight {
        text.push_str(&format!(
            ", flight recorder file after: {}",
            escape::text(&flight.reason)
        ));
    }
    text
}

/// Runs every record through the pipeline. A file that ends early (a recorder that was
/// killed) is reported and what came before is used; a corrupt one is an error, after the
/// report of what came before it.
pub fn replay(mut set: TraceSet, pipeline: &mut Pipeline) -> Result<ExitCode> {
    let mut first_ts = None;
    let mut last_ts = 0;
    let mut failure = None;
    let mut truncated = false;
    let clock = set.header().clock();
    for entry in set.by_ref() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) if error.is_truncation() => {
                // The error already says the recorder was probably killed, and that
                // everything before it was read.
                pipeline.notice(&error.to_string())?;
                truncated = true;
                break;
            }
            Err(error) => {
                failure = Some(error);
                break;
            }
        };
        first_ts.get_or_insert(entry.ts_ns);
        last_ts = last_ts.max(entry.ts_ns);
        match &entry.record {
            Record::Kernel(bytes) => {
                pipeline.kernel_record(bytes, &mut Recorded)?;
            }
            Record::User(user) => pipeline.user_record(entry.ts_ns, user)?,
        }
    }
    if truncated || failure.is_some() || !set.closed() {
        pipeline.trace_was_cut();
    }
    if !truncated && failure.is_none() && !set.closed() {
        pipeline.notice(&format!(
            "the trace ends early, at {}, without the end mark of a finished recording: the \
             recorder was killed or the machine stopped; everything it had written was read \
             (it writes at least every 100 ms)",
            clock.rfc3339(last_ts)
        ))?;
    }
    for gap in set.gaps() {
        pipeline.notice(gap)?;
    }
    if set.skipped() > 0 {
        pipeline.notice(&format!(
            "{} records of kinds this version does not know (written by a newer shmtrace) \
             were skipped",
            set.skipped()
        ))?;
    }
    // A flight recording starts with context from long before its window (the snapshots of
    // processes older than it): its own time is the window and the tail.
    let start = match &set.header().flight {
        Some(flight) => first_ts.map(|first| first.max(flight.window_start_ns)),
        None => first_ts,
    };
    let seconds = last_ts.saturating_sub(start.unwrap_or(last_ts)) as f64 / 1e9;
    pipeline.finish(seconds, last_ts)?;
    match failure {
        Some(error) => bail!("{error}; the report above covers the records before it"),
        None => Ok(ExitCode::SUCCESS),
    }
}

fn redact(input: &Path, output: &Path) -> Result<ExitCode> {
    let stats = record::redact_file(input, output, WriterOptions::default())?;
    eprintln!(
        "shmtrace: wrote {}: {} records, with host names, container ids, images, command \
         lines and paths outside /dev/shm replaced by pseudonyms",
        output.display(),
        stats.records
    );
    if stats.kernel_dropped > 0 {
        eprintln!(
            "shmtrace: {} kernel records could not be decoded, so could not be checked, and \
             were left out",
            stats.kernel_dropped
        );
    }
    if let Some(error) = stats.input_error {
        eprintln!("shmtrace: the input ended badly: {error}; the records before it were kept");
    }
    if stats.input_cut_short {
        eprintln!(
            "shmtrace: the input recording was cut short (no end mark); the copy says so too"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `12.5` (seconds after the start) or an RFC 3339 time, as boot-time nanoseconds.
fn boot_time(header: &TraceHeader, text: &str) -> Result<u64> {
    if let Ok(seconds) = text.trim_end_matches('s').parse::<f64>() {
        if seconds.is_nan() || seconds < 0.0 {
            bail!(
                "{}: a time after the start of the trace is a number of seconds, 0 or more",
                escape::text(text)
            );
        }
        // A float cast saturates silently: 1e30 or inf would become "the end of time".
        let after = Duration::try_from_secs_f64(seconds)
            .ok()
            .and_then(|d| u64::try_from(d.as_nanos()).ok())
            .and_then(|ns| header.start_boot_ns.checked_add(ns))
            .with_context(|| {
                format!(
                    "{}: too far after the start of the trace (give seconds, e.g. 12.5)",
                    escape::text(text)
                )
            })?;
        return Ok(after);
    }
    let time: jiff::Timestamp = text.parse().with_context(|| {
        format!(
            "{} is neither seconds after the start (12.5) nor a time (2026-11-29T16:51:37Z)",
            escape::text(text)
        )
    })?;
    let boot = time.as_nanosecond() - i128::from(header.unix_minus_boot_ns);
    Ok(boot.clamp(0, i128::from(u64::MAX)) as u64)
}
