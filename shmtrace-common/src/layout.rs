//! The record layout as an ABI: every size and offset asserted at compile time, and a hash of
//! them all that trace files carry, so that a file written by a build with different records
//! is refused instead of misread.
use core::mem::{offset_of, size_of};

use crate::event::{
    ExecEvent, ExitEvent, FileRef, ForkEvent, Header, OomEvent, PathEvent, RenameEvent,
    SignalEvent, SyscallEvent,
};

/// Every field of every record: (struct size, field offset, field size), in declaration order.
macro_rules! layout {
    ($($ty:ty { $($field:ident: $fty:ty),* $(,)? })*) => {
        const LAYOUT: &[(usize, usize, usize)] = &[
            $($( (size_of::<$ty>(), offset_of!($ty, $field), size_of::<$fty>()), )*)*
        ];
        // The fields fill each struct exactly: no hidden padding, none forgotten here.
        $(const _: () = assert!(0 $(+ size_of::<$fty>())* == size_of::<$ty>());)*
    };
}

layout! {
    Header { kind: u16, flags: u16, cpu: u32, ts_ns: u64, pid: u32, tid: u32, mntns: u32,
             _pad: u32, cgroup_id: u64, comm: [u8; 16] }
    FileRef { dev: u32, mode: u32, ino: u64, size: i64, blocks: u64 }
    SyscallEvent { header: Header, syscall: u16, _pad: u16, fd: i32, ret: i64, args: [u64; 6],
                   file: FileRef }
    PathEvent { call: SyscallEvent, path: [u8; 256] }
    SignalEvent { header: Header, signo: i32, code: i32, errno: i32, result: i32, addr: u64,
                  target_pid: u32, target_tid: u32, target_comm: [u8; 16] }
    ForkEvent { header: Header, child_pid: u32, _pad: u32 }
    ExecEvent { header: Header, args_len: u32, _pad: u32, filename: [u8; 256],
                args: [u8; 256] }
    ExitEvent { header: Header, exit_code: i32, _pad: u32 }
    RenameEvent { header: Header, target_pid: u32, target_tid: u32, new_comm: [u8; 16] }
    OomEvent { header: Header, victim_pid: u32, _pad: u32 }
}

// The sizes userspace and old trace files rely on. A change here is a format change: it
// changes LAYOUT_HASH, and files from other builds are refused.
const _: () = {
    assert!(size_of::<Header>() == 56);
    assert!(size_of::<FileRef>() == 32);
    assert!(size_of::<SyscallEvent>() == 152);
    assert!(size_of::<PathEvent>() == 408);
    assert!(size_of::<SignalEvent>() == 104);
    assert!(size_of::<ForkEvent>() == 64);
    assert!(size_of::<ExecEvent>() == 576);
    assert!(size_of::<ExitEvent>() == 64);
    assert!(size_of::<RenameEvent>() == 80);
    assert!(size_of::<OomEvent>() == 64);
    assert!(offset_of!(Header, ts_ns) == 8);
    assert!(offset_of!(Header, comm) == 40);
    assert!(offset_of!(SyscallEvent, ret) == 64);
    assert!(offset_of!(SyscallEvent, args) == 72);
    assert!(offset_of!(SyscallEvent, file) == 120);
    assert!(offset_of!(PathEvent, path) == 152);
    assert!(offset_of!(SignalEvent, addr) == 72);
    assert!(offset_of!(ExecEvent, filename) == 64);
};

/// FNV-1a over every (struct size, field offset, field size) of the records.
const fn layout_hash() -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < LAYOUT.len() {
        let (a, b, c) = LAYOUT[i];
        let words = [a as u64, b as u64, c as u64];
        let mut w = 0;
        while w < 3 {
            let mut byte = 0;
            while byte < 8 {
                hash ^= (words[w] >> (byte * 8)) & 0xff;
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
                byte += 1;
            }
            w += 1;
        }
        i += 1;
    }
    hash
}

/// Identifies the record layout; written into every trace file's header and checked on read.
pub const LAYOUT_HASH: u64 = layout_hash();
