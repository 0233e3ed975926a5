//! One value of a flat JSON object, written the short way when it is a plain one.
//!
//! Most values of an event's line are numbers, `null`s and strings with nothing to escape
//! (times, paths, flag names, addresses). serde_json writes a string in three pieces and
//! looks each byte up in its escape table: 200 instructions a string, a seventh of a replay
//! (by callgrind). [`write`] checks eight bytes at a time instead, and copies the string at
//! once when none needs escaping; any other value (a string that needs escaping, a float, a
//! nested object, a list holding one) is handed to serde_json whole, and what was written of
//! it is cut first. So the bytes are serde_json's, always (the tests here and in
//! `flat_struct` compare them).
use std::fmt;

use serde::{
    Serialize, Serializer,
    ser::{self, Impossible},
};

/// Appends `value` as serde_json's compact writer would.
pub fn write<T: ?Sized + Serialize>(out: &mut Vec<u8>, value: &T) -> Result<(), serde_json::Error> {
    let at = out.len();
    match value.serialize(Plain { out: &mut *out }) {
        Ok(()) => Ok(()),
        Err(NotPlain) => {
            // A list refused part way leaves its start: serde_json writes it all again.
            out.truncate(at);
            value.serialize(&mut serde_json::Serializer::new(out))
        }
    }
}

/// Appends `bytes`, copying short ones in place: a line's thirty keys and values would
/// otherwise each be a call to `memcpy`, together a seventh of a replay's time (by `perf`).
#[inline(always)]
pub fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    put_between(out, b"", bytes, b"");
}

/// Appends `open`, `bytes` and `close` with one check of the room left: `open` and `close`
/// are a few bytes of punctuation (`,"` before a key, `":` after it).
#[inline(always)]
pub fn put_between(out: &mut Vec<u8>, open: &[u8], bytes: &[u8], close: &[u8]) {
    let n = bytes.len();
    let total = open.len() + n + close.len();
    out.reserve(total);
    let len = out.len();
    // SAFETY: `reserve` made room for `total` more bytes after `len`, which are all written
    // before the length takes them in: `open`, then `bytes` (see `copy`), then `close`.
    unsafe {
        let mut dst = out.as_mut_ptr().add(len);
        for &b in open {
            *dst = b;
            dst = dst.add(1);
        }
        copy(bytes, dst);
        dst = dst.add(n);
        for &b in close {
            *dst = b;
            dst = dst.add(1);
        }
        out.set_len(len + total);
    }
}

