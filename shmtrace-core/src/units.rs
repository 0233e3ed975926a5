//! Sizes and counts for people: `96.0 MiB`, `3 files`, and sizes as people (and tmpfs's
//! `size=` option) write them: `16M`, `512k`, `4096`. The one formatter and the one parser.

/// Binary units, one decimal, exact below 1 KiB (`512 B`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `1 file`, `3 files`: a count and the word for what it counts.
pub fn count(n: impl Into<u64>, thing: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {thing}")
    } else if thing.ends_with('s') || thing.ends_with('x') || thing.ends_with("ch") {
        format!("{n} {thing}es")
    } else {
        format!("{n} {thing}s")
    }
}

/// `16M`, `512K`, `2g`, `4096`: bytes, with an optional binary suffix (either case), as
/// command-line options and tmpfs's `size=` option write them.
pub fn parse(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'K' | 'k')) => (&text[..i], 10),
        Some((i, 'M' | 'm')) => (&text[..i], 20),
        Some((i, 'G' | 'g')) => (&text[..i], 30),
        _ => (text, 0),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 16M, 512K or 4096"))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_people_write() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1024), "1.0 KiB");
        assert_eq!(human(100_663_296), "96.0 MiB");
        assert_eq!(human(64 << 20), "64.0 MiB");
        assert_eq!(human((63 << 20) + (900 << 10)), "63.9 MiB");
        assert_eq!(human(u64::MAX), "16.0 EiB");
        assert_eq!(count(1u32, "file"), "1 file");
        assert_eq!(count(0u32, "file"), "0 files");
        assert_eq!(count(3u64, "DataLoader worker"), "3 DataLoader workers");
    }

    #[test]
    fn parses_like_people_and_tmpfs_write() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("512K"), Ok(512 << 10));
        assert_eq!(parse("65536k"), Ok(64 << 20));
        assert_eq!(parse(" 16M "), Ok(16 << 20));
        assert_eq!(parse("2g"), Ok(2 << 30));
        assert!(parse("16 MiB").unwrap_err().contains("not a size like 16M"));
        assert!(parse("").is_err());
        assert!(parse("-1").is_err());
        assert!(parse("99999999999G").unwrap_err().contains("too large"));
    }
}
