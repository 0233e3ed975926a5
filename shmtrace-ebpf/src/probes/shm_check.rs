//! Whether a call concerns /dev/shm: by the file it made or acts on, and where there is no
//! file (a failed open, an unlink), by its path argument.
//!
//! A file is judged by what it is, not by the path it was opened by: its super block is a
//! /dev/shm's or not, whichever path led to it (`/dev/shm/x`, a relative one, a container's
//! /dev/shm through `/proc/PID/root`). For a tmpfs the verdict is two bits of `SHM_SUPERS`,
//! one array load; a tmpfs met with no verdict yet is judged once, by its mounts. A /dev/shm
//! that is not a tmpfs (a bind mount of a directory) is judged by the mount a file was reached
//! by.
use core::intrinsics::{AtomicOrdering, atomic_cxchg};

use aya_ebpf::{
    cty::c_void,
    helpers::generated::{self, bpf_probe_read_user_str},
};
use shmtrace_common::{
    FileRef, KernelDev, KernelOffsets, flags,
    supers::{self, ELSEWHERE, FLAGS, GENERATION, KNOWN, SHM, TMPFS_MAGIC},
};

use super::tracepoint::AT_FDCWD;
use crate::{
    kernel::{self, Current, FileAt, Super},
    maps::{SHM_ELSEWHERE, SHM_SUPERS, TMPFS_FILE_OPS},
};

const SHM_PREFIX: &[u8; 9] = b"/dev/shm/";
/// Bytes `bpf_probe_read_user_str` returns for "/dev/shm" and "/dev/shm/", with the NUL.
const SHM_DIR_LEN: i64 = 9;

/// Whether the file system of super block `sb` is a /dev/shm. `mount` gives the mount
/// (`struct vfsmount *`) a file on it was reached by, which decides for a /dev/shm that is not a
/// tmpfs.
#[inline(always)]
pub fn on_shm(sb: &Super, mount: impl FnOnce() -> Option<u64>) -> bool {
    on_shm_as::<true>(sb, mount)
}

/// As [`on_shm`]; unless `JUDGE`, a tmpfs with no verdict yet is taken to be a /dev/shm rather
/// than judged.
#[inline(always)]
fn on_shm_as<const JUDGE: bool>(sb: &Super, mount: impl FnOnce() -> Option<u64>) -> bool {
    if sb.magic == TMPFS_MAGIC {
        return tmpfs_is_shm::<JUDGE>(sb);
    }
    elsewhere(sb.dev) && mount().is_some_and(kernel::vfsmount_at_dev_shm)
}

/// A tmpfs's verdict, from `SHM_SUPERS`, if it was given since the last file system was made
/// (a device number is reused only by a file system made after it); otherwise it is judged
/// now and kept, or unless `JUDGE`, taken to be a /dev/shm.
#[inline(always)]
fn tmpfs_is_shm<const JUDGE: bool>(sb: &Super) -> bool {
    let Some((index, shift)) = supers::bits_of(KernelDev(sb.dev)) else {
        return false;
    };
    let Some(word) = SHM_SUPERS.get_ptr_mut(index) else {
        return false;
    };
    // Volatile loads, as for `FOLLOWED` (scope.rs).
    let generation = match SHM_SUPERS.get_ptr(GENERATION) {
        // SAFETY: a live, 8-byte aligned array element.
        Some(generation) => unsafe { (generation as *mut u64).read_volatile() as u32 },
        None => 0,
    };
    // SAFETY: as above.
    let seen = unsafe { word.read_volatile() };
    let bits = seen >> shift;
    if supers::generation_of(seen) == generation && bits & KNOWN != 0 {
        return bits & SHM != 0;
    }
    if !JUDGE {
        return true;
    }
    judge_tmpfs(sb.addr, word, seen, generation, shift)
}

/// Judges a tmpfs by its mounts, and keeps the verdict (unless the word changed meanwhile).
/// Inlined: a frame of its own, between a failed open's (`open.rs`, `failed`) and
/// `kernel::super_at_dev_shm`'s, took the three past the verifier's 512 bytes of stack
/// (`combined stack size of 4 calls is 544`); the mount walk it calls stays out of line.
#[inline(always)]
fn judge_tmpfs(sb: u64, word: *mut u64, seen: u64, generation: u32, shift: u32) -> bool {
    let shm = kernel::super_at_dev_shm(sb);
    let verdict = if shm { KNOWN | SHM } else { KNOWN };
    let updated = supers::with_verdict(seen, generation, verdict << shift);
    // Other file systems' verdicts in the word change concurrently: if one did, this one is
    // not kept, and is given again next time.
    // SAFETY: `word` is a live, 8-byte aligned element of `SHM_SUPERS`.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::Relaxed }, { AtomicOrdering::Relaxed }>(
            word, seen, updated,
        )
    };
    shm
}

/// Whether some /dev/shm is not a tmpfs: one array load.
#[inline(always)]
fn any_elsewhere() -> bool {
    SHM_SUPERS
        .get_ptr(FLAGS)
        // SAFETY: a live array element, read as above.
        .is_some_and(|flags| unsafe { (flags as *mut u64).read_volatile() } & ELSEWHERE != 0)
}

