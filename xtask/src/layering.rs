//! `cargo xtask check-layers`: the modules of `shmtrace-core` and `shmtrace` import only
//! downwards (docs/architecture.md, "Arrows point down"), and no crate of the workspace has
//! modules that import each other (`circles`).
//!
//! Every source file is parsed (`syn`), and every path it names that leads into the crate
//! (`use crate::..`, `super::..`, `self::..`, `shmtrace_core::..`, in `use` items, types and
//! expressions alike) becomes an edge between the crate's top-level modules. A module may
//! import only modules of a lower layer; so the graph has no cycle, and an edge that breaks
//! a layer is named with the file and the path that makes it. A few finer rules ([`NEVER`])
//! name edges between sub-modules that must not exist.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};
use syn::visit::Visit;

use self::circles::ModuleTree;

/// One crate's layers, bottom first: a module imports only modules of layers below its own.
pub struct Layers {
    pub name: &'static str,
    /// The crate's `src` directory, from the workspace root.
    pub src: &'static str,
    pub layers: &'static [&'static [&'static str]],
    /// Names that stand for another crate below this one (`shmtrace_core`).
    pub below_all: &'static [&'static str],
}

/// The layers of docs/architecture.md.
pub const CRATES: [Layers; 2] = [
    Layers {
        name: "shmtrace-core",
        src: "shmtrace-core/src",
        layers: &[
            // Leaves: a capacity, the clock, sizes for people, how output files are opened.
            &["capacity", "clock", "units", "safe_open"],
            &["event"],
            &["model"],
            &["diagnose"],
            // Rendering and sizing read diagnoses; neither knows the other.
            &["output", "sizing"],
            // Trace files: no screen, no diagnosis, no kernel.
            &["record"],
            // One path for live and replayed records, through the sinks below it.
            &["pipeline"],
            // An observer the pipeline feeds, drawing a recorded trace.
            &["report"],
        ],
        below_all: &[],
    },
    Layers {
        name: "shmtrace",
        src: "shmtrace/src",
        layers: &[
            // Device numbers and namespaces; the command line's types and parsers.
            &["kernel_ids", "cli", "child"],
            // Runtimes' APIs, the cgroup scan, /dev/shm measurement.
            &["container"],
            // The unprivileged source: ptrace and seccomp filters, making the probes' records.
            &["ptrace"],
            // The probes, the session that feeds the core, the watcher, the targets.
            &["live"],
            // The subcommands, then the daemon, which reuses their output helpers.
            &["commands"],
            &["daemon"],
        ],
        below_all: &["shmtrace_core"],
    },
];

/// Edges between sub-modules that must not exist, though their layers allow them: a runtime
/// client must not import the resolver that uses it (it implements
/// `container::client::RuntimeClient`; `Candidate` and the label helpers live in `client.rs`).
pub const NEVER: [(&str, &str, &str); 2] = [
    (
        "container::docker",
        "container::resolve",
        "a client below its resolver",
    ),
    (
        "container::cri",
        "container::resolve",
        "a client below its resolver",
    ),
];

/// A path from one module into another, and where it was written.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// Module paths (`diagnose::evidence`), the crate root being empty.
    pub from: String,
    pub to: String,
    pub file: PathBuf,
    /// The path as written (`crate::output::size`).
    pub path: String,
}

impl Edge {
    fn top(module: &str) -> &str {
        module.split("::").next().unwrap_or(module)
    }
}

/// What `check-layers` runs: the layers of both crates, and circles in every crate. Prints the
/// layered crates' graphs; fails with every broken rule.
pub fn run() -> Result<()> {
    let root = crate::root();
    let mut problems = Vec::new();
    for layers in &CRATES {
        let edges = crate_edges(&root, layers)?;
        let graph = top_graph(&edges);
        println!("{}:", layers.name);
        for (from, to) in &graph {
            println!(
                "  {from} -> {}",
                to.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        problems.extend(check(layers, &edges));
    }
    let (targets, circles) = circles::check_workspace(&root)?;
    problems.extend(circles);
    if !problems.is_empty() {
        bail!(
            "the module graph breaks the layers of docs/architecture.md:\n  {}",
            problems.join("\n  ")
        );
    }
    println!(
        "no module imports upwards, and no modules import each other in any of the \
         workspace's {targets} crates"
    );
    Ok(())
}

/// Every rule broken by `edges`, in words.
pub fn check(layers: &Layers, edges: &[Edge]) -> Vec<String> {
    let modules = top_modules(layers);
    let layer_of = |module: &str| -> Option<usize> {
        if layers.below_all.contains(&module) {
            return Some(0);
        }
        layers
            .layers
            .iter()
            .position(|layer| layer.contains(&module))
            .map(|i| i + 1)
    };
    let mut problems = BTreeSet::new();
    for edge in edges {
        let (from, to) = (Edge::top(&edge.from), Edge::top(&edge.to));
        let at = format!("{} ({})", edge.file.display(), edge.path);
        for (never_from, never_to, why) in NEVER {
            if within(&edge.from, never_from) && within(&edge.to, never_to) {
                problems.insert(format!(
                    "{}: `{}` imports `{}` ({why}): {at}",
                    layers.name, edge.from, edge.to
                ));
            }
        }
        // The crate root (lib.rs, main.rs) runs everything; a name at the root that is no
        // module (`crate::run`) belongs to it.
        if from == to || from.is_empty() || !(modules.contains(to) || layer_of(to) == Some(0)) {
            continue;
        }
        match (layer_of(from), layer_of(to)) {
            (None, _) => {
                problems.insert(format!(
                    "{}: module `{from}` is in no layer: add it to xtask/src/layering.rs and \
                     docs/architecture.md",
                    layers.name
                ));
            }
            (_, None) => {
                problems.insert(format!(
                    "{}: `{from}` imports `{to}`, which is in no layer: {at}",
                    layers.name
                ));
            }
            (Some(a), Some(b)) if a <= b => {
                let how = if a == b { "beside it" } else { "above it" };
                problems.insert(format!(
                    "{}: `{from}` imports `{to}`, a module {how}: {at}",
                    layers.name
                ));
            }
            _ => {}
        }
    }
    if let Some(cycle) = find_cycle(&top_graph(edges)) {
        problems.insert(format!(
            "{}: the modules import each other in a circle: {}",
            layers.name,
            cycle.join(" -> ")
        ));
    }
    problems.into_iter().collect()
}

/// The crate's top-level modules: its files and folders under `src`.
fn top_modules(layers: &Layers) -> BTreeSet<String> {
    let src = crate::root().join(layers.src);
    fs::read_dir(src)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?;
            let name = name.strip_suffix(".rs").unwrap_or(name);
            (!matches!(name, "lib" | "main")).then(|| name.to_owned())
        })
        .collect()
}

