//! A reader of the kernel's BTF for the one question start-up asks: where a struct member lies
//! ([`field_offset`]).
//!
//! A general BTF library builds every one of the kernel's ~150,000 types into owned values
//! before the first question; on this project's machine that took 400 ms and 40 MiB, twice the
//! whole start-up budget (docs/BENCHMARKS.md). This reader indexes where each type record starts
//! (4 bytes per type) and reads names and members in place, on demand. It follows the format in
//! the kernel's Documentation/bpf/btf.rst; every read is bounds-checked, so a corrupt file (the
//! path can be given with `--btf`) is an error, never a panic.
use super::BpfError;

/// `BTF_MAGIC`, as read in this machine's byte order.
const MAGIC: u16 = 0xeb9f;
/// `struct btf_header`: magic, version, flags, hdr_len, type_off, type_len, str_off, str_len.
const HEADER_LEN: usize = 24;
/// `struct btf_type`: name_off, info, size or type.
const TYPE_LEN: usize = 12;

/// Kinds (`BTF_KIND_*`) this reader looks at.
mod kind {
    pub const INT: u8 = 1;
    pub const ARRAY: u8 = 3;
    pub const STRUCT: u8 = 4;
    pub const UNION: u8 = 5;
    pub const ENUM: u8 = 6;
    pub const FWD: u8 = 7;
    pub const TYPEDEF: u8 = 8;
    pub const VOLATILE: u8 = 9;
    pub const CONST: u8 = 10;
    pub const RESTRICT: u8 = 11;
    pub const FUNC_PROTO: u8 = 13;
    pub const VAR: u8 = 14;
    pub const DATASEC: u8 = 15;
    pub const DECL_TAG: u8 = 17;
    pub const TYPE_TAG: u8 = 18;
    pub const ENUM64: u8 = 19;
    /// Kinds up to this one are known; a later one has a size this reader cannot know.
    pub const LAST: u8 = 19;
}

/// The kernel's BTF, borrowed: the bytes are read once and parsed in place.
pub struct KernelBtf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Where each type's record starts in `types`: type id `n` is `starts[n - 1]` (id 0 is void).
    starts: Vec<u32>,
}

/// One type record, as stored.
#[derive(Clone, Copy)]
struct Type {
    name_off: u32,
    kind: u8,
    vlen: u16,
    kind_flag: bool,
    /// The size (structs, unions) or the referred type (typedefs, qualifiers, pointers).
    size_or_type: u32,
    /// Where the record's trailing data (members) starts in `types`.
    extra: usize,
}

/// A struct or union member.
pub struct Member<'a> {
    pub name: &'a str,
    pub type_id: u32,
    /// From the start of the enclosing struct.
    pub bit_offset: u32,
}

