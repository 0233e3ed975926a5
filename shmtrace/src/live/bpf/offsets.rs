//! Kernel struct offsets, resolved from the running kernel's BTF.
//!
//! The eBPF programs read `task_struct` and friends at these offsets. They are never compiled
//! in: struct layouts differ between kernel versions and configurations.
use std::path::Path;

use shmtrace_common::KernelOffsets;

use super::{
    BpfError,
    arch::KernelArch,
    btf::{KernelBtf, field_bit_offset, field_offset},
};

/// Resolves every offset the programs need, or names the first one this kernel lacks.
pub fn resolve(btf: &KernelBtf<'_>) -> Result<KernelOffsets, BpfError> {
    let at = |ty: &str, path: &str| field_offset(btf, ty, path);
    // A file system's mounts: a chain through `mnt_next_for_sb` from 6.18, a list of
    // `mnt_instance` before.
    let (mount_next, chained) = match at("mount", "mnt_next_for_sb") {
        Ok(next) => (next, true),
        Err(_) => (at("mount", "mnt_instance")?, false),
    };
    Ok(KernelOffsets {
        task_pid: at("task_struct", "pid")?,
        task_tgid: at("task_struct", "tgid")?,
        task_comm: at("task_struct", "comm")?,
        task_exit_code: at("task_struct", "exit_code")?,
        task_real_parent: at("task_struct", "real_parent")?,
        task_signal: at("task_struct", "signal")?,
        signal_live: at("signal_struct", "live.counter")?,
        task_nsproxy: at("task_struct", "nsproxy")?,
        task_files: at("task_struct", "files")?,
        task_fs: at("task_struct", "fs")?,
        task_mm: at("task_struct", "mm")?,
        nsproxy_mnt_ns: at("nsproxy", "mnt_ns")?,
        mnt_ns_inum: at("mnt_namespace", "ns.inum")?,
        files_fdt: at("files_struct", "fdt")?,
        files_fd_array: at("files_struct", "fd_array")?,
        fdtable_max_fds: at("fdtable", "max_fds")?,
        fdtable_fd: at("fdtable", "fd")?,
        file_inode: at("file", "f_inode")?,
        file_op: at("file", "f_op")?,
        file_path_mnt: at("file", "f_path.mnt")?,
        file_path_dentry: at("file", "f_path.dentry")?,
        inode_mode: at("inode", "i_mode")?,
        inode_ino: at("inode", "i_ino")?,
        inode_sb: at("inode", "i_sb")?,
        inode_size: at("inode", "i_size")?,
        inode_blocks: at("inode", "i_blocks")?,
        super_block_dev: at("super_block", "s_dev")?,
        super_block_magic: at("super_block", "s_magic")?,
        super_block_mounts: at("super_block", "s_mounts")?,
        mount_next,
        mounts_chained: chained.into(),
        mount_mnt: at("mount", "mnt")?,
        mount_parent: at("mount", "mnt_parent")?,
        mount_mountpoint: at("mount", "mnt_mountpoint")?,
        vfsmount_root: at("vfsmount", "mnt_root")?,
        dentry_parent: at("dentry", "d_parent")?,
        dentry_name: at("dentry", "d_name.name")?,
        fs_pwd_dentry: at("fs_struct", "pwd.dentry")?,
        fs_pwd_mnt: at("fs_struct", "pwd.mnt")?,
        fs_root_dentry: at("fs_struct", "root.dentry")?,
        fs_root_mnt: at("fs_struct", "root.mnt")?,
        dentry_sb: at("dentry", "d_sb")?,
        mm_arg_start: at("mm_struct", "arg_start")?,
        mm_arg_end: at("mm_struct", "arg_end")?,
        binprm_filename: at("linux_binprm", "filename")?,
        task_in_execve_bit: field_bit_offset(btf, "task_struct", "in_execve").unwrap_or(u32::MAX),
        regs_arg: KernelArch::HOST.syscall_arg_registers(btf)?,
        fd_slot_steps: std::array::from_fn(|bit| 8 << bit),
    })
}

/// Reads the kernel's BTF from `path` (normally `/sys/kernel/btf/vmlinux`), once: both this
/// module and aya's loader parse the same bytes.
pub fn read_btf(path: &Path) -> Result<Vec<u8>, BpfError> {
    std::fs::read(path).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => BpfError::NoBtf {
            path: path.to_owned(),
        },
        _ => BpfError::BadBtf {
            path: path.to_owned(),
            reason: error.to_string(),
        },
    })
}

pub fn parse_btf<'a>(bytes: &'a [u8], path: &Path) -> Result<KernelBtf<'a>, BpfError> {
    KernelBtf::parse(bytes).map_err(|reason| BpfError::BadBtf {
        path: path.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs against this machine's kernel: the offsets must exist and be distinct where the
    /// fields are distinct.
    #[test]
    fn resolves_every_offset_from_the_running_kernel() {
        let bytes = read_btf(Path::new("/sys/kernel/btf/vmlinux")).expect("kernel BTF");
        let btf = KernelBtf::parse(&bytes).unwrap();
        let off = resolve(&btf).expect("all offsets");
        assert_ne!(off.task_pid, off.task_tgid);
        assert_eq!(
            off.task_tgid,
            off.task_pid + 4,
            "tgid follows pid in task_struct"
        );
        assert_ne!(off.mm_arg_start, off.mm_arg_end);
        assert!(off.fs_pwd_dentry > 0);
        // `struct fs_struct { ...; struct path root, pwd; }`
        assert_eq!(off.fs_root_dentry + 16, off.fs_pwd_dentry);
        assert_eq!(off.fs_root_mnt + 16, off.fs_pwd_mnt);
        assert_ne!(
            off.task_in_execve_bit,
            u32::MAX,
            "this kernel has in_execve"
        );
        assert_ne!(off.task_in_execve_bit % 8 + off.task_in_execve_bit / 8, 0);
        // x86-64's `struct pt_regs`: di, si, dx, r10, r8, r9; arm64's: orig_x0, then x1 to x5
        // of `regs[31]` at the start.
        #[cfg(target_arch = "x86_64")]
        assert_eq!(off.regs_arg, [112, 104, 96, 56, 72, 64]);
        #[cfg(target_arch = "aarch64")]
        assert_eq!(off.regs_arg, [272, 8, 16, 24, 32, 40]);
    }

    #[test]
    fn names_the_missing_field() {
        let bytes = read_btf(Path::new("/sys/kernel/btf/vmlinux")).expect("kernel BTF");
        let btf = KernelBtf::parse(&bytes).unwrap();
        let err = field_offset(&btf, "task_struct", "no_such_field").unwrap_err();
        assert!(
            err.to_string().contains("task_struct.no_such_field"),
            "{err}"
        );
    }
}