/// Whether `module` is `parent` or inside it.
fn within(module: &str, parent: &str) -> bool {
    module == parent || module.starts_with(&format!("{parent}::"))
}

/// Top-level module -> the top-level modules it imports.
pub fn top_graph(edges: &[Edge]) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for edge in edges {
        let (from, to) = (Edge::top(&edge.from), Edge::top(&edge.to));
        if from != to && !from.is_empty() {
            graph
                .entry(from.to_owned())
                .or_default()
                .insert(to.to_owned());
        }
    }
    graph
}

/// A cycle of `graph`, as the modules along it (the first repeated at the end), if any.
pub fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Every edge of one crate's sources: its library's and, if it has one, its binary's
/// (`src/lib.rs`, `src/main.rs`), walked along their `mod` declarations.
pub fn crate_edges(root: &Path, layers: &Layers) -> Result<Vec<Edge>> {
    let src = root.join(layers.src);
    let mut edges = Vec::new();
    for crate_root in ["lib.rs", "main.rs"].map(|file| src.join(file)) {
        if crate_root.is_file() {
            edges.extend(ModuleTree::walk(&crate_root)?.edges(root)?);
        }
    }
    edges.sort();
    edges.dedup();
    Ok(edges)
}

/// The edges one file makes, `module` being the module it is.
pub fn file_edges(text: &str, module: &[String], shown: &Path) -> Result<Vec<Edge>> {
    let file = syn::parse_file(text)?;
    let mut paths = Paths {
        module: module.to_vec(),
        found: Vec::new(),
    };
    paths.visit_file(&file);
    let from = module.join("::");
    Ok(paths
        .found
        .into_iter()
        .filter_map(|(resolved, written)| {
            Some(Edge {
                from: from.clone(),
                to: resolved?.join("::"),
                file: shown.to_owned(),
                path: written,
            })
        })
        .collect())
}

/// Collects every path that leads into the crate, resolved to an absolute module path.
struct Paths {
    /// The module being visited (inline `mod tests { .. }` included).
    module: Vec<String>,
    found: Vec<(Option<Vec<String>>, String)>,
}

impl Paths {
    /// `segments` as written in `self.module`, made absolute; `None` when it does not lead
    /// into the crate (a dependency, `std`, a local name).
    fn resolve(&self, segments: &[String]) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        let mut absolute = match first.as_str() {
            "crate" => Vec::new(),
            "shmtrace_core" => vec!["shmtrace_core".to_owned()],
            "self" => self.module.clone(),
            "super" => {
                let mut module = self.module.clone();
                module.pop()?;
                let mut rest = rest;
                while let Some(("super", more)) = rest.split_first().map(|(s, m)| (s.as_str(), m)) {
                    module.pop()?;
                    rest = more;
                }
                module.extend(rest.iter().cloned());
                return Some(module);
            }
            _ => return None,
        };
        absolute.extend(rest.iter().cloned());
        Some(absolute)
    }

    fn note(&mut self, segments: Vec<String>) {
        let resolved = self.resolve(&segments);
        if resolved.is_some() {
            self.found.push((resolved, segments.join("::")));
        }
    }

    /// Every path a `use` tree names, each with the prefix it is under.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let mut full = prefix.clone();
                // `use super::{self, x}`: `self` is the prefix itself.
                if name.ident != "self" {
                    full.push(name.ident.to_string());
                }
                self.note(full);
            }
            syn::UseTree::Rename(rename) => {
                let mut full = prefix.clone();
                if rename.ident != "self" {
                    full.push(rename.ident.to_string());
                }
                self.note(full);
            }
            syn::UseTree::Glob(_) => self.note(prefix.clone()),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // An inline module (`mod tests { .. }`) is a module of its own for `super` and `self`;
        // a `mod x;` declaration is visited as its own file.
        if item.content.is_some() {
            self.module.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.module.pop();
        }
    }

    /// `pub(crate)`, `pub(super)`: a visibility, not an import.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.note(segments);
        syn::visit::visit_path(self, path);
    }
}

mod circles;

#[cfg(test)]
mod tests;
