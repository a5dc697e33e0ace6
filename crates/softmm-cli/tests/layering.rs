//! The lab's layering, checked on its sources: no import cycle between its
//! top-level modules, nor between the files of one folder.
//!
//! The lab's modules form layers (docs/architecture.md, "The lab"): the
//! leaves (`args`, `stats`, `table`, `seeds`, `machine`), the samples and
//! their report, the workloads and experiments over them, the registry, and
//! `bench` and `main` on top. A module may name a module below it only; a
//! cycle means two modules that cannot be read, tested or changed apart, so
//! this test refuses any, naming the modules on it.
//!
//! Two graphs are checked, each as the library's layering test reads its
//! sources (`crates/softmm/tests/semantics/layering.rs`): only code counts
//! (comments and the unit-test module ending a file are left out).
//! * Between top-level modules: a file of module `a` (`a.rs` or `a/...`)
//!   naming `crate::b` is an edge `a -> b`. A parent and its children are
//!   one module here, as the issue asks ("parent/child inside one folder
//!   aside").
//! * Between the files of one folder (`workloads/pft.rs`,
//!   `workloads/interference.rs`): a file naming `super::y` or
//!   `crate::folder::y` for a sibling file `y` is an edge to it. The
//!   folder's `mod.rs` (the parent) is not a node.

use std::collections::{BTreeMap, BTreeSet};

use softmm_testkit::sources::{code_of, Source};

/// The folder the file is a child of and its name there
/// (`("workloads", "pft")` for `workloads/pft.rs`, and for
/// `workloads/hugetlb/soft.rs` the child `hugetlb` of `workloads` as
/// well as `soft` of `workloads/hugetlb`); `None` for a top-level file
/// or a folder's `mod.rs`.
fn child_of(s: &Source) -> Option<(String, String)> {
    let (folder, file) = s.path.rsplit_once('/')?;
    let name = file.strip_suffix(".rs")?;
    (name != "mod").then(|| (folder.to_string(), name.to_string()))
}

/// The names that follow `prefix` in the code, a `{...}` list expanded
/// to its items' first names (`self` for the prefix itself).
fn names_after(s: &Source, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = s.code.as_str();
    while let Some(i) = rest.find(prefix) {
        // `xsuper::` or `my_crate::` is not the keyword.
        let before = rest[..i].chars().next_back();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(list) = rest.strip_prefix('{') {
            let mut depth = 0;
            let end = list
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => return true,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    false
                })
                .map_or(list.len(), |(i, _)| i);
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in list[..end].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_alphanumeric() || c == '_') => {
                        out.insert(ident(&list[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The identifier `s` starts with.
fn ident(s: &str) -> String {
    s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

/// The lab's sources, from `$CARGO_MANIFEST_DIR` at run time if set.
fn sources() -> Vec<Source> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    softmm_testkit::sources::sources(&dir, "main.rs")
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The cycles of `g`: each strongly connected component of more than one
/// node, sorted (Tarjan's algorithm).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct State<'a> {
        g: &'a Graph,
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
        for w in s.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// The edges between top-level modules: `a -> b` where a file of `a` names
/// `crate::b`.
fn module_graph(sources: &[Source]) -> Graph {
    let modules: BTreeSet<&str> = sources.iter().map(|s| s.module()).collect();
    let mut g = Graph::new();
    for s in sources {
        let from = s.module().to_string();
        let to = g.entry(from.clone()).or_default();
        for name in names_after(s, "crate::") {
            if name != from && modules.contains(name.as_str()) {
                to.insert(name);
            }
        }
    }
    g
}

/// The edges between the files of each folder, as `folder/file` nodes: a
/// file naming a sibling through `super::` or `crate::<folder path>::`.
fn sibling_graph(sources: &[Source]) -> Graph {
    let children: BTreeSet<(String, String)> = sources
        .iter()
        .filter_map(child_of)
        .chain(
            // A subfolder (`workloads/hugetlb/`) is a child of its folder too.
            sources.iter().filter_map(|s| {
                let (folder, _) = s.path.rsplit_once('/')?;
                let (parent, name) = folder.rsplit_once('/').unwrap_or(("", folder));
                (!parent.is_empty()).then(|| (parent.to_string(), name.to_string()))
            }),
        )
        .collect();
    let mut g = Graph::new();
    for s in sources {
        let Some((folder, me)) = child_of(s) else { continue };
        let node = format!("{folder}/{me}");
        let mut named = names_after(s, "super::");
        named.extend(names_after(s, &format!("crate::{}::", folder.replace('/', "::"))));
        let to = g.entry(node).or_default();
        for n in named {
            if n != me && children.contains(&(folder.clone(), n.clone())) {
                to.insert(format!("{folder}/{n}"));
            }
        }
    }
    g
}

#[test]
fn no_cycle_between_the_labs_top_level_modules() {
    let s = sources();
    let g = module_graph(&s);
    assert!(g.contains_key("workloads") && g.contains_key("bench"), "the lab's modules were not found: {g:?}");
    let c = cycles(&g);
    assert!(c.is_empty(), "import cycles between the lab's top-level modules: {c:?}\nedges: {g:#?}");
}

#[test]
fn no_cycle_between_the_files_of_one_folder() {
    let s = sources();
    let g = sibling_graph(&s);
    assert!(g.contains_key("workloads/pft"), "the workloads' files were not found: {g:?}");
    let c = cycles(&g);
    assert!(c.is_empty(), "import cycles between files of one folder: {c:?}\nedges: {g:#?}");
}

#[test]
fn the_checker_finds_a_cycle_and_reads_use_lists() {
    let src = |path: &str, code: &str| Source { path: path.into(), code: code.into() };
    let s = vec![
        src("main.rs", "mod a; mod b;"),
        src("a.rs", "use crate::b::{self, X};"),
        src("b/mod.rs", "mod p; mod q;"),
        src("b/p.rs", "use super::{q::f, Y}; use crate::a;"),
        src("b/q.rs", "fn g() { crate::b::p::h() }"),
    ];
    assert_eq!(cycles(&module_graph(&s)), vec![vec!["a".to_string(), "b".to_string()]]);
    assert_eq!(cycles(&sibling_graph(&s)), vec![vec!["b/p".to_string(), "b/q".to_string()]]);
    let acyclic = [src("a.rs", "use crate::b;"), src("b.rs", "// crate::a\n"), src("main.rs", "")];
    let code: Vec<Source> = acyclic.iter().map(|s| src(&s.path, &code_of(&s.code))).collect();
    assert!(cycles(&module_graph(&code)).is_empty());
}