impl<'a> KernelBtf<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<KernelBtf<'a>, String> {
        let u32_at = |at: usize| read_u32(bytes, at).ok_or("the file ends inside its header");
        let magic = bytes
            .get(..2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
            .ok_or("the file is empty")?;
        if magic != MAGIC {
            return Err(if magic == MAGIC.swap_bytes() {
                "BTF of the other byte order".to_owned()
            } else {
                "not BTF (bad magic number)".to_owned()
            });
        }
        let header_len = u32_at(4)? as usize;
        if header_len < HEADER_LEN {
            return Err(format!("header of {header_len} bytes is too short"));
        }
        let section = |off: usize, len: usize, what: &str| -> Result<&'a [u8], String> {
            let at = read_u32(bytes, off).ok_or("the file ends inside its header")? as usize;
            let size = read_u32(bytes, len).ok_or("the file ends inside its header")? as usize;
            header_len
                .checked_add(at)
                .and_then(|start| Some(start..start.checked_add(size)?))
                .and_then(|range| bytes.get(range))
                .ok_or_else(|| format!("its {what} section lies past the end of the file"))
        };
        let types = section(8, 12, "type")?;
        let strings = section(16, 20, "string")?;
        let mut btf = KernelBtf {
            types,
            strings,
            starts: Vec::with_capacity(types.len() / 20),
        };
        let mut at = 0usize;
        while at < types.len() {
            let ty = btf
                .record_at(at)
                .ok_or_else(|| format!("type {} is cut short", btf.starts.len() + 1))?;
            btf.starts.push(at as u32);
            at = ty.extra
                + trailing_len(&ty).ok_or_else(|| {
                    format!(
                        "type {} has kind {}, which this reader does not know",
                        btf.starts.len(),
                        ty.kind
                    )
                })?;
        }
        if at != types.len() {
            return Err("the last type runs past its section".to_owned());
        }
        Ok(btf)
    }

    /// The id of the complete struct called `name` (not a forward declaration).
    pub fn struct_named(&self, name: &str) -> Option<u32> {
        self.ids().find(|&id| {
            self.ty(id).is_some_and(|ty| {
                ty.kind == kind::STRUCT && ty.vlen > 0 && self.name(ty.name_off) == Some(name)
            })
        })
    }

    /// The members of the struct or union `id`, or `None` if it is neither.
    pub fn members(&self, id: u32) -> Option<impl Iterator<Item = Member<'a>> + '_> {
        let ty = self.ty(id)?;
        if ty.kind != kind::STRUCT && ty.kind != kind::UNION {
            return None;
        }
        Some((0..ty.vlen as usize).filter_map(move |i| {
            let at = ty.extra + i * 12;
            let offset = read_u32(self.types, at + 8)?;
            Some(Member {
                name: self.name(read_u32(self.types, at)?)?,
                type_id: read_u32(self.types, at + 4)?,
                // With kind_flag, the top 8 bits hold a bitfield's size.
                bit_offset: if ty.kind_flag {
                    offset & 0x00ff_ffff
                } else {
                    offset
                },
            })
        }))
    }

    /// The struct or union behind `id`, through typedefs, qualifiers and forward declarations.
    pub fn as_struct(&self, mut id: u32) -> Option<u32> {
        for _ in 0..32 {
            let ty = self.ty(id)?;
            match ty.kind {
                kind::STRUCT | kind::UNION => return Some(id),
                kind::TYPEDEF | kind::VOLATILE | kind::CONST | kind::RESTRICT | kind::TYPE_TAG => {
                    id = ty.size_or_type;
                }
                kind::FWD => return self.struct_named(self.name(ty.name_off)?),
                _ => return None,
            }
        }
        None
    }

    fn ids(&self) -> impl Iterator<Item = u32> {
        1..=self.starts.len() as u32
    }

    fn ty(&self, id: u32) -> Option<Type> {
        let start = *self.starts.get((id as usize).checked_sub(1)?)?;
        self.record_at(start as usize)
    }

    fn record_at(&self, at: usize) -> Option<Type> {
        let info = read_u32(self.types, at + 4)?;
        Some(Type {
            name_off: read_u32(self.types, at)?,
            kind: ((info >> 24) & 0x1f) as u8,
            vlen: (info & 0xffff) as u16,
            kind_flag: info >> 31 == 1,
            size_or_type: read_u32(self.types, at + 8)?,
            extra: at + TYPE_LEN,
        })
    }

    /// The NUL-terminated string at `offset` in the string section.
    fn name(&self, offset: u32) -> Option<&'a str> {
        let rest = self.strings.get(offset as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }
}

