use std::fs;

use super::{circles::ModuleTree, *};

fn edges_of(text: &str, module: &str) -> Vec<Edge> {
    let module: Vec<String> = module.split("::").map(str::to_owned).collect();
    file_edges(text, &module, Path::new("test.rs")).unwrap()
}

/// The real sources: what CI holds them to.
#[test]
fn the_sources_import_only_downwards() {
    let root = crate::root();
    let mut problems = Vec::new();
    for layers in &CRATES {
        let edges = crate_edges(&root, layers).unwrap();
        // The parser saw the crate: a graph of a handful of edges would prove nothing.
        assert!(
            top_graph(&edges).len() >= 5,
            "{}: {:?}",
            layers.name,
            top_graph(&edges)
        );
        problems.extend(check(layers, &edges));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn finds_paths_in_use_trees_types_and_expressions() {
    let text = "
        use crate::{capacity::Capacity, event::{self, Body}};
        use super::{failure::Cause, known};
        fn f(x: crate::model::World) -> usize { crate::units::human(1).len() }
        mod tests { use super::*; use crate::record::*; }
    ";
    let to: BTreeSet<String> = edges_of(text, "diagnose::verdict")
        .into_iter()
        .map(|e| e.to)
        .collect();
    let expected = [
        "capacity::Capacity",
        "event",
        "event::Body",
        "diagnose::failure::Cause",
        "diagnose::known",
        "model::World",
        "units::human",
        "diagnose::verdict",
        "record",
    ];
    assert_eq!(to, expected.iter().map(|s| s.to_string()).collect());
}

#[test]
fn a_back_edge_is_named_with_its_file_and_path() {
    let core = &CRATES[0];
    // What issue 13 found: diagnosis borrowing output's size formatter.
    let edges = edges_of("use crate::output::human::Human;", "diagnose::verdict");
    let problems = check(core, &edges);
    assert_eq!(
        problems,
        [
            "shmtrace-core: `diagnose` imports `output`, a module above it: test.rs \
          (crate::output::human::Human)"
        ]
    );
    // Beside it is refused too: output and sizing are one layer.
    let problems = check(core, &edges_of("use crate::sizing::Sizer;", "output"));
    assert!(problems[0].contains("a module beside it"), "{problems:?}");
    // Downwards is fine.
    assert!(check(core, &edges_of("use crate::model::World;", "diagnose")).is_empty());
}

#[test]
fn a_client_importing_its_resolver_is_refused() {
    let binary = &CRATES[1];
    let edges = edges_of("use super::resolve::Resolver;", "container::docker");
    assert_eq!(edges[0].to, "container::resolve::Resolver");
    let problems = check(binary, &edges);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("a client below its resolver"));
    // The resolver using a client is the right way round.
    let edges = edges_of("use super::docker::DockerClient;", "container::resolve");
    assert!(check(binary, &edges).is_empty());
}

#[test]
fn the_core_counts_as_below_everything_in_the_binary() {
    let binary = &CRATES[1];
    let text = "use shmtrace_core::pipeline::Pipeline; use crate::{model::World, cli::Cli, run};";
    assert!(check(binary, &edges_of(text, "live::session")).is_empty());
    let problems = check(
        binary,
        &edges_of("use crate::live::Tracer;", "container::scan"),
    );
    assert!(
        problems[0].contains("`container` imports `live`"),
        "{problems:?}"
    );
}

#[test]
fn finds_a_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(from, to)| (from.to_string(), BTreeSet::from([to.to_string()])))
        .collect();
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    let mut no_cycle = graph.clone();
    no_cycle.remove("c");
    assert_eq!(find_cycle(&no_cycle), None);
}