/// Copies `bytes` to `dst`; up to 32 bytes as two overlapping loads and stores, which a call
/// to `memcpy` costs more than.
///
/// # Safety
/// `dst` must be valid for writing `bytes.len()` bytes, and not overlap `bytes`.
#[inline(always)]
unsafe fn copy(bytes: &[u8], dst: *mut u8) {
    let n = bytes.len();
    let src = bytes.as_ptr();
    // SAFETY: each read is within `bytes` (two halves of at least half of `n` each, from
    // its start and up to its end), and each write within the `n` bytes at `dst`.
    unsafe {
        if n > 32 {
            std::ptr::copy_nonoverlapping(src, dst, n);
        } else if n >= 16 {
            let head = src.cast::<u128>().read_unaligned();
            let tail = src.add(n - 16).cast::<u128>().read_unaligned();
            dst.cast::<u128>().write_unaligned(head);
            dst.add(n - 16).cast::<u128>().write_unaligned(tail);
        } else if n >= 8 {
            let head = src.cast::<u64>().read_unaligned();
            let tail = src.add(n - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(head);
            dst.add(n - 8).cast::<u64>().write_unaligned(tail);
        } else if n >= 4 {
            let head = src.cast::<u32>().read_unaligned();
            let tail = src.add(n - 4).cast::<u32>().read_unaligned();
            dst.cast::<u32>().write_unaligned(head);
            dst.add(n - 4).cast::<u32>().write_unaligned(tail);
        } else if n > 0 {
            // One to three bytes: the first, the middle and the last (a loop would become a
            // call to `memcpy`).
            *dst = *src;
            *dst.add(n / 2) = *src.add(n / 2);
            *dst.add(n - 1) = *src.add(n - 1);
        }
    }
}

/// Whether a byte of `bytes` needs escaping in JSON: a control character (below 0x20), a
/// quote or a backslash, as serde_json's escape table says. Bytes of multi-byte characters
/// are all 0x80 or more, and are written as they are.
fn needs_escaping(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    /// Whether a byte of `word` is a control character, a quote or a backslash: each test is
    /// "a byte below n" (`(x - n...) & !x & 0x80...`), exact as a yes or no, though not as
    /// to which byte; bytes of 0x80 or more never pass.
    fn in_word(word: u64) -> bool {
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let control = word.wrapping_sub(ONES * 0x20) & !word;
        let quote = quote.wrapping_sub(ONES) & !quote;
        let backslash = backslash.wrapping_sub(ONES) & !backslash;
        (control | quote | backslash) & HIGH != 0
    }
    fn word(bytes: &[u8]) -> u64 {
        u64::from_ne_bytes(bytes.try_into().expect("eight bytes"))
    }
    /// Four bytes in a word whose other four are a letter, which never needs escaping.
    fn half_word(bytes: &[u8]) -> u64 {
        let half = u32::from_ne_bytes(bytes.try_into().expect("four bytes"));
        u64::from(half) | (u64::from(u32::from_ne_bytes([b'a'; 4])) << 32)
    }
    match bytes.len() {
        0..4 => bytes.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\'),
        n @ 4..8 => in_word(half_word(&bytes[..4])) || in_word(half_word(&bytes[n - 4..])),
        n => {
            let mut chunks = bytes.chunks_exact(8);
            // The last eight bytes overlap the whole words before them: a yes or no is all
            // that is asked.
            chunks.any(|chunk| in_word(word(chunk))) || in_word(word(&bytes[n - 8..]))
        }
    }
}

/// The name under which [`verbatim`] text passes: to serde_json, a newtype like any other,
/// written as the text inside it.
const VERBATIM: &str = "shmtrace::verbatim";

/// Serializes text shmtrace made itself from digits and fixed names (a time, flag names, an
/// address), which never needs escaping: a flat line copies it without checking its bytes.
/// Never for text from a traced program or a trace file.
pub fn verbatim<T: AsRef<str> + ?Sized, S: Serializer>(
    text: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_newtype_struct(VERBATIM, text.as_ref())
}

/// [`verbatim`], for an optional field.
pub fn verbatim_option<T: AsRef<str>, S: Serializer>(
    text: &Option<T>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    struct Verbatim<'a>(&'a str);
    impl Serialize for Verbatim<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            verbatim(self.0, serializer)
        }
    }
    match text {
        Some(text) => serializer.serialize_some(&Verbatim(text.as_ref())),
        None => serializer.serialize_none(),
    }
}

/// Writes the string of a [`verbatim`] newtype as it is; refuses anything else.
struct VerbatimText<'a> {
    out: &'a mut Vec<u8>,
}

/// Serializer methods for what a serializer here does not write: refused.
macro_rules! not_plain {
    ($($method:ident($($arg:ty),*) -> $ok:ty;)*) => {
        $(
            fn $method(self, $(_: $arg),*) -> Result<$ok, NotPlain> {
                Err(NotPlain)
            }
        )*
    };
}

