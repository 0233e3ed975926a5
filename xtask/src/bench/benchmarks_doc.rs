//! docs/BENCHMARKS.md's generated parts: the targets' table, from [`target_list::TARGETS`], and
//! the latest full run, the report `cargo xtask bench --save` printed. Each sits between two
//! markers, and nothing between them is written by hand.
use std::fs;

use anyhow::{Context, Result, bail};

use super::target_list;

const DOC: &str = "docs/BENCHMARKS.md";

/// The markers around the targets' table.
const TARGETS: (&str, &str) = (
    "<!-- targets: written from xtask/src/bench/target_list.rs; its test checks it -->",
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
    let text = replace_between(&text, TARGETS, &target_list::catalogue())?;
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
            target_list::catalogue().trim(),
            "{DOC}'s targets table is not target_list::TARGETS': `cargo xtask bench --save` \
             writes it, or paste the right side"
        );
        assert!(!between(&text, LATEST_RUN).is_empty());
    }

    /// The latest run says when it ran and on what machine, first thing: a run without them
    /// cannot be read against another.
    #[test]
    fn the_latest_run_says_when_and_where_it_ran() {
        let text = fs::read_to_string(crate::root().join(DOC)).unwrap();
        let run = between(&text, LATEST_RUN);
        let started = run
            .strip_prefix("Run started 20")
            .unwrap_or_else(|| panic!("{DOC}'s latest run does not start with its date"));
        assert!(
            started
                .chars()
                .take(8)
                .all(|c| c.is_ascii_digit() || c == '-'),
            "{DOC}: no date after 'Run started': {}",
            &run[..run.len().min(80)]
        );
        assert!(
            run.lines().take(5).any(|l| l.starts_with("Machine: ")),
            "{DOC}'s latest run does not name its machine"
        );
    }

    /// The rows of the table under `header` in `text`: their cells, trimmed.
    fn table_rows<'a>(text: &'a str, header: &str) -> Vec<Vec<&'a str>> {
        let from = text
            .find(header)
            .unwrap_or_else(|| panic!("{DOC} lacks {header}"));
        text[from..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
            .collect()
    }

    /// Every option of `cargo xtask bench` has a row in the page's table of flags.
    #[test]
    fn the_page_explains_every_flag() {
        let text = fs::read_to_string(crate::root().join(DOC)).unwrap();
        let flags: String = table_rows(&text, "| flag | what it does |")
            .iter()
            .map(|cells| cells[0])
            .collect();
        let command =
            <super::super::BenchArgs as clap::Args>::augment_args(clap::Command::new("bench"));
        let missing: Vec<String> = command
            .get_arguments()
            .filter_map(|arg| arg.get_long())
            .filter(|long| !flags.contains(&format!("`--{long}")))
            .map(|long| format!("--{long}"))
            .collect();
        assert!(
            missing.is_empty(),
            "{DOC}'s table of flags lacks {missing:?}"
        );
    }

    /// Every variant has a row in the page's table of variants, under its name and label.
    #[test]
    fn the_page_lists_every_variant() {
        let text = fs::read_to_string(crate::root().join(DOC)).unwrap();
        let rows = table_rows(&text, "| name | row label | what runs |");
        for variant in &super::super::variants::ALL {
            let listed = rows.iter().any(|cells| {
                cells[0].split(", ").any(|name| name == variant.name)
                    && cells[1].contains(variant.label)
            });
            assert!(
                listed,
                "{DOC}'s table of variants lacks {} ({})",
                variant.name, variant.label
            );
        }
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
