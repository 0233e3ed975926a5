//! Circles over the full module graph of every crate of the workspace: no two modules may
//! import each other, directly or round a loop, at any depth.
//!
//! Every target `cargo metadata` lists (each lib, bin, test, bench and example; build scripts
//! aside) is walked from its root file along its `mod` declarations, `#[path]` included, so a
//! module is a file; an inline module (`mod tests { .. }`) counts as part of the file that
//! holds it. Every path of a file that leads into its crate ([`file_edges`]) is an edge to the
//! module it names.
//!
//! The graph is judged level by level. An edge between two modules that are not one inside
//! the other counts between the two siblings that hold them under their nearest common
//! parent: `live::bpf::arch` naming `live::session` is an edge from `live::bpf` to
//! `live::session`. A parent using its children, or a child reading its parent's items, is no
//! edge: seen from outside, a module and what it holds are one unit. So a circle is a set of
//! siblings that import each other, whether through their own files or through files below
//! them.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use super::{Edge, file_edges, find_cycle};

/// One compiled crate: a package's lib, a binary, an integration test.
#[derive(Clone, Debug)]
pub struct Target {
    pub package: String,
    /// The target's name as cargo knows it (`shmtrace`, `kernel_probes`).
    pub name: String,
    pub root_file: PathBuf,
}

/// Every target of the workspace's members (`cargo metadata`), the eBPF crate and xtask
/// included; build scripts are single files and left out.
pub fn workspace_targets(root: &Path) -> Result<Vec<Target>> {
    let metadata = crate::cargo_metadata(root, &["--no-deps"])?;
    let mut targets = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        for target in package["targets"].as_array().into_iter().flatten() {
            let build_script = target["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|kind| kind == "custom-build"));
            if build_script {
                continue;
            }
            let field = |value: &serde_json::Value, name: &str| {
                value[name]
                    .as_str()
                    .map(str::to_owned)
                    .with_context(|| format!("cargo metadata: a target without `{name}`"))
            };
            targets.push(Target {
                package: field(package, "name")?,
                name: field(target, "name")?,
                root_file: PathBuf::from(field(target, "src_path")?),
            });
        }
    }
    Ok(targets)
}

/// A crate's modules, each the file it is: the root is the empty path.
#[derive(Debug, Default)]
pub struct ModuleTree {
    pub files: BTreeMap<Vec<String>, PathBuf>,
}

impl ModuleTree {
    /// The modules reached from `root_file` by `mod` declarations.
    pub fn walk(root_file: &Path) -> Result<ModuleTree> {
        let mut tree = ModuleTree::default();
        let dir = root_file.parent().unwrap_or(Path::new("")).to_owned();
        tree.add_file(root_file, Vec::new(), &dir)?;
        Ok(tree)
    }

    /// `file` is `module`; its `mod x;` declarations are files in `children`.
    fn add_file(&mut self, file: &Path, module: Vec<String>, children: &Path) -> Result<()> {
        let text =
            fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let parsed =
            syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
        self.files.insert(module.clone(), file.to_owned());
        self.add_items(file, &parsed.items, &module, children)
    }

    fn add_items(
        &mut self,
        file: &Path,
        items: &[syn::Item],
        module: &[String],
        children: &Path,
    ) -> Result<()> {
        for item in items {
            let syn::Item::Mod(declared) = item else {
                continue;
            };
            let name = declared.ident.to_string();
            let mut child = module.to_vec();
            child.push(name.clone());
            if let Some((_, items)) = &declared.content {
                // An inline module is part of its file, but its own `mod x;` files sit in a
                // folder named after it.
                self.add_items(file, items, &child, &children.join(&name))?;
                continue;
            }
            let (child_file, grandchildren) = match path_attribute(declared) {
                // A `#[path]` file: relative to the declaring file's folder, and its own
                // children beside it.
                Some(path) => {
                    let child_file = file.parent().unwrap_or(Path::new("")).join(path);
                    let folder = child_file.parent().unwrap_or(Path::new("")).to_owned();
                    (child_file, folder)
                }
                None => {
                    let flat = children.join(format!("{name}.rs"));
                    if flat.is_file() {
                        (flat, children.join(&name))
                    } else {
                        let folder = children.join(&name);
                        (folder.join("mod.rs"), folder)
                    }
                }
            };
            if !child_file.is_file() {
                bail!(
                    "{}: `mod {name};` has no file at {}",
                    file.display(),
                    child_file.display()
                );
            }
            self.add_file(&child_file, child, &grandchildren)?;
        }
        Ok(())
    }

    /// The module of this tree that `path` is in: its longest prefix that is a module.
    pub fn module_holding<'a>(&self, path: &'a [String]) -> &'a [String] {
        (0..=path.len())
            .rev()
            .map(|len| &path[..len])
            .find(|prefix| self.files.contains_key(*prefix))
            .unwrap_or(&[])
    }

    /// Every edge of every file of the tree, `from` and `to` as written by [`file_edges`].
    pub fn edges(&self, root: &Path) -> Result<Vec<Edge>> {
        let mut edges = Vec::new();
        for (module, file) in &self.files {
            let text =
                fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            let shown = file.strip_prefix(root).unwrap_or(file);
            edges.extend(
                file_edges(&text, module, shown)
                    .with_context(|| format!("parsing {}", file.display()))?,
            );
        }
        edges.sort();
        edges.dedup();
        Ok(edges)
    }
}