impl Serializer for VerbatimText<'_> {
    type Ok = ();
    type Error = NotPlain;
    type SerializeSeq = Impossible<(), NotPlain>;
    type SerializeTuple = Impossible<(), NotPlain>;
    type SerializeTupleStruct = Impossible<(), NotPlain>;
    type SerializeTupleVariant = Impossible<(), NotPlain>;
    type SerializeMap = Impossible<(), NotPlain>;
    type SerializeStruct = Impossible<(), NotPlain>;
    type SerializeStructVariant = Impossible<(), NotPlain>;

    fn serialize_str(self, value: &str) -> Result<(), NotPlain> {
        debug_assert!(
            !needs_escaping(value.as_bytes()),
            "{value:?} passed as verbatim"
        );
        put_between(self.out, b"\"", value.as_bytes(), b"\"");
        Ok(())
    }

    not_plain! {
        serialize_bool(bool) -> ();
        serialize_i8(i8) -> ();
        serialize_i16(i16) -> ();
        serialize_i32(i32) -> ();
        serialize_i64(i64) -> ();
        serialize_u8(u8) -> ();
        serialize_u16(u16) -> ();
        serialize_u32(u32) -> ();
        serialize_u64(u64) -> ();
        serialize_f32(f32) -> ();
        serialize_f64(f64) -> ();
        serialize_char(char) -> ();
        serialize_bytes(&[u8]) -> ();
        serialize_none() -> ();
        serialize_unit() -> ();
        serialize_unit_struct(&'static str) -> ();
        serialize_unit_variant(&'static str, u32, &'static str) -> ();
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct(&'static str, usize) -> Self::SerializeStruct;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<(), NotPlain> {
        Err(NotPlain)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), NotPlain> {
        Err(NotPlain)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), NotPlain> {
        Err(NotPlain)
    }

    fn collect_str<T: ?Sized + fmt::Display>(self, _: &T) -> Result<(), NotPlain> {
        Err(NotPlain)
    }
}

/// The value is not one [`Plain`] writes: serde_json writes it.
#[derive(Debug)]
struct NotPlain;

impl fmt::Display for NotPlain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a plain JSON value")
    }
}

impl std::error::Error for NotPlain {}

impl ser::Error for NotPlain {
    fn custom<T: fmt::Display>(_: T) -> NotPlain {
        NotPlain
    }
}

/// Writes numbers, booleans, `null`s, strings with nothing to escape and lists of those;
/// refuses anything else.
struct Plain<'a> {
    out: &'a mut Vec<u8>,
}

impl Plain<'_> {
    fn integer(self, text: &str) -> Result<(), NotPlain> {
        put(self.out, text.as_bytes());
        Ok(())
    }
}

macro_rules! integers {
    ($($method:ident($ty:ty);)*) => {
        $(
            // serde_json writes integers with `itoa` too.
            fn $method(self, value: $ty) -> Result<(), NotPlain> {
                self.integer(itoa::Buffer::new().format(value))
            }
        )*
    };
}

impl<'a> Serializer for Plain<'a> {
    type Ok = ();
    type Error = NotPlain;
    type SerializeSeq = PlainList<'a>;
    type SerializeTuple = Impossible<(), NotPlain>;
    type SerializeTupleStruct = Impossible<(), NotPlain>;
    type SerializeTupleVariant = Impossible<(), NotPlain>;
    type SerializeMap = Impossible<(), NotPlain>;
    type SerializeStruct = Impossible<(), NotPlain>;
    type SerializeStructVariant = Impossible<(), NotPlain>;

    integers! {
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
    }

    fn serialize_bool(self, value: bool) -> Result<(), NotPlain> {
        put(self.out, if value { b"true" } else { b"false" });
        Ok(())
    }

    fn serialize_str(self, value: &str) -> Result<(), NotPlain> {
        let bytes = value.as_bytes();
        if needs_escaping(bytes) {
            return Err(NotPlain);
        }
        put_between(self.out, b"\"", bytes, b"\"");
        Ok(())
    }

    fn serialize_none(self) -> Result<(), NotPlain> {
        put(self.out, b"null");
        Ok(())
    }

    fn serialize_unit(self) -> Result<(), NotPlain> {
        self.serialize_none()
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), NotPlain> {
        self.serialize_none()
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), NotPlain> {
        self.serialize_str(variant)
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), NotPlain> {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), NotPlain> {
        if name == VERBATIM {
            return value.serialize(VerbatimText { out: self.out });
        }
        value.serialize(self)
    }

