//! `shmtrace record`: live tracing into a trace file, or, with `--on-failure`, into an
//! in-memory window written out when something fails.
use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result};
use bytes::Bytes;

use super::{
    DefaultStream, init_logging, open_output,
    trace::{exit_code, host_diagnoser},
};
use crate::{
    cli::RecordArgs,
    live::{
        launch::{self, What},
        source::Backend,
    },
};
use shmtrace_core::{
    clock::Clock,
    event,
    model::World,
    output::filter::Filter,
    pipeline::{Pipeline, Tap},
    record::{
        ContainerDescription, FlightOptions, FlightRecorder, Record, Rotation, TargetDescription,
        TraceHeader, TraceWriter, Trigger, Triggered, UserRecord, WriterOptions, world_snapshots,
    },
    units::count,
};

pub fn run(args: &RecordArgs) -> Result<ExitCode> {
    init_logging(args.verbose);
    let what = What::from_args(&args.target)?;
    let options = launch::options(&what, &args.target);
    let target = what.describe(args.target.failed);
    let default = if what.is_command() {
        DefaultStream::Stderr
    } else {
        DefaultStream::Stdout
    };
    // The file is created once the containers are found, so that its header lists them.
    let make_pipeline = |launched: &launch::Launched<'_>| -> Result<Pipeline> {
        let mut target = target;
        target.containers = launched
            .containers
            .iter()
            .map(ContainerDescription::from)
            .collect();
        let tap = open_tap(args, target, launched.backend)?;
        let output = open_output(None, args.json, args.color, default, Clock::now()?)?;
        Ok(
            Pipeline::new(World::new(), host_diagnoser(), output, Filter::default())
                .diagnoses_only()
                .with_tap(tap),
        )
    };
    let outcome = launch::run(what, &options, make_pipeline)?;
    Ok(exit_code(&outcome))
}

/// The trace file (or the flight recorder that writes them), with its header.
fn open_tap(
    args: &RecordArgs,
    target: TargetDescription,
    backend: Backend,
) -> Result<Box<dyn Tap>> {
    let mut header = TraceHeader::for_this_host(target)?;
    header.host_mntns = crate::kernel_ids::mount_namespace(std::process::id());
    header.source = Some(backend.name().to_owned());
    let writer_options = WriterOptions {
        compression: args.compress.then_some(3),
        rotation: args.max_size.map(|max_size| Rotation {
            max_size,
            keep: args.keep,
        }),
        ..WriterOptions::default()
    };
    if args.on_failure {
        let flight = FlightOptions {
            window: seconds(args.window, "--window")?,
            tail: seconds(args.tail, "--tail")?,
            writer: writer_options,
            ..FlightOptions::default()
        };
        eprintln!(
            "shmtrace: flight recorder on: keeping the last {}s; a failure writes {}",
            args.window,
            args.output.display()
        );
        Ok(Box::new(FlightTap(FlightRecorder::new(
            &args.output,
            header,
            flight,
        )?)))
    } else {
        let writer = TraceWriter::create(&args.output, header, writer_options)?;
        eprintln!("shmtrace: recording to {}", writer.path().display());
        Ok(Box::new(FileTap {
            writer: Some(writer),
            warned: false,
        }))
    }
}

fn seconds(value: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("{flag} must be a positive number of seconds, not {value}"))
}

/// Every record, into a file (or a rotated set).
struct FileTap {
    writer: Option<TraceWriter>,
    /// A write error was shown once; later ones are only counted.
    warned: bool,
}

impl FileTap {
    fn writer(&mut self) -> &mut TraceWriter {
        self.writer.as_mut().expect("present until finish")
    }

    /// Write errors do not stop tracing: the writer counts what it could not write, and the
    /// user hears about it now and in the end.
    fn report(&mut self, result: Result<(), shmtrace_core::record::WriteError>) {
        if let Err(error) = result
            && !self.warned
        {
            self.warned = true;
            eprintln!("shmtrace: warning: {error}; records that cannot be written are counted");
        }
    }
}

