//! The account printed when tracing stops: totals, a table per place and role, what is left
//! in /dev/shm, and the size to set when something failed for lack of it.
use serde_json::{Value, json};

use super::json::SCHEMA_VERSION;
use crate::{
    diagnose::{Diagnosis, Recommendation, RoleKind, RoleStats},
    event::LostCounts,
    model::{ObjectState, World},
    units::{count, human},
};

/// An object still present when tracing stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remaining {
    pub name: String,
    /// Memory it holds: pages, not its nominal size (a file sized by `ftruncate` and never
    /// written holds nothing).
    pub bytes: u64,
    /// Its size (`i_size`).
    pub size: u64,
    /// Still named in /dev/shm.
    pub linked: bool,
}

/// The size advised for one /dev/shm.
#[derive(Clone, Debug)]
pub struct Advice {
    /// The places (containers) whose failures asked for it, comma-separated.
    pub place: String,
    pub pid: u32,
    pub recommendation: Recommendation,
    /// The container whose /dev/shm it is, when the ones that failed joined it.
    pub owner: Option<String>,
    /// The /dev/shm file system, when known.
    dev: Option<u32>,
    /// When the first failure of `pid` happened: the earliest of those on this /dev/shm.
    first_ns: u64,
}

/// Totals of a trace, taken when tracing stops.
#[derive(Clone, Debug)]
pub struct Summary {
    pub seconds: f64,
    pub events: u64,
    pub failed_calls: u64,
    pub lost: LostCounts,
    pub processes: u64,
    pub deaths_by_signal: u64,
    pub objects_created: u64,
    pub objects_freed: u64,
    pub peak_bytes: u64,
    /// Objects still present, those holding the most memory first.
    pub remaining: Vec<Remaining>,
    /// The trace stops before its end (a recording cut short or damaged): `remaining` is what
    /// was held where it stops, as calls after that are not in it.
    pub cut: bool,
    /// Per place and role.
    pub table: Vec<(String, RoleKind, RoleStats)>,
    /// The largest size recommended per /dev/shm (one shared by several containers is one),
    /// with the pid it was diagnosed for.
    pub recommendations: Vec<Advice>,
}

