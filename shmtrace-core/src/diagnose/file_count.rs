//! When /dev/shm runs out of files rather than bytes: a tmpfs holds at most `nr_inodes` files,
//! and creating one more fails with ENOSPC however empty it is. The advice is a file count
//! (how to set it where it can be set), or fewer files.
use serde::Serialize;

use super::recommend::docker_size;
use crate::{capacity::Capacity, model::StartedBy, units::human};

/// Headroom over the files the run showed it needed.
const HEADROOM_PERCENT: u64 = 25;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileCountAdvice {
    /// The file count it had (`nr_inodes`, `f_files`), when measured.
    pub limit: Option<u64>,
    /// Files it held when the first create was refused: all it may hold.
    pub held: u64,
    /// Creates refused on it so far, by every traced process.
    pub refused: u64,
    /// The `nr_inodes` to set.
    pub min_files: u64,
    /// How `min_files` was reached.
    pub basis: String,
    /// The size it had, kept as it is: the bytes were not what ran out.
    pub size_bytes: Option<u64>,
    pub docker: String,
    pub compose: String,
    pub podman: String,
    /// Kubernetes cannot set it: an `emptyDir` takes no `nr_inodes`.
    pub kubernetes: String,
    pub preferred: Option<&'static str>,
    /// Ways to make fewer files.
    pub alternatives: Vec<String>,
}

/// The advice after creates on a /dev/shm were refused for want of inodes. `capacity` is its
/// measurement at the failure (its file count, when known); `objects` the traced files on it
/// then; `refused` the creates refused so far.
pub fn advise_files(
    capacity: Option<&Capacity>,
    objects: u64,
    refused: u64,
    alternatives: Vec<String>,
    started_by: &StartedBy,
) -> FileCountAdvice {
    let limit = capacity.and_then(|c| c.files).map(|f| f.limit);
    // The kernel refused a create: every inode was taken at that moment, whatever a later
    // measurement shows.
    let held = limit.unwrap_or(objects).max(objects);
    let need = held + refused.max(1);
    let with_headroom = need + need * HEADROOM_PERCENT / 100;
    // In hundreds, as people write it; always more than it had.
    let min_files = with_headroom.div_ceil(100).max(1) * 100;
    let min_files = min_files.max(limit.map_or(0, |l| l + 100));
    let basis = format!(
        "{held} files held when the first create was refused (all it may hold{}), + {refused} \
         creates refused, + {HEADROOM_PERCENT}% headroom = {with_headroom}, rounded up to \
         {min_files}",
        limit
            .map(|l| format!(": nr_inodes={l}"))
            .unwrap_or_default()
    );
    let size_bytes = capacity.map(|c| c.size).filter(|s| *s > 0);
    let size = size_bytes
        .map(|s| format!("size={},", docker_size(s)))
        .unwrap_or_default();
    let mount = format!("/dev/shm:rw,{size}nr_inodes={min_files}");
    let preferred = match started_by {
        StartedBy::Compose { .. } => Some("compose"),
        StartedBy::DockerRun => Some("docker"),
        StartedBy::Podman => Some("podman"),
        StartedBy::Kubernetes => Some("kubernetes"),
        StartedBy::Unknown => None,
    };
    FileCountAdvice {
        limit,
        held,
        refused,
        min_files,
        basis,
        size_bytes,
        docker: format!("docker run --tmpfs {mount} ..."),
        compose: format!("tmpfs: [\"{mount}\"]   (in the service, docker compose)"),
        podman: format!("podman run --tmpfs {mount} ..."),
        kubernetes: "Kubernetes cannot set it (an emptyDir takes no nr_inodes): make fewer \
                     files"
            .to_owned(),
        preferred,
        alternatives,
    }
}

impl FileCountAdvice {
    /// The cause, in words.
    pub fn cause_text(&self) -> String {
        let free = self
            .size_bytes
            .map(|s| format!(" (of its {}, bytes were left)", human(s)))
            .unwrap_or_default();
        match self.limit {
            Some(limit) => format!(
                "/dev/shm ran out of files, not of bytes: it holds at most {limit} files \
                 (nr_inodes={limit}) and had {} when a create was refused{free}",
                self.held
            ),
            None => format!(
                "/dev/shm ran out of files, not of bytes: creating a file was refused with \
                 ENOSPC, which on a tmpfs means its file count (nr_inodes) was reached{free}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::FileCount;

    #[test]
    fn the_count_covers_what_was_held_and_refused_and_keeps_the_size() {
        let capacity = Capacity {
            dev: 1,
            size: 256 << 20,
            used: 2 << 20,
            ts_ns: 0,
            files: Some(FileCount {
                limit: 200,
                free: 150,
            }),
        };
        let advice = advise_files(Some(&capacity), 40, 209, Vec::new(), &StartedBy::DockerRun);
        // All 200 were taken at the refusal, whatever the later measurement says.
        assert_eq!(advice.held, 200);
        // (200 + 209) x 1.25 = 511, in hundreds.
        assert_eq!(advice.min_files, 600);
        assert_eq!(
            advice.docker,
            "docker run --tmpfs /dev/shm:rw,size=256m,nr_inodes=600 ..."
        );
        assert!(
            advice.kubernetes.contains("cannot"),
            "{}",
            advice.kubernetes
        );
        assert!(advice.cause_text().contains("nr_inodes=200"));
    }

    #[test]
    fn never_fewer_files_than_it_had() {
        let capacity = Capacity {
            dev: 1,
            size: 64 << 20,
            used: 0,
            ts_ns: 0,
            files: Some(FileCount {
                limit: 10_000,
                free: 0,
            }),
        };
        let advice = advise_files(Some(&capacity), 3, 0, Vec::new(), &StartedBy::Unknown);
        assert!(advice.min_files > 10_000, "{}", advice.min_files);
        // Unknown count: what the traced files and refusals show.
        let advice = advise_files(None, 120, 30, Vec::new(), &StartedBy::Unknown);
        assert_eq!(advice.min_files, 200);
        assert_eq!(
            advice.docker,
            "docker run --tmpfs /dev/shm:rw,nr_inodes=200 ..."
        );
    }
}