impl Tap for FileTap {
    fn kernel(&mut self, bytes: &Bytes) -> Result<()> {
        let result = self.writer().write_kernel(bytes);
        self.report(result);
        Ok(())
    }

    fn user(&mut self, ts_ns: u64, record: &UserRecord) -> Result<()> {
        let result = self.writer().write_user(ts_ns, record);
        self.report(result);
        Ok(())
    }

    fn trigger(&mut self, ts_ns: u64, trigger: Trigger) -> Result<()> {
        self.user(ts_ns, &UserRecord::Trigger(trigger))
    }

    fn tick(&mut self, world: &World, now_ns: u64) -> Result<()> {
        let writer = self.writer();
        let result = writer
            .flush_if_due(std::time::Instant::now(), &mut || {
                world_snapshots(world, now_ns)
            })
            .map(|flushed| {
                for path in flushed.rotated_to {
                    eprintln!("shmtrace: continuing in {}", path.display());
                }
            });
        self.report(result);
        Ok(())
    }

    fn finish(mut self: Box<Self>, world: &World, now_ns: u64) -> Result<Option<String>> {
        let writer = self.writer.take().expect("finished once");
        // The last flush may rotate further: name the file written last, not the current one.
        // A failure here (a full disk) still gets the summary: what was written is kept.
        let (stats, unfinished) = writer.finish_anyway(&mut || world_snapshots(world, now_ns));
        let mut message = format!(
            "wrote {}: {} records, {} bytes in {}",
            stats.last_path.display(),
            stats.records,
            stats.bytes,
            count(stats.files, "file")
        );
        if stats.files_removed > 0 {
            message.push_str(&format!(
                " ({} removed by --keep)",
                count(stats.files_removed, "older file")
            ));
        }
        if let Some(stopped) = &stats.stopped {
            message.push_str(&format!(
                "; writing first failed at byte {} of {} ({}); everything before it reads back",
                stopped.offset,
                stopped.path.display(),
                stopped.reason
            ));
        }
        if unfinished.is_some() {
            message.push_str("; the file could not be finished, so it has no end mark");
        }
        if stats.records_dropped > 0 {
            message.push_str(&format!(
                "; {} records could not be written",
                stats.records_dropped
            ));
        }
        Ok(Some(message))
    }
}

/// `--on-failure`: a window in memory, written out around failures.
struct FlightTap(FlightRecorder);

impl FlightTap {
    fn finished(dump: Option<PathBuf>) {
        if let Some(path) = dump {
            eprintln!("shmtrace: wrote {}", path.display());
        }
    }
}

impl Tap for FlightTap {
    fn kernel(&mut self, bytes: &Bytes) -> Result<()> {
        let ts = event::timestamp(bytes).unwrap_or(0);
        Self::finished(self.0.push(ts, Record::Kernel(bytes.clone()))?);
        Ok(())
    }

    fn user(&mut self, ts_ns: u64, record: &UserRecord) -> Result<()> {
        Self::finished(self.0.push(ts_ns, Record::User(record.clone()))?);
        Ok(())
    }

    fn trigger(&mut self, ts_ns: u64, trigger: Trigger) -> Result<()> {
        let detail = trigger.detail.clone();
        if let Triggered::Started(path) = self.0.trigger(ts_ns, trigger)? {
            eprintln!(
                "shmtrace: {detail}: writing the moments before it to {}",
                path.display()
            );
        }
        Ok(())
    }

    fn tick(&mut self, _: &World, now_ns: u64) -> Result<()> {
        Self::finished(self.0.tick(now_ns)?);
        Ok(())
    }

    fn finish(self: Box<Self>, _: &World, _: u64) -> Result<Option<String>> {
        let dumps = self.0.stats().dumps;
        let last = self.0.finish()?;
        Self::finished(last);
        Ok(Some(match dumps {
            0 => "flight recorder: nothing failed, so no file was written".to_owned(),
            n => format!("flight recorder: {} written", count(n, "failure file")),
        }))
    }
}
