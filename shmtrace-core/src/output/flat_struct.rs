//! A JSON object from a flat struct, its keys written as they are.
//!
//! serde_json escapes every key on every call: for a JSON line of two dozen fixed keys that was
//! a quarter of replay's instructions (by callgrind). A struct's keys are its field names,
//! which never need escaping, so [`write`] writes them as they are and each value as
//! serde_json does ([`flat_value`]), and the line comes out byte for byte as
//! `serde_json::to_writer` writes it (`json_tests.rs` checks every kind of line). Only a
//! struct can be written so: anything else is an error.
use serde::{
    Serialize, Serializer,
    ser::{self, Impossible},
};

use super::flat_value;

type Error = serde_json::Error;

/// Appends `value`, a struct, as a compact JSON object.
pub fn write<T: Serialize>(out: &mut Vec<u8>, value: &T) -> Result<(), Error> {
    value.serialize(FlatStruct { out })
}

struct FlatStruct<'a> {
    out: &'a mut Vec<u8>,
}

/// The fields of the object being written.
struct Fields<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

fn not_a_struct() -> Error {
    ser::Error::custom("only a struct is written as a flat JSON object")
}

/// Serializer methods for what is not a struct: all refused.
macro_rules! refuse {
    ($($method:ident($($arg:ty),*) -> $ok:ty;)*) => {
        $(
            fn $method(self, $(_: $arg),*) -> Result<$ok, Error> {
                Err(not_a_struct())
            }
        )*
    };
}

impl<'a> Serializer for FlatStruct<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Impossible<(), Error>;
    type SerializeTuple = Impossible<(), Error>;
    type SerializeTupleStruct = Impossible<(), Error>;
    type SerializeTupleVariant = Impossible<(), Error>;
    type SerializeMap = Impossible<(), Error>;
    type SerializeStruct = Fields<'a>;
    type SerializeStructVariant = Impossible<(), Error>;

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Fields<'a>, Error> {
        self.out.push(b'{');
        Ok(Fields {
            out: self.out,
            first: true,
        })
    }

    refuse! {
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
        serialize_str(&str) -> ();
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
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<(), Error> {
        Err(not_a_struct())
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), Error> {
        Err(not_a_struct())
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Error> {
        Err(not_a_struct())
    }
}

impl ser::SerializeStruct for Fields<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        debug_assert!(
            key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "{key:?} would need escaping"
        );
        if self.first {
            flat_value::put_between(self.out, b"\"", key.as_bytes(), b"\":");
        } else {
            flat_value::put_between(self.out, b",\"", key.as_bytes(), b"\":");
        }
        self.first = false;
        flat_value::write(self.out, value)
    }

    fn end(self) -> Result<(), Error> {
        self.out.push(b'}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbatim_text_comes_out_as_serde_json_writes_it() {
        #[derive(Serialize)]
        struct Line<'a> {
            #[serde(serialize_with = "flat_value::verbatim")]
            ts: &'a str,
            #[serde(serialize_with = "flat_value::verbatim_option")]
            flags: Option<std::borrow::Cow<'a, str>>,
            #[serde(serialize_with = "flat_value::verbatim_option")]
            none: Option<&'a str>,
        }
        let line = Line {
            ts: "2026-12-01T05:15:31.650715499Z",
            flags: Some("O_RDWR|O_CREAT".into()),
            none: None,
        };
        let mut out = Vec::new();
        write(&mut out, &line).unwrap();
        assert_eq!(out, serde_json::to_vec(&line).unwrap());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"ts":"2026-12-01T05:15:31.650715499Z","flags":"O_RDWR|O_CREAT","none":null}"#
        );
    }

    #[test]
    fn anything_but_a_struct_is_refused() {
        let mut out = Vec::new();
        assert!(write(&mut out, &1u32).is_err());
        assert!(write(&mut out, &Some("a")).is_err());
        assert!(write(&mut out, &vec![1, 2]).is_err());
        assert!(write(&mut out, &std::collections::BTreeMap::from([("k", 1)])).is_err());
    }

    #[test]
    fn nested_values_are_serde_jsons() {
        #[derive(Serialize)]
        struct Inner<'a> {
            name: &'a str,
        }
        #[derive(Serialize)]
        struct Line<'a> {
            text: &'a str,
            none: Option<u8>,
            #[serde(skip_serializing_if = "Option::is_none")]
            skipped: Option<u8>,
            list: &'a [&'a str],
            inner: Inner<'a>,
        }
        let line = Line {
            text: "a \"quoted\"\n\u{1b}[31m line",
            none: None,
            skipped: None,
            list: &["x", "\\"],
            inner: Inner { name: "\u{7f}" },
        };
        let mut out = Vec::new();
        write(&mut out, &line).unwrap();
        assert_eq!(out, serde_json::to_vec(&line).unwrap());
    }

    #[test]
    fn strings_come_out_as_serde_json_writes_them() {
        #[derive(Serialize)]
        struct Name<'a>(&'a str);
        #[derive(Serialize)]
        struct Line<'a> {
            text: &'a str,
            maybe: Option<&'a str>,
            named: Name<'a>,
            number: u64,
        }
        for text in [
            "",
            "plain /dev/shm/torch_1_2",
            "quote \" and backslash \\",
            "tab\tnewline\ncarriage\r",
            "\u{1}\u{1f} control",
            "\u{7f} delete",
            "é, ü, 数据, 🙂",
            "\u{1b}[31mred\u{1b}[0m",
        ] {
            let line = Line {
                text,
                maybe: Some(text),
                named: Name(text),
                number: u64::MAX,
            };
            let mut out = Vec::new();
            write(&mut out, &line).unwrap();
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(&line).unwrap(),
                "{text:?}"
            );
        }
    }
}
