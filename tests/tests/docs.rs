//! The lists README.md and docs/ keep of what the code holds, checked against the code: a list
//! that can drift is one that is tested. No root, no containers: the files and the crates.
//! (xtask's own lists, the kernel matrix and the benchmark's targets, are checked by xtask's
//! tests.)
use std::{collections::BTreeSet, fs, path::Path};

use shmtrace_common::{Syscall, TracedAt};
use shmtrace_core::diagnose::known::KNOWN;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The `code` spans of `text`.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The README's list item that starts with `start`, through its last line.
fn item<'a>(text: &'a str, start: &str) -> &'a str {
    let at = text
        .find(start)
        .unwrap_or_else(|| panic!("no item starting {start:?}"));
    let rest = &text[at..];
    let end = rest[2..]
        .find("\n  - ")
        .or_else(|| rest.find("\n\n"))
        .map_or(rest.len(), |end| end + 2);
    &rest[..end]
}

/// README's "How it works" names every traced call once, under where it is traced, and the
/// count: what `Syscall::ALL` and `Syscall::traced_at` say.
#[test]
fn the_readme_names_each_traced_call_where_it_is_traced() {
    let readme = read("README.md");
    let names: BTreeSet<&str> = Syscall::ALL.iter().map(|call| call.name()).collect();
    let listed = |start: &str| -> BTreeSet<String> {
        code_spans(item(&readme, start))
            .into_iter()
            .filter(|span| names.contains(span))
            .map(str::to_owned)
            .collect()
    };
    let of = |at: TracedAt| -> BTreeSet<String> {
        Syscall::ALL
            .iter()
            .filter(|call| call.traced_at() == at)
            .map(|call| call.name().to_owned())
            .collect()
    };
    assert_eq!(listed("  - at both ends"), of(TracedAt::BothEnds));
    assert_eq!(listed("  - at their exit only"), of(TracedAt::Exit));
    assert_eq!(listed("  - at its entry only"), of(TracedAt::Entry));
    let count = format!("tracepoints of\n  {} calls", Syscall::ALL.len());
    assert!(readme.contains(&count), "README.md should say {count:?}");
}

/// docs/json.md's `event` field names every call a record can be of.
#[test]
fn the_json_schema_names_every_traced_call() {
    let json = read("docs/json.md");
    let row = json
        .lines()
        .find(|line| line.starts_with("| `event` |"))
        .expect("docs/json.md has the `event` row");
    let spans: BTreeSet<&str> = code_spans(row).into_iter().collect();
    let missing: Vec<&str> = Syscall::ALL
        .iter()
        .map(|call| call.name())
        .filter(|name| !spans.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/json.md's `event` lacks {missing:?}"
    );
}

/// Every file or folder README.md and docs/ name by its path from the repository's root
/// exists: a module moved or renamed takes its docs' paths with it. A path with a placeholder
/// (`<kind>`, `*`, `...`, `KERNEL`) names many and is not checked.
#[test]
fn the_docs_name_only_paths_that_exist() {
    const ROOTS: [&str; 11] = [
        "shmtrace/",
        "shmtrace-core/",
        "shmtrace-common/",
        "shmtrace-ebpf/",
        "shmtrace-workload/",
        "xtask/",
        "tests/",
        "deploy/",
        "fuzz/",
        "docs/",
        ".ci/",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages = vec!["README.md".to_owned()];
    for entry in fs::read_dir(root.join("docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            pages.push(format!("docs/{name}"));
        }
    }
    let mut checked = 0;
    let mut missing = Vec::new();
    for page in &pages {
        for span in code_spans(&read(page)) {
            let is_path = ROOTS.iter().any(|prefix| span.starts_with(prefix))
                && !span.contains(|c: char| c.is_whitespace() || "<>*".contains(c))
                && !span.contains("...")
                && !span.contains("KERNEL");
            if !is_path {
                continue;
            }
            checked += 1;
            if !root.join(span).exists() {
                missing.push(format!("{page}: {span}"));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: is the filter right?"
    );
    assert!(missing.is_empty(), "paths that do not exist: {missing:#?}");
}

/// docs/json.md's `program` row names every known /dev/shm user, as the table the diagnosis
/// reads (`KNOWN`) names it, and no other.
#[test]
fn the_json_schema_names_every_known_program() {
    let json = read("docs/json.md");
    let row = json
        .lines()
        .find(|line| line.starts_with("| `program`, `program_role` |"))
        .expect("docs/json.md has the `program` row");
    let listed = row
        .split_once("the known /dev/shm user it is (")
        .and_then(|(_, rest)| rest.split_once("; see"))
        .map(|(list, _)| list)
        .expect("the `program` row lists the known programs before `; see`");
    let listed: BTreeSet<&str> = code_spans(listed).into_iter().collect();
    let known: BTreeSet<&str> = KNOWN.iter().map(|known| known.program).collect();
    assert_eq!(
        listed, known,
        "docs/json.md's `program` row is not diagnose::known::KNOWN"
    );
}