    not_plain! {
        serialize_f32(f32) -> ();
        serialize_f64(f64) -> ();
        serialize_i128(i128) -> ();
        serialize_u128(u128) -> ();
        serialize_char(char) -> ();
        serialize_bytes(&[u8]) -> ();
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct(&'static str, usize) -> Self::SerializeStruct;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }

    /// A list of plain values (the names an event freed); a list with anything else in it
    /// is written again by serde_json, from where it started ([`write`] cuts what was
    /// written of it).
    fn serialize_seq(self, _: Option<usize>) -> Result<PlainList<'a>, NotPlain> {
        self.out.push(b'[');
        Ok(PlainList {
            out: self.out,
            first: true,
        })
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), NotPlain> {
        Err(NotPlain)
    }

    fn collect_str<T: ?Sized + fmt::Display>(self, _: &T) -> Result<(), NotPlain> {
        Err(NotPlain)
    }
}

/// The elements of a list, as serde_json writes them: `[a,b]`.
struct PlainList<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl ser::SerializeSeq for PlainList<'_> {
    type Ok = ();
    type Error = NotPlain;

    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), NotPlain> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        value.serialize(Plain {
            out: &mut *self.out,
        })
    }

    fn end(self) -> Result<(), NotPlain> {
        self.out.push(b']');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both<T: Serialize>(value: &T) {
        let mut out = b"before".to_vec();
        write(&mut out, value).unwrap();
        let mut expected = b"before".to_vec();
        expected.extend(serde_json::to_vec(value).unwrap());
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected)
        );
    }

    #[test]
    fn put_appends_every_length() {
        let source: Vec<u8> = (0..100u8).collect();
        for n in 0..=source.len() {
            for before in [0, 1, 7, 1000] {
                let mut out = vec![b'x'; before];
                put(&mut out, &source[..n]);
                assert_eq!(out.len(), before + n);
                assert!(out[..before].iter().all(|&b| b == b'x'));
                assert_eq!(&out[before..], &source[..n]);
            }
        }
    }

    #[test]
    fn put_between_frames_every_length() {
        let source: Vec<u8> = (0..100u8).collect();
        for n in 0..=source.len() {
            let mut out = b"x".to_vec();
            put_between(&mut out, b",\"", &source[..n], b"\":");
            let mut expected = b"x,\"".to_vec();
            expected.extend(&source[..n]);
            expected.extend(b"\":");
            assert_eq!(out, expected);
        }
    }

    #[test]
    fn every_byte_is_escaped_as_serde_json_does() {
        // Each byte alone, and at every place of a word and of the tail.
        for byte in 0..=0x7fu8 {
            for before in 0..17 {
                let mut text = "a".repeat(before);
                text.push(char::from(byte));
                text.push_str("tail");
                both(&text);
                assert_eq!(
                    needs_escaping(text.as_bytes()),
                    byte < 0x20 || byte == b'"' || byte == b'\\',
                    "{text:?}"
                );
            }
        }
    }

    #[test]
    fn values_come_out_as_serde_json_writes_them() {
        #[derive(Serialize)]
        enum Kind {
            Plain,
            #[serde(rename = "with \"quote\"")]
            Quoted,
            Tuple(u8, u8),
        }
        #[derive(Serialize)]
        struct Wrapped<'a>(&'a str);
        for text in [
            "",
            "/dev/shm/torch_1_2",
            "é, ü, 数据, 🙂",
            "\u{7f}",
            "a\u{1b}[31m",
        ] {
            both(&text);
            both(&Some(text));
            both(&Wrapped(text));
        }
        both(&None::<u32>);
        both(&());
        both(&true);
        both(&false);
        both(&u64::MAX);
        both(&i64::MIN);
        both(&-1i32);
        both(&0u8);
        both(&1.5f64);
        both(&f64::NAN);
        both(&'"');
        both(&Kind::Plain);
        both(&Kind::Quoted);
        both(&Kind::Tuple(1, 2));
        both(&vec!["a", "\n"]);
        both(&vec!["a", "b"]);
        both(&Vec::<&str>::new());
        both(&vec![vec![1, 2], vec![]]);
        both(&vec![Some(1.5)]);
        both(&Some(vec![1, 2]));
        both(&std::collections::BTreeMap::from([("k\"", 1)]));
    }
}
