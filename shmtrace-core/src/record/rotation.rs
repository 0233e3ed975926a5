//! Names of the files of a rotated recording (and of flight-recorder dumps):
//! `trace.shmtrace` becomes `trace.000000.shmtrace`, `trace.000001.shmtrace`, ... Six digits, so
//! that `ls` sorts them in recording order; readers sort by the parsed number anyway.
use std::{
    io,
    path::{Path, PathBuf},
};

/// The file number `sequence` of the recording named `path`.
pub fn numbered(path: &Path, sequence: u32) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{sequence:06}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{sequence:06}"),
    };
    path.with_file_name(name)
}

/// The sequence number of `candidate` if it is one of `path`'s numbered files.
pub fn sequence_of(path: &Path, candidate: &Path) -> Option<u32> {
    if candidate.parent() != path.parent()
        && !(candidate.parent() == Some(Path::new("")) && path.parent() == Some(Path::new("")))
    {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    let name = candidate.file_name()?.to_str()?;
    let rest = name.strip_prefix(stem)?.strip_prefix('.')?;
    let digits = match path.extension() {
        Some(ext) => rest.strip_suffix(ext.to_str()?)?.strip_suffix('.')?,
        None => rest,
    };
    if digits.len() < 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The files of the recording named `path`, in order: `path` itself when it exists, otherwise
/// its numbered files. Empty when there are none.
pub fn discover(path: &Path) -> io::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    Ok(numbered_files(path)?
        .into_iter()
        .map(|(_, file)| file)
        .collect())
}

/// `path`'s numbered files with their numbers, in order.
pub fn numbered_files(path: &Path) -> io::Result<Vec<(u32, PathBuf)>> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(found),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let file = path.with_file_name(entry?.file_name());
        if let Some(sequence) = sequence_of(path, &file) {
            found.push((sequence, file));
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_sort_and_parse_back() {
        let base = Path::new("/tmp/run/trace.shmtrace");
        assert_eq!(
            numbered(base, 7),
            Path::new("/tmp/run/trace.000007.shmtrace")
        );
        assert_eq!(sequence_of(base, &numbered(base, 7)), Some(7));
        assert_eq!(
            sequence_of(base, &numbered(base, 1_234_567)),
            Some(1_234_567)
        );
        assert_eq!(
            sequence_of(base, Path::new("/tmp/run/trace.shmtrace")),
            None
        );
        assert_eq!(
            sequence_of(base, Path::new("/tmp/run/trace.12.shmtrace")),
            None
        );
        assert_eq!(
            sequence_of(base, Path::new("/tmp/other/trace.000001.shmtrace")),
            None
        );
        let bare = Path::new("trace");
        assert_eq!(numbered(bare, 0), Path::new("trace.000000"));
        assert_eq!(sequence_of(bare, Path::new("trace.000000")), Some(0));
    }
}