/// Whether `dev` is a /dev/shm that is not a tmpfs. The flag is one array load, so the hash
/// look-up is made only on a host that has such a /dev/shm.
#[inline(always)]
fn elsewhere(dev: u32) -> bool {
    any_elsewhere() && SHM_ELSEWHERE.get_ptr(dev).is_some()
}

/// Whether `file` is on a /dev/shm.
///
/// A file of a grown descriptor table is read at its address, each read a helper call. Its
/// operations, read with its inode pointer, rule it out when they are neither a tmpfs's
/// regular files' nor its directories' (once the probes have learned both): the file on
/// /dev/null a trainer writes its logs to, a socket, a file on disk. Only a file on some
/// tmpfs, or any while a /dev/shm is not a tmpfs, has its inode and super block read.
#[inline(always)]
pub fn file_on_shm(file: FileAt, off: &KernelOffsets) -> bool {
    file_on_shm_as::<true>(file, off)
}

/// Whether `file` may be on a /dev/shm: as [`file_on_shm`], but a tmpfs with no verdict yet is
/// taken to be one rather than judged. For a check repeated along many paths of one program
/// (each descriptor a message passed), where a judgement at each would take the verifier too
/// long, and a wrong yes costs only time.
#[inline(always)]
pub fn file_may_be_on_shm(file: FileAt, off: &KernelOffsets) -> bool {
    file_on_shm_as::<false>(file, off)
}

#[inline(always)]
fn file_on_shm_as<const JUDGE: bool>(file: FileAt, off: &KernelOffsets) -> bool {
    let mount = || kernel::file_path(file, off).map(|(mount, _)| mount);
    if file.is_typed() {
        let Some(sb) = kernel::file_super(file, off) else {
            return false;
        };
        if sb.magic == TMPFS_MAGIC
            && !tmpfs_ops_learned()
            && let Some((ops, mode)) = kernel::typed_file_kind(file, off)
        {
            learn_tmpfs_ops(ops, mode);
        }
        return on_shm_as::<JUDGE>(&sb, mount);
    }
    let Some((ops, inode)) = kernel::raw_file_head(file, off) else {
        return false;
    };
    if not_tmpfs_ops(ops) && !any_elsewhere() {
        return false;
    }
    let Some((mode, sb)) = kernel::raw_inode_super(inode, off) else {
        return false;
    };
    if sb.magic == TMPFS_MAGIC {
        learn_tmpfs_ops(ops, mode);
    }
    on_shm_as::<JUDGE>(&sb, mount)
}

/// `S_IFMT`, `S_IFREG`, `S_IFDIR` (UAPI).
const S_IFMT: u16 = 0o170_000;
const S_IFREG: u16 = 0o100_000;
const S_IFDIR: u16 = 0o040_000;

/// The learned operations of a tmpfs's regular files and directories (0: not yet).
#[inline(always)]
fn tmpfs_ops() -> (u64, u64) {
    let at = |slot| {
        TMPFS_FILE_OPS.get_ptr(slot).map_or(0, |ops| {
            // SAFETY: a live array element, read as above.
            unsafe { (ops as *mut u64).read_volatile() }
        })
    };
    (at(0), at(1))
}

#[inline(always)]
fn tmpfs_ops_learned() -> bool {
    let (file, dir) = tmpfs_ops();
    file != 0 && dir != 0
}

/// Whether `ops` are no tmpfs file's: known only once both kinds are learned.
#[inline(always)]
fn not_tmpfs_ops(ops: u64) -> bool {
    let (file, dir) = tmpfs_ops();
    file != 0 && dir != 0 && ops != file && ops != dir
}

/// Keeps the operations of a tmpfs file of type `mode`, if the first of its kind.
#[inline(always)]
fn learn_tmpfs_ops(ops: u64, mode: u16) {
    let slot = match mode & S_IFMT {
        S_IFREG => 0,
        S_IFDIR => 1,
        _ => return,
    };
    if let Some(learned) = TMPFS_FILE_OPS.get_ptr_mut(slot) {
        // SAFETY: a live array element; every writer writes the same value.
        unsafe {
            if learned.read_volatile() == 0 {
                learned.write_volatile(ops);
            }
        }
    }
}

/// The file behind `fd` as it is now, if it is on a /dev/shm.
#[inline(always)]
pub fn shm_fd(task: Current, fd: i32, off: &KernelOffsets) -> Option<FileRef> {
    let file = kernel::fd_file(task, fd, off)?;
    if !file_on_shm(file, off) {
        return None;
    }
    kernel::file_ref(file, off)
}

/// What a path argument says about a call.
pub enum PathIs {
    /// In /dev/shm, with the header flags to record, and for a name relative to a directory
    /// descriptor, that directory's inode number (with [`flags::DIR_INODE`]; 0 otherwise).
    Shm(u16, u64),
    /// Somewhere else.
    Elsewhere,
    /// Not readable now: a page the program has not touched yet, which a probe cannot fault
    /// in. Judged again at `sys_exit` ([`flags::PATH_AT_EXIT`]), when the call has read it.
    Unread,
}

