use super::*;

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
        fn f(x: crate::model::World) -> usize { crate::size::human(1).len() }
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
        "size::human",
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
    let of = |path: &str| module_of(Path::new(path)).join("::");
    assert_eq!(of("diagnose/mod.rs"), "diagnose");
    assert_eq!(of("diagnose/evidence.rs"), "diagnose::evidence");
    assert_eq!(of("lib.rs"), "");
    assert_eq!(of("safe_open_tests.rs"), "safe_open::tests");
    assert_eq!(of("record/tests/redaction.rs"), "record::tests::redaction");
}