impl Summary {
    pub fn new(
        world: &World,
        lost: LostCounts,
        seconds: f64,
        table: Vec<(String, RoleKind, RoleStats)>,
        diagnoses: &[Diagnosis],
    ) -> Summary {
        let totals = world.totals();
        let mut remaining: Vec<Remaining> = world
            .live_objects()
            .map(|o| Remaining {
                name: o.display_name(),
                bytes: o.held(),
                size: o.size.max(0) as u64,
                linked: o.state() == ObjectState::Linked,
            })
            .collect();
        remaining.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
        let mut recommendations: Vec<Advice> = Vec::new();
        for d in diagnoses {
            let Some(r) = &d.recommendation else { continue };
            let dev = d.failures.first().and_then(|f| f.dev);
            let owner = d.others.as_ref().and_then(|o| o.owner.clone());
            // One /dev/shm, however many containers share it and fail in it.
            match recommendations
                .iter_mut()
                .find(|a| a.place == d.place || (dev.is_some() && a.dev == dev))
            {
                Some(existing) => {
                    if !existing.place.split(", ").any(|p| p == d.place) {
                        existing.place = format!("{}, {}", existing.place, d.place);
                    }
                    if existing.recommendation.min_bytes < r.min_bytes {
                        existing.recommendation = r.clone();
                    }
                    // The diagnosis to read is that of the failure that came first, as the
                    // trainer's says.
                    let first = super::group::first_failure_ns(d);
                    if first < existing.first_ns {
                        existing.pid = d.pid;
                        existing.first_ns = first;
                    }
                    existing.owner = existing.owner.take().or(owner);
                }
                None => recommendations.push(Advice {
                    place: d.place.clone(),
                    pid: d.pid,
                    recommendation: r.clone(),
                    owner,
                    dev,
                    first_ns: super::group::first_failure_ns(d),
                }),
            }
        }
        Summary {
            seconds,
            events: totals.events,
            failed_calls: totals.failed_calls,
            lost,
            processes: totals.processes_seen,
            deaths_by_signal: totals.deaths_by_signal,
            objects_created: totals.objects_created,
            objects_freed: totals.objects_freed,
            // What the objects took once written (their sizes), on the /dev/shm that took the
            // most: pages written through mappings show in no system call.
            peak_bytes: world
                .usages()
                .map(|(_, usage)| usage.peak_demand)
                .max()
                .unwrap_or(0)
                .max(totals.peak_live_bytes),
            remaining,
            cut: false,
            // A role whose processes all moved to another role by the end has no row.
            table: table
                .into_iter()
                .filter(|(_, _, stats)| stats.processes > 0)
                .collect(),
            recommendations,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "shmtrace: {} in {:.1}s from {}; {}, {} killed by a signal; {} lost",
            count(self.events, "event"),
            self.seconds,
            count(self.processes, "process"),
            count(self.failed_calls, "failed call"),
            self.deaths_by_signal,
            count(self.lost.total(), "event")
        )];
        if self.lost.total() > 0 {
            lines[0] += &format!(" ({})", self.lost.describe());
        }
        let rows: Vec<_> = self
            .table
            .iter()
            .filter(|(_, role, stats)| {
                stats.processes > 0
                    && (*role != RoleKind::Other || stats.peak_bytes > 0 || stats.failures > 0)
            })
            .collect();
        if !rows.is_empty() {
            let place_width = rows
                .iter()
                .map(|(p, _, _)| p.len())
                .max()
                .unwrap_or(5)
                .max(5);
            lines.push(format!(
                "  {:<place_width$}  {:<22} {:>9} {:>11} {:>11} {:>8} {:>6}",
                "PLACE", "ROLE", "PROCESSES", "PAGES HELD", "SIZES", "FAILURES", "DEATHS"
            ));
            let mut capped = false;
            for (place, role, stats) in rows {
                let (held, mark) = held_shown(stats);
                capped |= mark;
                lines.push(format!(
                    "  {place:<place_width$}  {:<22} {:>9} {:>11} {:>11} {:>8} {:>6}",
                    role.describe(),
                    stats.processes,
                    format!("{}{}", human(held), if mark { "*" } else { "" }),
                    human(stats.peak_bytes),
                    stats.failures,
                    stats.deaths
                ));
            }
            lines.push(
                "  (the most at once: PAGES HELD is the memory taken from /dev/shm, SIZES what \
                 the objects were sized to, written or not)"
                    .to_owned(),
            );
            if capped {
                lines.push(
                    "  * at most the size of /dev/shm: mapped objects count by their sizes, as \
                     pages written through a mapping show in no system call"
                        .to_owned(),
                );
            }
        }
        lines.push(format!(
            "shmtrace: /dev/shm objects: {} created, {} freed",
            self.objects_created, self.objects_freed
        ));
        if let Some(warning) = self.uncertain() {
            lines.push(format!("shmtrace: warning: {warning}"));
        }
        let holding = self.remaining.iter().filter(|r| r.bytes > 0).count();
        if holding > 0 {
            let objects = count(holding as u64, "object");
            lines.push(if self.cut {
                format!(
                    "shmtrace: {objects} held memory where the trace stops (it was cut short: \
                     the calls after that, which may have freed them, are not in it):"
                )
            } else {
                format!(
                    "shmtrace: {objects} still {} memory (left behind, or still in use):",
                    if holding == 1 { "holds" } else { "hold" }
                )
            });
        }
        let state = |linked: bool| match (linked, self.cut) {
            (true, false) => "still in /dev/shm",
            (false, false) => "unlinked, still open or mapped",
            (true, true) => "in /dev/shm",
            (false, true) => "unlinked, open or mapped",
        };
        let holders = self.remaining.iter().filter(|r| r.bytes > 0);
        for r in holders.clone().take(10) {
            lines.push(format!(
                "    {} ({}, {})",
                r.name,
                human(r.bytes),
                state(r.linked)
            ));
        }
        if holding > 10 {
            lines.push(format!("    ... and {} more", holding - 10));
        }
        // Named, but holding nothing: sized and never written. Listed apart, so that a
        // nominal size is not taken for memory held.
        let empty: Vec<&Remaining> = self.remaining.iter().filter(|r| r.bytes == 0).collect();
        if !empty.is_empty() {
            lines.push(format!(
                "shmtrace: {} {} that {} no memory (empty, or sized and never written):",
                count(empty.len() as u64, "object"),
                if empty.len() == 1 {
                    "remains"
                } else {
                    "remain"
                },
                if empty.len() == 1 { "holds" } else { "hold" }
            ));
            for r in empty.iter().take(10) {
                let held = match r.size {
                    0 => "empty".to_owned(),
                    size => format!("0 B of {}", human(size)),
                };
                lines.push(format!("    {} ({held}, {})", r.name, state(r.linked)));
            }
            if empty.len() > 10 {
                lines.push(format!("    ... and {} more", empty.len() - 10));
            }
        }
        for a in &self.recommendations {
            let on = a
                .owner
                .as_ref()
                .map(|owner| format!(" on container {owner}, whose /dev/shm it is"))
                .unwrap_or_default();
            lines.push(format!(
                "shmtrace: {}: give /dev/shm at least {} ({}{on}); see the diagnosis of pid {}, \
                 which failed first",
                a.place,
                human(a.recommendation.min_bytes),
                a.recommendation.docker,
                a.pid
            ));
        }
        lines
    }

    /// What lost events make uncertain, when some were lost.
    fn uncertain(&self) -> Option<String> {
        let lost = self.lost.total();
        (lost > 0).then(|| {
            format!(
                "{lost} events were lost, so these counts may be short, and objects listed as \
                 still holding memory may have been freed by calls that were lost"
            )
        })
    }

    pub fn json(&self) -> Value {
        json!({
            "v": SCHEMA_VERSION,
            "event": "summary",
            "seconds": self.seconds,
            "events": self.events,
            "failed_calls": self.failed_calls,
            "lost": self.lost.total(),
            "lost_by_reason": self.lost.by_reason(),
            "uncertain": self.uncertain(),
            "processes": self.processes,
            "deaths_by_signal": self.deaths_by_signal,
            "objects_created": self.objects_created,
            "objects_freed": self.objects_freed,
            "peak_bytes": self.peak_bytes,
            "cut": self.cut,
            "remaining": self.remaining.iter().map(|r| json!({
                "path": r.name, "bytes": r.bytes, "size": r.size, "linked": r.linked,
            })).collect::<Vec<_>>(),
            "roles": self.table.iter().map(|(place, role, s)| json!({
                "place": place, "role": role, "processes": s.processes,
                "peak_bytes": s.peak_bytes, "peak_held_bytes": held_shown(s).0,
                "failures": s.failures, "deaths": s.deaths,
            })).collect::<Vec<_>>(),
            "recommendations": self.recommendations.iter().map(|a| json!({
                "place": a.place, "pid": a.pid, "min_bytes": a.recommendation.min_bytes,
                "docker": a.recommendation.docker, "compose": a.recommendation.compose,
                "kubernetes": a.recommendation.kubernetes, "owner": a.owner,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The pages a role held at most, never more than its /dev/shm's size; whether it was cut to
/// that (an estimate that counted mapped objects by their sizes).
fn held_shown(stats: &RoleStats) -> (u64, bool) {
    match stats.shm_size {
        Some(size) if stats.peak_held > size => (size, true),
        _ => (stats.peak_held, false),
    }
}
