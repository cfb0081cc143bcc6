//! docs/ARCHITECTURE.md's crate graph is the one the Cargo.toml files
//! declare: every workspace crate is listed with exactly its normal
//! dependencies on other workspace crates (cargo itself refuses a cycle).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_path_buf()
}

/// The `[section]`'s lines of a Cargo.toml.
fn section<'a>(toml: &'a str, name: &str) -> Vec<&'a str> {
    let mut inside = false;
    let mut out = Vec::new();
    for l in toml.lines() {
        let t = l.trim();
        if t.starts_with('[') {
            inside = t == format!("[{name}]");
        } else if inside && !t.is_empty() && !t.starts_with('#') {
            out.push(t);
        }
    }
    out
}

/// The workspace's crates and their normal dependencies on each other,
/// as the Cargo.toml files say.
fn declared() -> Graph {
    let root = root();
    let ws = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members: Vec<String> = ws[ws.find("members").unwrap()..].split(']').next().unwrap().split('"').skip(1).step_by(2).map(str::to_string).collect();
    let mut names = BTreeMap::new();
    for m in &members {
        let toml = std::fs::read_to_string(root.join(m).join("Cargo.toml")).unwrap();
        let name = section(&toml, "package").iter().find_map(|l| l.strip_prefix("name")?.trim().strip_prefix('=')?.trim().trim_matches('"').to_string().into()).unwrap();
        names.insert(m.clone(), (name, toml));
    }
    let crates: BTreeSet<String> = names.values().map(|(n, _)| n.clone()).collect();
    let mut g = Graph::new();
    for (name, toml) in names.values() {
        let deps = section(toml, "dependencies").iter().filter_map(|l| l.split(['=', '.', ' ']).next().map(str::to_string)).filter(|d| crates.contains(d)).collect();
        g.insert(name.clone(), deps);
    }
    g
}

/// The graph in docs/ARCHITECTURE.md's `crates` block.
fn documented() -> Graph {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let block = doc.split("```crates").nth(1).expect("a ```crates block in docs/ARCHITECTURE.md").split("```").next().unwrap();
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, deps) = l.split_once("->").unwrap_or_else(|| panic!("line {l:?} has no ->"));
            (name.trim().to_string(), deps.split(',').map(|d| d.trim().to_string()).filter(|d| !d.is_empty()).collect())
        })
        .collect()
}

#[test]
fn the_documented_crate_graph_is_the_declared_one() {
    let (doc, decl) = (documented(), declared());
    for (name, deps) in &decl {
        match doc.get(name) {
            None => panic!("docs/ARCHITECTURE.md does not list crate {name} (-> {deps:?})"),
            Some(d) => assert_eq!(d, deps, "crate {name}: docs/ARCHITECTURE.md says -> {d:?}, its Cargo.toml -> {deps:?}"),
        }
    }
    for name in doc.keys() {
        assert!(decl.contains_key(name), "docs/ARCHITECTURE.md lists {name}, which is not a workspace crate");
    }
}
