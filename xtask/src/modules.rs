//! Module layers inside a crate, as `layers` checks crates: a test parses the crate's
//! sources (`syn`), builds the graph of which module refers to which (every `use` and every
//! path, re-exports followed to where the item lives), and fails when the graph has a cycle
//! or when a module reaches a layer above its own. The layers are written in the crate's own
//! docs (`lib.rs`), one line per layer, lowest first, between a `module-layers` marker's code
//! fence; a module belongs to the layer of its nearest listed ancestor, and every module must
//! have one.
//!
//! What counts: paths in code and `use` items of non-test code (items and modules under
//! `#[cfg(test)]` are skipped), including a child's `super::` and a parent's references to
//! its children (a module file that both declares a child and is used by it is a cycle of
//! two files). Doc links and paths inside macro invocations are not code and do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use syn::visit::Visit;

/// Module path (`"crate"` for the root, `"auth::authz"` below it) → the modules it uses.
pub type ModuleGraph = BTreeMap<String, BTreeSet<String>>;

/// One parsed module file.
struct ModFile {
    /// `use` names → the absolute paths they stand for.
    aliases: BTreeMap<String, Vec<String>>,
    /// Every path the code names, resolved to an absolute path (crate-relative segments).
    refs: Vec<Vec<String>>,
}

/// The crate's module graph from its `src/lib.rs`.
pub fn module_graph(src: &Path) -> Result<ModuleGraph> {
    let mut files = BTreeMap::new();
    load(&src.join("lib.rs"), Vec::new(), &mut files)?;
    let modules: BTreeSet<Vec<String>> = files.keys().cloned().collect();
    let mut graph = ModuleGraph::new();
    for (module, file) in &files {
        let from = name(module);
        let entry = graph.entry(from.clone()).or_default();
        for r in &file.refs {
            let Some(to) = owner(r, &modules, &files) else {
                continue;
            };
            if &to != module {
                entry.insert(name(&to));
            }
        }
    }
    Ok(graph)
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}

/// The module an absolute path's item lives in: its longest module prefix, following a
/// re-export (`pub use`) in that module to where the item is defined.
fn owner(
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
    files: &BTreeMap<Vec<String>, ModFile>,
) -> Option<Vec<String>> {
    let mut path = path.to_vec();
    for _ in 0..16 {
        let len = (0..=path.len())
            .rev()
            .find(|&n| modules.contains(&path[..n]))?;
        let module = path[..len].to_vec();
        let Some(next) = path.get(len) else {
            return Some(module);
        };
        match files[&module].aliases.get(next) {
            Some(target) if target.as_slice() != path.as_slice() => {
                let mut redirected = target.clone();
                redirected.extend_from_slice(&path[len + 1..]);
                path = redirected;
            }
            _ => return Some(module),
        }
    }
    None
}

/// Parses one module file and, recursively, the files of the children it declares.
fn load(file: &Path, module: Vec<String>, out: &mut BTreeMap<Vec<String>, ModFile>) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let ast = syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
    let mut children = BTreeSet::new();
    for item in &ast.items {
        if let syn::Item::Mod(m) = item
            && m.content.is_none()
            && !test_only(&m.attrs)
        {
            children.insert(m.ident.to_string());
        }
    }
    let mut collect = Collect {
        module: module.clone(),
        children: children.clone(),
        uses: Vec::new(),
        paths: Vec::new(),
    };
    collect.visit_file(&ast);
    let mut aliases = BTreeMap::new();
    let mut refs = Vec::new();
    for (alias, path) in &collect.uses {
        if let Some(abs) = collect.absolute(path, &BTreeMap::new()) {
            if alias != "*" {
                aliases.insert(alias.clone(), abs.clone());
            }
            refs.push(abs);
        }
    }
    for path in &collect.paths {
        if let Some(abs) = collect.absolute(path, &aliases) {
            refs.push(abs);
        }
    }
    let dir = if module.is_empty() || file.file_name().is_some_and(|f| f == "mod.rs") {
        file.parent()
            .context("a module file has a directory")?
            .to_path_buf()
    } else {
        file.with_extension("")
    };
    for child in &children {
        let flat = dir.join(format!("{child}.rs"));
        let nested = dir.join(child).join("mod.rs");
        let path: PathBuf = if flat.exists() { flat } else { nested };
        let mut m = module.clone();
        m.push(child.clone());
        load(&path, m, out)?;
    }
    out.insert(module, ModFile { aliases, refs });
    Ok(())
}

