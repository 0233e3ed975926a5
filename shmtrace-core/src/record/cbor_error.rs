//! Why CBOR in a trace file (its header, a userspace record) could not be decoded, as words:
//! ciborium's own `Display` is its `Debug` text (`Io(Error { kind: UnexpectedEof, .. })`),
//! which names neither what is wrong nor what to do.
use std::io;

use ciborium::de::Error;

use crate::event::escape;

/// What is wrong with the CBOR of `what` ("the header", "the record"), as a clause that follows
/// "could not be decoded: ".
pub(super) fn problem(error: &Error<io::Error>, what: &str) -> String {
    match error {
        Error::Io(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
            format!("{what} ends before its last field (it is shorter than its contents say)")
        }
        Error::Io(error) => format!("reading {what} failed ({error})"),
        Error::Syntax(offset) => format!("{what} is not valid CBOR at its byte {offset}"),
        // serde's message ("invalid type: string \"x\", expected u64") may quote the file.
        Error::Semantic(offset, message) => format!(
            "{what} holds something other than what shmtrace writes ({}{})",
            escape::text(message),
            offset
                .map(|at| format!(", at its byte {at}"))
                .unwrap_or_default()
        ),
        Error::RecursionLimitExceeded => {
            format!("{what} nests deeper than anything shmtrace writes")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> String {
        let error = ciborium::from_reader::<std::collections::BTreeMap<String, u64>, _>(bytes)
            .expect_err("not a map of integers");
        problem(&error, "the header")
    }

    #[test]
    fn every_kind_of_error_is_words_not_debug_text() {
        for (bytes, said) in [
            (&b"\xa1\x61"[..], "the header ends before its last field"),
            (
                &b"\xa1\x61a\x61b"[..],
                "the header holds something other than",
            ),
            (&b"\x1c"[..], "the header is not valid CBOR at its byte 0"),
        ] {
            let text = decode(bytes);
            assert!(text.contains(said), "{bytes:?}: {text}");
            for debug in ["Error {", "kind:", "Io(", "Semantic(", "Syntax("] {
                assert!(!text.contains(debug), "{bytes:?}: {text}");
            }
        }
    }

    #[test]
    fn quoted_file_contents_are_escaped() {
        let text = decode(b"\xa1\x61a\x62\x1b[");
        assert!(!text.contains('\x1b'), "{text:?}");
    }
}
