//! docs/BENCHMARKS.md's generated parts: the targets' table, from [`targets::TARGETS`], and
//! the latest full run, the report `cargo xtask bench --save` printed. Each sits between two
//! markers, and nothing between them is written by hand.
use std::fs;

use anyhow::{Context, Result, bail};

use super::targets;

const DOC: &str = "docs/BENCHMARKS.md";

/// The markers around the targets' table.
const TARGETS: (&str, &str) = (
    "<!-- targets: written from xtask/src/bench/targets.rs; its test checks it -->",
    "<!-- end of targets -->",
);

/// The markers around the latest full run.
const LATEST_RUN: (&str, &str) = (
    "<!-- latest full run: written by cargo xtask bench --save -->",
    "<!-- end of the latest full run -->",
);

/// Writes `report`, a full run's, into docs/BENCHMARKS.md, and the targets' table with it.
pub fn save(report: &str) -> Result<()> {
    let path = crate::root().join(DOC);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {DOC}"))?;
    let text = replace_between(&text, TARGETS, &targets::catalogue())?;
    let text = replace_between(&text, LATEST_RUN, &demoted(report))?;
    fs::write(&path, text).with_context(|| format!("writing {DOC}"))?;
    eprintln!("wrote the run and the targets into {DOC}");
    Ok(())
}

/// The report as a part of the page: its title dropped (the page's section names it), every
/// other heading one level down.
fn demoted(report: &str) -> String {
    report
        .lines()
        .filter(|line| !line.starts_with("# "))
        .map(|line| {
            if line.starts_with('#') {
                format!("#{line}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_owned()
}

/// `text` with what lies between the two markers replaced by `content`.
fn replace_between(text: &str, (start, end): (&str, &str), content: &str) -> Result<String> {
    let (Some(from), Some(to)) = (text.find(start), text.find(end)) else {
        bail!("{DOC} lacks the markers {start} and {end}");
    };
    if to < from {
        bail!("{DOC}: {end} comes before {start}");
    }
    let from = from + start.len();
    Ok(format!(
        "{}\n\n{}\n\n{}",
        &text[..from],
        content.trim(),
        &text[to..]
    ))
}

/// What lies between the two markers, trimmed.
#[cfg(test)]
fn between<'a>(text: &'a str, (start, end): (&str, &str)) -> &'a str {
    let from = text.find(start).expect("start marker") + start.len();
    let to = text.find(end).expect("end marker");
    text[from..to].trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page lists every target with its bound, as the code judges them.
    #[test]
    fn the_page_lists_the_targets_the_code_judges() {
        let text = fs::read_to_string(crate::root().join(DOC)).unwrap();
        assert_eq!(
            between(&text, TARGETS),
            targets::catalogue().trim(),
            "{DOC}'s targets table is not targets::TARGETS': `cargo xtask bench --save` \
             writes it, or paste the right side"
        );
        assert!(!between(&text, LATEST_RUN).is_empty());
    }

    #[test]
    fn a_run_replaces_what_lies_between_the_markers_only() {
        let page = format!(
            "# Page\n\nbefore\n{}\nold run\n{}\nafter\n",
            LATEST_RUN.0, LATEST_RUN.1
        );
        let report = "# shmtrace benchmark\n\nMachine: x\n\n## 4.0 KiB\n\n### Paired\n";
        let written = replace_between(&page, LATEST_RUN, &demoted(report)).unwrap();
        assert_eq!(
            written,
            format!(
                "# Page\n\nbefore\n{}\n\nMachine: x\n\n### 4.0 KiB\n\n#### Paired\n\n{}\nafter\n",
                LATEST_RUN.0, LATEST_RUN.1
            )
        );
        assert!(replace_between("no markers", LATEST_RUN, "x").is_err());
    }
}
