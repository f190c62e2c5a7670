//! The crate's modules form no cycle: each of the crate's top-level modules, and each of
//! `core`'s, may use the ones below it, never one that uses it back. A newcomer reads the
//! modules bottom-up; a cycle (as `cached_object` ↔ `watcher` once was) means neither can
//! be understood, or tested, without the other.
//!
//! The graph is read from the source: every `crate::a::b` path outside comments and
//! `#[cfg(test)]` modules is an edge from the file's module to `a` (or to `core::b`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The node a file belongs to: `registry` for `registry.rs`, `fleet` for anything in
/// `fleet/`, `core::window` for `core/window.rs`, `core::proto` for anything in
/// `core/proto/`; `None` for `lib.rs` and `core/mod.rs` (they only declare modules).
fn node_of(rel: &Path) -> Option<String> {
    let parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [only] if only == "lib" => None,
        [core, m] if core == "core" && m == "mod" => None,
        [core, m, ..] if core == "core" => Some(format!("core::{m}")),
        [top, ..] => Some(top.clone()),
        [] => None,
    }
}

/// The node a `crate::…` path names.
fn target_of(path: &str) -> Option<String> {
    let mut segs = path.split("::").skip(1);
    let top = segs.next()?;
    if top == "core" {
        // `crate::core::Foo` (a re-export) counts as `core` itself; none exist today.
        let sub = segs.next()?;
        return Some(format!("core::{sub}"));
    }
    Some(top.to_string())
}

/// The code of a file without its comments and its `#[cfg(test)]` module.
fn code_of(src: &str) -> String {
    let cut = src.find("#[cfg(test)]\nmod tests").unwrap_or(src.len());
    src[..cut]
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&root).expect("under src");
        let Some(from) = node_of(rel) else { continue };
        let code = code_of(&std::fs::read_to_string(&file).expect("read file"));
        let deps = graph.entry(from.clone()).or_default();
        let mut rest = code.as_str();
        while let Some(i) = rest.find("crate::") {
            let path: String = rest[i..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            rest = &rest[i + "crate::".len()..];
            if let Some(to) = target_of(&path) {
                if to != from {
                    deps.insert(to);
                }
            }
        }
    }
    graph
}

/// A cycle through `start`, as the path of nodes, if there is one.
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    walk(graph, start, start, &mut path, &mut seen).then_some(path)
}

#[test]
fn the_module_graph_has_no_cycle() {
    let graph = edges();
    // The reader must see the modules it claims to: a parser that found nothing would pass.
    assert!(
        graph
            .get("watcher")
            .is_some_and(|d| d.contains("watch_feed")),
        "{graph:#?}"
    );
    assert!(graph.contains_key("core::window"), "{graph:#?}");
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|n| cycle_through(&graph, n))
        .map(|c| c.join(" → "))
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_reader_finds_a_cycle_when_there_is_one() {
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        cycle_through(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    graph.insert("c".to_string(), BTreeSet::new());
    assert_eq!(cycle_through(&graph, "a"), None);
    assert_eq!(
        target_of("crate::core::window::Window"),
        Some("core::window".into())
    );
    assert_eq!(
        node_of(Path::new("fleet/key_task.rs")),
        Some("fleet".into())
    );
    assert_eq!(
        node_of(Path::new("core/proto/codec.rs")),
        Some("core::proto".into())
    );
    assert_eq!(node_of(Path::new("core/mod.rs")), None);
}
