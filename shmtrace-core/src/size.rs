//! Counts for people: `96.0 MiB`, `3 files`.

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
    } else {
        format!("{n} {thing}s")
    }
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
}
