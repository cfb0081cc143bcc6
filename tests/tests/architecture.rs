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

// ---------------------------------------------------------------- modules

/// Cycles between a crate's top-level modules still to be broken, each as
/// (crate directory, modules in it): the test fails on any other cycle,
/// and on a listed one that is gone (then take it off the list).
const KNOWN_CYCLES: &[(&str, &[&str])] = &[];

/// The top-level modules of the crate whose sources are in `src` (binaries
/// under src/bin left out; lib.rs and main.rs are the root, not a module),
/// each with the `.rs` files it is made of.
fn top_modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut mods: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if first == "bin" || first == "lib" || first == "main" {
            continue;
        }
        mods.entry(first).or_default().push(f);
    }
    mods
}

/// The code of `text` without comments and without its test modules.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    text.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// The top-level modules named after `crate::` in `code` (`crate::a::b`,
/// `crate::{a, b::c}`).
fn crate_paths(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            for part in group.split('}').next().unwrap().split(',') {
                out.insert(ident(part.trim()));
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out
}

/// Each top-level module of the crate in `src` and the others it uses.
fn module_graph(src: &Path) -> Graph {
    let mods = top_modules(src);
    mods.iter()
        .map(|(m, files)| {
            let used = files.iter().flat_map(|f| crate_paths(&code_of(&std::fs::read_to_string(f).unwrap()))).filter(|d| d != m && mods.contains_key(d)).collect();
            (m.clone(), used)
        })
        .collect()
}

/// The strongly connected components of `g` with more than one member.
fn cycles(g: &Graph) -> Vec<BTreeSet<String>> {
    // Reachability by depth-first search from each module: fine at this size.
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for d in g.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for m in g.keys() {
        let scc: BTreeSet<String> = g.keys().filter(|n| n == &m || (reaches[m].contains(*n) && reaches[n].contains(m))).cloned().collect();
        if scc.len() > 1 && !out.contains(&scc) {
            out.push(scc);
        }
    }
    out
}

#[test]
fn each_crates_modules_form_no_cycle() {
    let root = root();
    let ws = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members: Vec<String> = ws[ws.find("members").unwrap()..].split(']').next().unwrap().split('"').skip(1).step_by(2).map(str::to_string).collect();
    let mut found = Vec::new();
    for m in &members {
        for c in cycles(&module_graph(&root.join(m).join("src"))) {
            found.push((m.clone(), c));
        }
    }
    let known: Vec<(String, BTreeSet<String>)> = KNOWN_CYCLES.iter().map(|(c, ms)| (c.to_string(), ms.iter().map(|s| s.to_string()).collect())).collect();
    let new: Vec<_> = found.iter().filter(|f| !known.contains(f)).collect();
    assert!(new.is_empty(), "modules that use each other in a cycle (crate, modules): {new:?}");
    let gone: Vec<_> = known.iter().filter(|k| !found.contains(k)).collect();
    assert!(gone.is_empty(), "known cycles that are gone: take them off KNOWN_CYCLES: {gone:?}");
}

#[test]
fn the_module_graph_sees_a_cycle_when_there_is_one() {
    // The parsing above, on a crate made up here: a -> b -> c -> a, d alone.
    let dir = std::env::temp_dir().join(format!("via-arch-test-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("c")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c; mod d;").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::X; // crate::d is only named in a comment\n").unwrap();
    std::fs::write(src.join("b.rs"), "use crate::{c::Y, a};\n#[cfg(test)]\nmod tests { use crate::d; }\n").unwrap();
    std::fs::write(src.join("c").join("mod.rs"), "mod inner;").unwrap();
    std::fs::write(src.join("c").join("inner.rs"), "fn f() { crate::a::g() }").unwrap();
    std::fs::write(src.join("d.rs"), "").unwrap();
    let g = module_graph(&src);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(g["a"], BTreeSet::from(["b".to_string()]));
    assert_eq!(g["b"], BTreeSet::from(["a".to_string(), "c".to_string()]), "a group, and not the test module's use");
    assert_eq!(cycles(&g), vec![BTreeSet::from(["a".to_string(), "b".to_string(), "c".to_string()])]);
}