#[test]
fn names_modules_by_their_files() {
    let src = crate::root().join("shmtrace-core/src");
    let tree = ModuleTree::walk(&src.join("lib.rs")).unwrap();
    let file_of = |module: &str| {
        let path: Vec<String> = module
            .split("::")
            .filter(|part| !part.is_empty())
            .map(str::to_owned)
            .collect();
        tree.files[&path].strip_prefix(&src).unwrap().to_owned()
    };
    assert_eq!(file_of("diagnose"), Path::new("diagnose/mod.rs"));
    assert_eq!(
        file_of("diagnose::evidence"),
        Path::new("diagnose/evidence.rs")
    );
    assert_eq!(file_of(""), Path::new("lib.rs"));
    // A `#[path]` file is the module that declares it.
    assert_eq!(file_of("safe_open::tests"), Path::new("safe_open_tests.rs"));
    assert_eq!(
        file_of("record::tests::redaction"),
        Path::new("record/tests/redaction.rs")
    );
    // An inline module is part of its file.
    assert_eq!(
        tree.module_holding(&["diagnose".into(), "evidence".into(), "tests".into()]),
        ["diagnose", "evidence"]
    );
}

/// A crate written to a scratch directory: `files` as (path under src, text).
fn scratch_crate(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtask-circles-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("src")).unwrap();
    fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"{name}\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\n[workspace]\n"
        ),
    )
    .unwrap();
    for (path, text) in files {
        let path = dir.join("src").join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    dir
}

/// What CI holds the sources to: not one circle in any crate of the workspace.
#[test]
fn no_crate_of_the_workspace_has_a_circle() {
    let (targets, problems) = circles::check_workspace(&crate::root()).unwrap();
    // Every crate was seen: the libraries, binaries and test targets of seven packages.
    assert!(targets >= 10, "{targets} targets");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A planted circle fails the check, named with its files; one between files below two
/// siblings counts between the siblings; a parent and its children are no circle.
#[test]
fn a_planted_circle_fails() {
    let dir = scratch_crate(
        "planted",
        &[
            (
                "lib.rs",
                "mod a; mod b; mod c; mod d; pub struct Root; fn f() { a::A; }",
            ),
            // a and b: each names the other.
            ("a.rs", "pub struct A; fn f() -> crate::b::B { todo!() }"),
            ("b.rs", "pub struct B; use super::a::A;"),
            // c/inner.rs names d, and d names c/inner.rs: c and d.
            (
                "c.rs",
                "pub mod inner; use self::inner::I; use super::Root;",
            ),
            (
                "c/inner.rs",
                "pub struct I; use crate::d::D; use super::super::Root;",
            ),
            ("d.rs", "pub struct D; use crate::c::inner::I;"),
        ],
    );
    let (_, problems) = circles::check_workspace(&dir).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].contains("a, b import each other")
            && problems[0].contains("src/a.rs (crate::b::B)")
            && problems[0].contains("src/b.rs (super::a::A)"),
        "{}",
        problems[0]
    );
    assert!(
        problems[1].contains("c, d import each other")
            && problems[1].contains("src/c/inner.rs (crate::d::D)"),
        "{}",
        problems[1]
    );

    // Broken the way the real ones were: what both use moved to a leaf.
    let dir = scratch_crate(
        "unplanted",
        &[
            ("lib.rs", "mod a; mod b; mod leaf;"),
            ("a.rs", "use crate::{b::B, leaf::L};"),
            ("b.rs", "pub struct B; use crate::leaf::L;"),
            ("leaf.rs", "pub struct L;"),
        ],
    );
    let (_, problems) = circles::check_workspace(&dir).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

/// docs/architecture.md's table of layers is `CRATES`, row by row.
#[test]
fn the_architecture_doc_shows_these_layers() {
    let text = fs::read_to_string(crate::root().join("docs/architecture.md")).unwrap();
    let spans = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let rows: Vec<Vec<String>> = text
        .lines()
        .skip_while(|line| !line.starts_with("| layer |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| line.split('|').map(str::to_owned).collect())
        .collect();
    let [core, binary] = &CRATES;
    assert_eq!(rows.len(), core.layers.len(), "{rows:?}");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(spans(&row[2]), core.layers[i], "row {}", i + 1);
        // The binary's bottom layer is the whole core, another crate.
        let expected: &[&str] = match i {
            0 => &[],
            i => binary.layers.get(i - 1).copied().unwrap_or(&[]),
        };
        assert_eq!(spans(&row[3]), expected, "row {}", i + 1);
    }
}