/// The path of a `#[path = ".."]` attribute.
fn path_attribute(declared: &syn::ItemMod) -> Option<String> {
    declared.attrs.iter().find_map(|attr| {
        let syn::Meta::NameValue(pair) = &attr.meta else {
            return None;
        };
        if !pair.path.is_ident("path") {
            return None;
        }
        match &pair.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(path),
                ..
            }) => Some(path.value()),
            _ => None,
        }
    })
}

/// An edge between siblings, and the edge of the sources that makes it.
type SiblingGraph = BTreeMap<String, BTreeMap<String, Edge>>;

/// The sibling edges `edges` make in `tree` (see the module's documentation), each with the
/// first edge of the sources that makes it.
pub fn sibling_graph(tree: &ModuleTree, edges: &[Edge]) -> SiblingGraph {
    let split = |module: &str| -> Vec<String> {
        module
            .split("::")
            .filter(|part| !part.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut graph = SiblingGraph::new();
    for edge in edges {
        let (from, to) = (split(&edge.from), split(&edge.to));
        let from = tree.module_holding(&from);
        let to = tree.module_holding(&to);
        let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
        // One inside the other, or the same module.
        if common == from.len() || common == to.len() {
            continue;
        }
        graph
            .entry(from[..=common].join("::"))
            .or_default()
            .entry(to[..=common].join("::"))
            .or_insert_with(|| edge.clone());
    }
    graph
}

/// A set of modules that reach one another, and one cycle through them (the first module
/// repeated at the end), with the edge of the sources that makes each step.
pub struct Circle {
    pub modules: BTreeSet<String>,
    pub cycle: Vec<(String, Option<Edge>)>,
}

/// Every circle of `graph`.
pub fn circles(graph: &SiblingGraph) -> Vec<Circle> {
    let plain: BTreeMap<String, BTreeSet<String>> = graph
        .iter()
        .map(|(from, to)| (from.clone(), to.keys().cloned().collect()))
        .collect();
    strongly_connected(&plain)
        .into_iter()
        .filter(|set| set.len() > 1)
        .filter_map(|set| {
            let within: BTreeMap<String, BTreeSet<String>> = set
                .iter()
                .map(|module| {
                    let next = plain[module].intersection(&set).cloned().collect();
                    (module.clone(), next)
                })
                .collect();
            let cycle = find_cycle(&within)?;
            let cycle = cycle
                .iter()
                .enumerate()
                .map(|(i, module)| {
                    let step = cycle
                        .get(i + 1)
                        .and_then(|next| graph.get(module)?.get(next))
                        .cloned();
                    (module.clone(), step)
                })
                .collect();
            Some(Circle {
                modules: set,
                cycle,
            })
        })
        .collect()
}

/// The strongly connected components of `graph` (Tarjan's algorithm, iterative).
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let nodes: Vec<&String> = graph
        .keys()
        .chain(graph.values().flatten())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let index_of: BTreeMap<&String, usize> =
        nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let next: Vec<Vec<usize>> = nodes
        .iter()
        .map(|node| {
            graph
                .get(*node)
                .into_iter()
                .flatten()
                .map(|to| index_of[to])
                .collect()
        })
        .collect();
    let mut index = vec![usize::MAX; nodes.len()];
    let mut low = vec![0; nodes.len()];
    let mut on_stack = vec![false; nodes.len()];
    let mut stack = Vec::new();
    let mut counter = 0;
    let mut components = Vec::new();
    for start in 0..nodes.len() {
        if index[start] != usize::MAX {
            continue;
        }
        // (node, how many of its successors have been looked at)
        let mut work = vec![(start, 0)];
        index[start] = counter;
        low[start] = counter;
        counter += 1;
        stack.push(start);
        on_stack[start] = true;
        while let Some(&mut (node, ref mut seen)) = work.last_mut() {
            if let Some(&succ) = next[node].get(*seen) {
                *seen += 1;
                if index[succ] == usize::MAX {
                    index[succ] = counter;
                    low[succ] = counter;
                    counter += 1;
                    stack.push(succ);
                    on_stack[succ] = true;
                    work.push((succ, 0));
                } else if on_stack[succ] {
                    low[node] = low[node].min(index[succ]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == index[node] {
                let mut component = BTreeSet::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.insert(nodes[member].clone());
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// How many targets the workspace at `root` has, and every circle of each, in words.
pub fn check_workspace(root: &Path) -> Result<(usize, Vec<String>)> {
    let targets = workspace_targets(root)?;
    let mut problems = BTreeSet::new();
    for target in &targets {
        let tree = ModuleTree::walk(&target.root_file)?;
        let edges = tree.edges(root)?;
        for circle in circles(&sibling_graph(&tree, &edges)) {
            problems.insert(describe(target, &circle));
        }
    }
    Ok((targets.len(), problems.into_iter().collect()))
}

/// One circle in words: the modules in it, one way round, and the file and path of each step.
pub fn describe(target: &Target, circle: &Circle) -> String {
    let members: Vec<&str> = circle.modules.iter().map(String::as_str).collect();
    let round: Vec<&str> = circle
        .cycle
        .iter()
        .map(|(module, _)| module.as_str())
        .collect();
    let steps: Vec<String> = circle
        .cycle
        .iter()
        .filter_map(|(module, step)| {
            let step = step.as_ref()?;
            Some(format!("{module}: {} ({})", step.file.display(), step.path))
        })
        .collect();
    format!(
        "{} ({}): {} import each other; one way round: {}\n      {}",
        target.package,
        target.name,
        members.join(", "),
        round.join(" -> "),
        steps.join("\n      ")
    )
}