/// `#[cfg(test)]` or `#[cfg(all(test, ...))]`: compiled only into the unit tests.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| {
                let t: String = l.tokens.to_string().split_whitespace().collect();
                t == "test" || t.starts_with("all(test")
            })
    })
}

struct Collect {
    module: Vec<String>,
    children: BTreeSet<String>,
    /// `use` leaves: (the name they bind, or `*`; the path as written).
    uses: Vec<(String, Vec<String>)>,
    paths: Vec<Vec<String>>,
}

impl Collect {
    /// A path as written → crate-relative segments, or `None` for other crates' and local
    /// names.
    fn absolute(
        &self,
        path: &[String],
        aliases: &BTreeMap<String, Vec<String>>,
    ) -> Option<Vec<String>> {
        let first = path.first()?;
        let mut out;
        let rest;
        match first.as_str() {
            "crate" => {
                out = Vec::new();
                rest = &path[1..];
            }
            "self" => {
                out = self.module.clone();
                rest = &path[1..];
            }
            "super" => {
                out = self.module.clone();
                let supers = path.iter().take_while(|s| *s == "super").count();
                for _ in 0..supers {
                    out.pop()?;
                }
                rest = &path[supers..];
            }
            f if self.children.contains(f) => {
                out = self.module.clone();
                rest = path;
            }
            f => {
                out = aliases.get(f)?.clone();
                rest = &path[1..];
            }
        }
        out.extend(rest.iter().cloned());
        Some(out)
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let mut path = prefix.clone();
                if name != "self" {
                    path.push(name.clone());
                }
                let bound = if name == "self" {
                    prefix.last().cloned().unwrap_or_default()
                } else {
                    name
                };
                self.uses.push((bound, path));
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                if r.ident != "self" {
                    path.push(r.ident.to_string());
                }
                self.uses.push((r.rename.to_string(), path));
            }
            syn::UseTree::Glob(_) => self.uses.push(("*".to_string(), prefix.clone())),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Collect {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            _ => &[],
        };
        if test_only(attrs) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut prefix = Vec::new();
        self.use_tree(&mut prefix, &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs.len() > 1 || segs.first().is_some_and(|s| self.children.contains(s)) {
            self.paths.push(segs);
        }
        syn::visit::visit_path(self, p);
    }
}

/// The layers a crate's `lib.rs` docs declare: one line per layer, lowest first, each a
/// comma-separated list of module paths (`crate` for the root).
pub fn parse_layers(lib_rs: &str) -> Result<Vec<Vec<String>>> {
    let doc: String = lib_rs
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let start = doc
        .find("<!-- module-layers")
        .context("lib.rs has no `<!-- module-layers ... -->` marker in its docs")?;
    let rest = &doc[start..];
    let fence = rest
        .find("```")
        .context("no code fence after the module-layers marker")?;
    let body = &rest[fence + 3..];
    let body = &body[body.find('\n').map_or(0, |i| i + 1)..];
    let end = body
        .find("```")
        .context("the module-layers code fence is not closed")?;
    let layers: Vec<Vec<String>> = body[..end]
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect()
        })
        .collect();
    if layers.is_empty() {
        bail!("the module-layers block lists no layer");
    }
    Ok(layers)
}