/// Bytes after the fixed record, by kind.
fn trailing_len(ty: &Type) -> Option<usize> {
    let vlen = ty.vlen as usize;
    Some(match ty.kind {
        kind::INT | kind::VAR | kind::DECL_TAG => 4,
        kind::ARRAY => 12,
        kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => vlen * 12,
        kind::ENUM | kind::FUNC_PROTO => vlen * 8,
        0..=kind::LAST => 0,
        _ => return None,
    })
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// Bit offset of a (possibly bit-) field `path` inside `struct ty`.
pub fn field_bit_offset(btf: &KernelBtf<'_>, ty: &str, path: &str) -> Result<u32, BpfError> {
    let missing = || BpfError::MissingField {
        field: format!("{ty}.{path}"),
    };
    let mut current = btf.struct_named(ty).ok_or_else(missing)?;
    let mut total_bits = 0u32;
    let mut fields = path.split('.').peekable();
    while let Some(field) = fields.next() {
        let (bits, member_type) = find_member(btf, current, field, 0).ok_or_else(missing)?;
        total_bits = total_bits.checked_add(bits).ok_or_else(missing)?;
        if fields.peek().is_some() {
            current = btf.as_struct(member_type).ok_or_else(missing)?;
        }
    }
    Ok(total_bits)
}

/// Byte offset of `path` (dotted, e.g. `pwd.dentry`) inside `struct ty`. Anonymous struct and
/// union members are searched through, as C does.
pub fn field_offset(btf: &KernelBtf<'_>, ty: &str, path: &str) -> Result<u32, BpfError> {
    let bits = field_bit_offset(btf, ty, path)?;
    if bits % 8 != 0 {
        return Err(BpfError::MissingField {
            field: format!("{ty}.{path} (a bitfield)"),
        });
    }
    Ok(bits / 8)
}

/// Anonymous members nest a few levels in real kernels; a deeper chain is a corrupt file.
const MAX_ANONYMOUS_DEPTH: u32 = 16;

/// Finds `name` among the members of struct or union `id`, descending into anonymous members.
/// Returns its bit offset from the start of `id`, and its type.
fn find_member(btf: &KernelBtf<'_>, id: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
    if depth > MAX_ANONYMOUS_DEPTH {
        return None;
    }
    for member in btf.members(id)? {
        if member.name == name {
            return Some((member.bit_offset, member.type_id));
        }
        if member.name.is_empty()
            && let Some(inner) = btf.as_struct(member.type_id)
            && let Some((bits, ty)) = find_member(btf, inner, name, depth + 1)
        {
            return Some((member.bit_offset.checked_add(bits)?, ty));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: header, then `types` and `strings`.
    fn blob(types: &[u32], strings: &[u8]) -> Vec<u8> {
        let type_bytes: Vec<u8> = types.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let mut out = Vec::new();
        out.extend(MAGIC.to_ne_bytes());
        out.extend([1u8, 0]);
        for word in [
            HEADER_LEN as u32,
            0,
            type_bytes.len() as u32,
            type_bytes.len() as u32,
            strings.len() as u32,
        ] {
            out.extend(word.to_ne_bytes());
        }
        out.extend(type_bytes);
        out.extend(strings);
        out
    }

    fn info(kind: u8, vlen: u16, kind_flag: bool) -> u32 {
        (u32::from(kind_flag) << 31) | (u32::from(kind) << 24) | u32::from(vlen)
    }

    /// `int`, `struct outer { int a; struct { int b; }; int c:3 at bit 68 }`, and a typedef.
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0outer\0a\0b\0c\0btf_trace_x\0";
        let types = [
            // 1: int
            1,
            info(kind::INT, 0, false),
            4,
            32,
            // 2: anonymous struct { int b; }
            0,
            info(kind::STRUCT, 1, false),
            4,
            13,
            1,
            0,
            // 3: struct outer (kind_flag: bitfield sizes in the top byte)
            5,
            info(kind::STRUCT, 3, true),
            12,
            11,
            1,
            0,
            0,
            2,
            32,
            15,
            1,
            (3 << 24) | 68,
            // 4: typedef btf_trace_x -> 3
            17,
            info(kind::TYPEDEF, 0, false),
            3,
        ];
        blob(&types, strings)
    }

    #[test]
    fn finds_structs_members_and_tracepoints() {
        let bytes = sample();
        let btf = KernelBtf::parse(&bytes).unwrap();
        let outer = btf.struct_named("outer").unwrap();
        assert_eq!(outer, 3);
        let members: Vec<(String, u32, u32)> = btf
            .members(outer)
            .unwrap()
            .map(|m| (m.name.to_owned(), m.type_id, m.bit_offset))
            .collect();
        assert_eq!(
            members,
            [("a".into(), 1, 0), ("".into(), 2, 32), ("c".into(), 1, 68)]
        );
        assert_eq!(btf.as_struct(4), Some(3), "through the typedef");
        assert!(btf.struct_named("int").is_none());
    }

    #[test]
    fn corrupt_files_are_errors() {
        let good = sample();
        assert!(KernelBtf::parse(&[]).is_err());
        assert!(KernelBtf::parse(&good[..10]).is_err());
        assert!(KernelBtf::parse(&good[..good.len() - 30]).is_err());
        let mut swapped = good.clone();
        swapped.swap(0, 1);
        assert!(
            KernelBtf::parse(&swapped)
                .err()
                .unwrap()
                .contains("byte order")
        );
        // Every truncation and every single-byte change parses or fails; none panics.
        for cut in 0..good.len() {
            let _ = KernelBtf::parse(&good[..cut]);
        }
        for at in 0..good.len() {
            let mut bent = good.clone();
            bent[at] ^= 0xff;
            if let Ok(btf) = KernelBtf::parse(&bent) {
                for id in 0..6 {
                    let _ = btf.as_struct(id);
                    let _ = btf.members(id).map(|m| m.count());
                }
            }
        }
    }
}