/// Bytes of a path read to judge it: "/dev/shm/" and one more, and the NUL. A longer path
/// is cut short there, which says all that is needed (`len` is then `PREFIX_READ`).
const PREFIX_READ: u32 = SHM_PREFIX.len() as u32 + 2;

/// Reads the first bytes of the path at `path` into `buf`, as `bpf_probe_read_user_str` of
/// `PREFIX_READ` bytes would: returns its length with the NUL, or `PREFIX_READ` if it is
/// longer, or a negative error. A fixed-size read costs less than the string helper, which
/// is left for a path that ends near the end of its page, where 16 bytes cannot be read.
#[inline(always)]
fn path_prefix(path: u64, buf: &mut [u8; 16]) -> i64 {
    // SAFETY: a user pointer, read into a buffer of the size given; a bad one is an error.
    let failed = unsafe {
        generated::bpf_probe_read_user(buf.as_mut_ptr() as *mut c_void, 16, path as *const c_void)
    };
    if failed != 0 {
        // SAFETY: as above; the helper stops at PREFIX_READ bytes, within the buffer.
        return unsafe {
            bpf_probe_read_user_str(
                buf.as_mut_ptr() as *mut c_void,
                PREFIX_READ,
                path as *const c_void,
            )
        };
    }
    let mut i = 0;
    while i < PREFIX_READ as usize {
        if buf[i] == 0 {
            return i as i64 + 1;
        }
        i += 1;
    }
    PREFIX_READ as i64
}

/// Whether a path argument names something in /dev/shm: an absolute `/dev/shm/...` path, or a
/// relative one resolved from a directory (`dfd`, or the working directory) on a /dev/shm file
/// system. Only the path's first bytes are read. For calls that make no file: a failed open,
/// an unlink, a `statfs`. Another absolute path to a /dev/shm (`/proc/PID/root/dev/shm/x`)
/// is not recognised here.
#[inline(always)]
pub fn shm_path(dfd: i32, path: u64) -> PathIs {
    let mut buf = [0u8; 16];
    let len = path_prefix(path, &mut buf);
    if len <= 0 {
        // NULL is the caller's mistake (the call fails with EFAULT).
        return if path == 0 {
            PathIs::Elsewhere
        } else {
            PathIs::Unread
        };
    }
    if buf[0] == b'/' {
        // "/dev/shm" itself: only its file system matters (for names relative to it later).
        let mut i = 0;
        while i < SHM_PREFIX.len() - 1 {
            if buf[i] != SHM_PREFIX[i] {
                return PathIs::Elsewhere;
            }
            i += 1;
        }
        if len == SHM_DIR_LEN || (len == SHM_DIR_LEN + 1 && buf[8] == b'/') {
            return PathIs::Shm(flags::SHM_DIRECTORY, 0);
        }
        if buf[8] != b'/' {
            return PathIs::Elsewhere;
        }
        return PathIs::Shm(0, 0);
    }
    let off = kernel::offsets();
    // Relative to the working directory: no directory number (userspace shows the name as
    // in /dev/shm itself).
    if dfd == AT_FDCWD {
        let cwd_on_shm =
            kernel::cwd_super(off).is_some_and(|(sb, mount)| on_shm(&sb, || Some(mount)));
        return if cwd_on_shm {
            PathIs::Shm(flags::RELATIVE_TO_SHM, 0)
        } else {
            PathIs::Elsewhere
        };
    }
    if fd_on_shm(dfd) == 0 {
        return PathIs::Elsewhere;
    }
    // The directory's inode number names it to userspace, which learned it when the directory
    // was opened: a descriptor moved since with an untraced call (GNU fts's
    // `fcntl(F_DUPFD_CLOEXEC)` in `find`, `du`, `rm -r`) still names its directory.
    let dir_ino =
        kernel::fd_file(Current::get(), dfd, off).map_or(0, |dir| kernel::file_ino(dir, off));
    let dir_flag = if dir_ino == 0 { 0 } else { flags::DIR_INODE };
    PathIs::Shm(flags::RELATIVE_TO_SHM | dir_flag, dir_ino)
}

/// Whether the current task's descriptor `fd` is a file on a /dev/shm: 1 or 0, from a global
/// BPF function, which the verifier checks once per program (as `kernel`'s mount walks): a
/// file's judgement, inlined at each of a program's checks of a descriptor, was checked again
/// at each, along every path there.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn fd_on_shm(fd: i32) -> u64 {
    let off = kernel::offsets();
    kernel::fd_file(Current::get(), fd, off).is_some_and(|file| file_on_shm(file, off)) as u64
}

/// As [`fd_on_shm`], for [`file_may_be_on_shm`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn fd_may_be_on_shm(fd: i32) -> u64 {
    let off = kernel::offsets();
    kernel::fd_file(Current::get(), fd, off).is_some_and(|file| file_may_be_on_shm(file, off))
        as u64
}