/// The layer of a module: that of its nearest listed ancestor (itself included).
fn layer_of(module: &str, layers: &[Vec<String>]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, layer) in layers.iter().enumerate() {
        for m in layer {
            let hit = m == module || (m != "crate" && module.starts_with(&format!("{m}::")));
            let depth = if m == "crate" {
                0
            } else {
                m.split("::").count()
            };
            if hit && best.is_none_or(|(_, d)| depth > d) {
                best = Some((i, depth));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// Every edge that runs up the layers, and every module without a layer, as messages.
pub fn violations(graph: &ModuleGraph, layers: &[Vec<String>]) -> Vec<String> {
    let mut out = Vec::new();
    let listed: BTreeSet<&String> = layers.iter().flatten().collect();
    for m in listed {
        if !graph.contains_key(m.as_str()) {
            out.push(format!("the layers list `{m}`, which is not a module"));
        }
    }
    for (from, tos) in graph {
        let Some(lf) = layer_of(from, layers) else {
            out.push(format!("`{from}` has no layer"));
            continue;
        };
        for to in tos {
            if let Some(lt) = layer_of(to, layers)
                && lt > lf
            {
                out.push(format!(
                    "`{from}` (layer {}) uses `{to}` (layer {}, above it)",
                    lf + 1,
                    lt + 1
                ));
            }
        }
    }
    out
}

/// The graph's strongly connected components with more than one module (Tarjan).
pub fn cycles(graph: &ModuleGraph) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a ModuleGraph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let lw = s.low[w.as_str()];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w.as_str()) {
                let iw = s.index[w.as_str()];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort_by_key(|c| std::cmp::Reverse(c.len()));
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_src(krate: &str) -> PathBuf {
        crate::util::repo_root().join(krate).join("src")
    }

    /// Describes what is wrong with a crate's modules, or `None`.
    fn check(krate: &str) -> Option<String> {
        let src = crate_src(krate);
        let graph = module_graph(&src).expect("the crate's modules parse");
        let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
        let layers = parse_layers(&lib).expect("the module-layers block parses");
        let mut problems = violations(&graph, &layers);
        for c in cycles(&graph) {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|m| {
                    graph[m]
                        .iter()
                        .filter(|t| c.contains(t))
                        .map(move |t| format!("{m} -> {t}"))
                })
                .collect();
            problems.push(format!(
                "an import cycle of {} modules: {}",
                c.len(),
                edges.join(", ")
            ));
        }
        (!problems.is_empty()).then(|| problems.join("\n"))
    }

    /// The API server's modules import down their layers only, and no two import each other.
    #[test]
    fn apiserver_modules_are_layered_without_cycles() {
        if let Some(problems) = check("control/apiserver") {
            panic!("control/apiserver's modules:\n{problems}");
        }
    }

    fn graph_of(edges: &[(&str, &str)]) -> ModuleGraph {
        let mut g = ModuleGraph::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    }

    #[test]
    fn sources_resolve_to_modules_with_reexports_followed() {
        let dir = tempfile_dir();
        let src = dir.join("src");
        std::fs::create_dir_all(src.join("a")).unwrap();
        std::fs::write(
            src.join("lib.rs"),
            "//! <!-- module-layers -->\n//! ```text\n//! b\n//! a\n//! crate\n//! ```\n\
             mod a; mod b; pub use b::Thing;\n#[cfg(test)] mod t;\n",
        )
        .unwrap();
        std::fs::write(
            src.join("a/mod.rs"),
            "mod c;\nuse crate::Thing;\nfn f() { c::g(); }\n\
             #[cfg(test)] mod tests { use crate::b::up; }\n",
        )
        .unwrap();
        std::fs::write(src.join("a/c.rs"), "pub fn g() { super::super::b::h(); }\n").unwrap();
        std::fs::write(src.join("b.rs"), "pub struct Thing; pub fn h() {}\n").unwrap();
        let g = module_graph(&src).unwrap();
        assert_eq!(
            g["a"],
            ["a::c", "b"].iter().map(|s| s.to_string()).collect()
        );
        assert_eq!(g["a::c"], ["b".to_string()].into());
        assert_eq!(g["crate"], ["b".to_string()].into());
        assert!(g["b"].is_empty());
        let layers = parse_layers(&std::fs::read_to_string(src.join("lib.rs")).unwrap()).unwrap();
        assert!(
            violations(&g, &layers).is_empty(),
            "{:?}",
            violations(&g, &layers)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-modules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn upward_edges_cycles_and_unplaced_modules_are_reported() {
        let layers = vec![vec!["low".to_string()], vec!["high".to_string()]];
        let g = graph_of(&[("low", "high"), ("high", "low"), ("high::x", "low")]);
        let v = violations(&g, &layers);
        assert_eq!(v, vec!["`low` (layer 1) uses `high` (layer 2, above it)"]);
        assert_eq!(
            cycles(&g),
            vec![vec!["high".to_string(), "low".to_string()]]
        );
        let unplaced = violations(&graph_of(&[("a", "b")]), &[vec!["a".to_string()]]);
        assert_eq!(unplaced, vec!["`b` has no layer"]);
    }
}
