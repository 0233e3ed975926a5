//! Files that processes now gone left on a /dev/shm: which, who made them, how much they
//! hold, whether the /dev/shm would have been big enough without them, and how to remove them.
use super::{Failure, KnownUser, Leftover};
use crate::model::{ContainerInfo, World};

/// Space held on a /dev/shm by files of processes that are gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftovers {
    pub files: Vec<Leftover>,
    pub bytes: u64,
    /// Whether the /dev/shm would have had room for the failing request without them.
    pub enough_without: bool,
    /// A safe command that removes them.
    pub remove: String,
    /// The program's own way to leave none, when it has one.
    pub avoid: Option<&'static str>,
}

/// Files on `dev` that only dead processes knew: still named, holding memory (pages, not
/// nominal size: one only sized by `ftruncate` holds none), open and mapped by no traced
/// process, made by a process that has ended. Largest first.
pub(super) fn leftovers_on(dev: u32, world: &World) -> Vec<Leftover> {
    let mut files: Vec<Leftover> = world
        .live_objects()
        .filter(|o| o.inode.dev == dev && o.linked && o.fds == 0 && o.mappings == 0)
        .filter_map(|o| {
            let creator = world.process(o.creator?)?;
            let ending = creator.exit?;
            Some(Leftover {
                path: o.display_name(),
                bytes: o.held(),
                creator_pid: creator.pid,
                creator_comm: creator.comm.clone(),
                creator_ending: ending.describe(),
            })
        })
        .filter(|l| l.bytes > 0)
        .collect();
    files.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.path.cmp(&b.path)));
    files
}

/// Whether the leftovers alone kept the failing request from fitting, and how to remove them.
pub(super) fn summarise_leftovers(
    failure: &Failure,
    program: Option<&'static KnownUser>,
    container: Option<&ContainerInfo>,
) -> Leftovers {
    let bytes: u64 = failure.leftovers.iter().map(|l| l.bytes).sum();
    let enough_without = failure.capacity.is_some_and(|c| {
        c.used
            .saturating_sub(bytes)
            .saturating_add(failure.unmet.max(1))
            <= c.size
    });
    let paths: Vec<String> = failure
        .leftovers
        .iter()
        .map(|l| shell_word(&l.path))
        .collect();
    let rm = format!("rm -f -- {}", paths.join(" "));
    let remove = match container {
        Some(c) => format!("docker exec {} {rm}", shell_word(&c.name)),
        None => rm,
    };
    Leftovers {
        files: failure.leftovers.clone(),
        bytes,
        enough_without,
        remove,
        avoid: program.and_then(|k| k.leftovers),
    }
}

/// `text` as one shell word: quoted unless it is plainly safe.
fn shell_word(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:@%".contains(c))
    {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}
