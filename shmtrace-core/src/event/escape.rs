//! Making names from traced processes safe to print.
//!
//! Process names, paths and arguments are chosen by whoever runs in the container, so they may
//! hold terminal escape sequences, newlines that forge extra output lines, bidirectional
//! overrides, or bytes that are not UTF-8. The escaping is injective (a backslash becomes `\\`),
//! so distinct names stay distinct.

/// Escapes a NUL-terminated (or NUL-padded) kernel string.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    self::bytes(&bytes[..end])
}

/// Escapes arbitrary bytes.
pub fn bytes(bytes: &[u8]) -> String {
    // The usual name or path is printable ASCII with nothing to escape: copied at once, as
    // every event's command name and path pass here.
    // A fold without an early exit, which the compiler turns into vector instructions.
    let plain_ascii = bytes.iter().fold(true, |plain, b| {
        plain & (0x20..0x7f).contains(b) & (*b != b'\\')
    });
    if plain_ascii {
        // SAFETY: printable ASCII, checked above, is UTF-8. Checking it again cost 1% of a
        // replay.
        return unsafe { std::str::from_utf8_unchecked(bytes) }.to_owned();
    }
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            push_char(&mut out, c);
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Escapes a string that is already UTF-8 (for example read from /proc).
pub fn text(s: &str) -> String {
    bytes(s.as_bytes())
}

/// Re-checks text that was escaped when it was recorded (names in a trace file): honest text
/// comes back unchanged, since backslashes are left alone, but a file from a stranger may hold
/// anything, so control and invisible characters are escaped again.
pub fn stored(s: &str) -> String {
    if !s.chars().any(needs_escape) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\\' {
            out.push(c);
        } else {
            push_char(&mut out, c);
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    (c as u32) < 0x20 || c == '\x7f' || is_invisible_control(c)
}

fn push_char(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
        c if is_invisible_control(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        c => out.push(c),
    }
}

/// C1 controls, and the format characters that reorder or hide text on a terminal.
fn is_invisible_control(c: char) -> bool {
    matches!(c as u32,
        0x80..=0x9f
        | 0x200b..=0x200f
        | 0x202a..=0x202e
        | 0x2066..=0x2069
        | 0xfeff)
}

/// `text` cut to at most `max` characters, with an ellipsis when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if max == 0 {
        return String::new();
    }
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_and_invalid_bytes() {
        assert_eq!(bytes(b"torch_1_2_0"), "torch_1_2_0");
        assert_eq!(bytes(b"a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(bytes(b"line\nfake"), "line\\nfake");
        assert_eq!(bytes(b"\xff\xfe"), "\\xff\\xfe");
        assert_eq!(bytes("r\u{202e}txt".as_bytes()), "r\\u{202e}txt");
        assert_eq!(bytes("caf\u{e9}".as_bytes()), "caf\u{e9}");
    }

    #[test]
    fn is_injective_on_backslashes() {
        assert_ne!(bytes(b"\\x1b"), bytes(b"\x1b"));
        assert_eq!(bytes(b"\\x1b"), "\\\\x1b");
    }

    #[test]
    fn stored_text_keeps_honest_escapes_and_catches_raw_controls() {
        let honest = bytes(b"evil\x1b]0;x\x07 \\ r\xff");
        assert_eq!(stored(&honest), honest);
        assert_eq!(stored("a\x1b[2Jb\u{202e}\\"), "a\\x1b[2Jb\\u{202e}\\");
        assert!(!stored("\x1b\x07\n\r\u{9b}").chars().any(needs_escape));
    }

    #[test]
    fn stops_at_nul() {
        assert_eq!(c_string(b"python3\0\0garbage"), "python3");
        assert_eq!(c_string(b"full_sixteen_ch!"), "full_sixteen_ch!");
    }

    #[test]
    fn truncates_by_characters() {
        assert_eq!(truncate("abcdef", 6), "abcdef");
        assert_eq!(truncate("abcdefg", 6), "abcde…");
        assert_eq!(truncate("ééééééé", 3), "éé…");
        assert_eq!(truncate("abc", 0), "");
    }
}
