//! Kernel struct offsets, resolved from the running kernel's BTF.
//!
//! The eBPF programs read `task_struct` and friends at these offsets. They are never compiled
//! in: struct layouts differ between kernel versions and configurations.
use std::path::Path;

use btf_rs::{Btf, Type};
use shmtrace_common::KernelOffsets;

use super::BpfError;

/// Resolves every offset the programs need, or names the first one this kernel lacks.
pub fn resolve(btf: &Btf) -> Result<KernelOffsets, BpfError> {
    let at = |ty: &str, path: &str| field_offset(btf, ty, path);
    Ok(KernelOffsets {
        task_pid: at("task_struct", "pid")?,
        task_tgid: at("task_struct", "tgid")?,
        task_comm: at("task_struct", "comm")?,
        task_exit_code: at("task_struct", "exit_code")?,
        task_nsproxy: at("task_struct", "nsproxy")?,
        task_files: at("task_struct", "files")?,
        task_fs: at("task_struct", "fs")?,
        task_mm: at("task_struct", "mm")?,
        nsproxy_mnt_ns: at("nsproxy", "mnt_ns")?,
        mnt_ns_inum: at("mnt_namespace", "ns.inum")?,
        files_fdt: at("files_struct", "fdt")?,
        fdtable_max_fds: at("fdtable", "max_fds")?,
        fdtable_fd: at("fdtable", "fd")?,
        file_inode: at("file", "f_inode")?,
        inode_mode: at("inode", "i_mode")?,
        inode_ino: at("inode", "i_ino")?,
        inode_sb: at("inode", "i_sb")?,
        inode_size: at("inode", "i_size")?,
        inode_blocks: at("inode", "i_blocks")?,
        super_block_dev: at("super_block", "s_dev")?,
        fs_pwd_dentry: at("fs_struct", "pwd.dentry")?,
        dentry_sb: at("dentry", "d_sb")?,
        mm_arg_start: at("mm_struct", "arg_start")?,
        mm_arg_end: at("mm_struct", "arg_end")?,
        binprm_filename: at("linux_binprm", "filename")?,
        task_in_execve_bit: field_bit_offset(btf, "task_struct", "in_execve").unwrap_or(u32::MAX),
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

pub fn parse_btf(bytes: &[u8], path: &Path) -> Result<Btf, BpfError> {
    Btf::from_bytes(bytes).map_err(|error| BpfError::BadBtf {
        path: path.to_owned(),
        reason: error.to_string(),
    })
}

#[cfg(test)]
fn load_btf(path: &Path) -> Result<Btf, BpfError> {
    parse_btf(&read_btf(path)?, path)
}

/// Whether the kernel has a BTF tracepoint (`btf_trace_<name>`) to attach `tp_btf` to.
pub fn has_btf_tracepoint(btf: &Btf, name: &str) -> bool {
    btf.resolve_ids_by_name(&format!("btf_trace_{name}"))
        .map(|ids| !ids.is_empty())
        .unwrap_or(false)
}

/// Bit offset of a (possibly bit-) field `path` inside `struct ty`.
pub fn field_bit_offset(btf: &Btf, ty: &str, path: &str) -> Result<u32, BpfError> {
    let missing = || BpfError::MissingField {
        field: format!("{ty}.{path}"),
    };
    let mut current = struct_named(btf, ty).ok_or_else(missing)?;
    let mut total_bits = 0u32;
    let mut fields = path.split('.').peekable();
    while let Some(field) = fields.next() {
        let (bits, member_type) = find_member(btf, &current, field).ok_or_else(missing)?;
        total_bits += bits;
        if fields.peek().is_some() {
            current = as_struct(btf, member_type).ok_or_else(missing)?;
        }
    }
    Ok(total_bits)
}

/// Byte offset of `path` (dotted, e.g. `pwd.dentry`) inside `struct ty`. Anonymous struct and
/// union members are searched through, as C does.
pub fn field_offset(btf: &Btf, ty: &str, path: &str) -> Result<u32, BpfError> {
    let bits = field_bit_offset(btf, ty, path)?;
    if bits % 8 != 0 {
        return Err(BpfError::MissingField {
            field: format!("{ty}.{path} (a bitfield)"),
        });
    }
    Ok(bits / 8)
}

fn struct_named(btf: &Btf, name: &str) -> Option<btf_rs::Struct> {
    btf.resolve_types_by_name(name)
        .ok()?
        .into_iter()
        .find_map(|ty| match ty {
            Type::Struct(s) if !s.members.is_empty() => Some(s),
            _ => None,
        })
}

/// Finds `name` among the members of `s`, descending into anonymous members. Returns its bit
/// offset from the start of `s`, and its type.
fn find_member(btf: &Btf, s: &btf_rs::Struct, name: &str) -> Option<(u32, Type)> {
    for member in &s.members {
        let member_name = btf.resolve_name(member).unwrap_or_default();
        let member_type = btf.resolve_chained_type(member).ok()?;
        if member_name == name {
            return Some((member.bit_offset(), member_type));
        }
        if member_name.is_empty()
            && let Some(inner) = as_struct(btf, member_type)
            && let Some((bits, ty)) = find_member(btf, &inner, name)
        {
            return Some((member.bit_offset() + bits, ty));
        }
    }
    None
}

/// The struct or union behind `ty`, looking through typedefs and qualifiers.
fn as_struct(btf: &Btf, mut ty: Type) -> Option<btf_rs::Struct> {
    for _ in 0..16 {
        match ty {
            Type::Struct(s) | Type::Union(s) => return Some(s),
            Type::Typedef(_) | Type::Const(_) | Type::Volatile(_) | Type::Restrict(_) => {
                let next = match &ty {
                    Type::Typedef(t) => btf.resolve_chained_type(t),
                    Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => {
                        btf.resolve_chained_type(t)
                    }
                    _ => unreachable!(),
                };
                ty = next.ok()?;
            }
            Type::Fwd(_) => {
                // A forward declaration: find the full definition by name.
                let name = btf.resolve_name(ty.as_btf_type()?).ok()?;
                return struct_named(btf, &name);
            }
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs against this machine's kernel: the offsets must exist and be distinct where the
    /// fields are distinct.
    #[test]
    fn resolves_every_offset_from_the_running_kernel() {
        let btf = load_btf(Path::new("/sys/kernel/btf/vmlinux")).expect("kernel BTF");
        let off = resolve(&btf).expect("all offsets");
        assert_ne!(off.task_pid, off.task_tgid);
        assert_eq!(
            off.task_tgid,
            off.task_pid + 4,
            "tgid follows pid in task_struct"
        );
        assert_ne!(off.mm_arg_start, off.mm_arg_end);
        assert!(off.fs_pwd_dentry > 0);
        assert_ne!(
            off.task_in_execve_bit,
            u32::MAX,
            "this kernel has in_execve"
        );
        assert_ne!(off.task_in_execve_bit % 8 + off.task_in_execve_bit / 8, 0);
    }

    #[test]
    fn names_the_missing_field() {
        let btf = load_btf(Path::new("/sys/kernel/btf/vmlinux")).expect("kernel BTF");
        let err = field_offset(&btf, "task_struct", "no_such_field").unwrap_err();
        assert!(
            err.to_string().contains("task_struct.no_such_field"),
            "{err}"
        );
    }
}
