//! candle-core is a heavy dependency (gemm, rayon, zip, ...): it must stay out of the wheel. The
//! wheel is `yoco-py`; nothing it builds, directly or through `yoco-core`, `yoco-text` or any
//! registry crate, may pull in `yoco-ref` or a `candle-*` crate.
//!
//! The check walks the dependency graph recorded in `Cargo.lock` from `yoco-py`. Two details make
//! the walk match what the wheel links:
//! * a workspace member's lock entry also lists its dev-dependencies (tests and benches, not linked
//!   into dependents), so for members the edges named only under `[dev-dependencies]` in their
//!   `Cargo.toml` are dropped;
//! * a registry crate's entry lists every dependency the whole workspace's feature union turned on,
//!   so the walk can only over-approximate (report a crate the wheel does not need), never miss one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One `[[package]]` of `Cargo.lock`.
struct LockPackage {
    name: String,
    version: String,
    /// `"name"` or `"name version"` (the version when several versions are locked).
    deps: Vec<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn parse_lock(text: &str) -> Vec<LockPackage> {
    let mut out = Vec::new();
    for chunk in text.split("[[package]]").skip(1) {
        let field = |key: &str| {
            chunk.lines().find_map(|l| {
                let v = l.strip_prefix(key)?.trim_start().strip_prefix('=')?;
                Some(v.trim().trim_matches('"').to_string())
            })
        };
        let deps = match chunk.find("dependencies = [") {
            Some(at) => {
                let list = &chunk[at + "dependencies = [".len()..];
                let list = &list[..list.find(']').expect("closed dependency list")];
                list.split(',')
                    .map(|d| d.trim().trim_matches('"').to_string())
                    .filter(|d| !d.is_empty())
                    .collect()
            }
            None => Vec::new(),
        };
        out.push(LockPackage {
            name: field("name").expect("package name"),
            version: field("version").expect("package version"),
            deps,
        });
    }
    out
}

/// Dependency names a manifest lists under `[dependencies]` / `[build-dependencies]` (any target)
/// and under `[dev-dependencies]`: `(linked, dev)`.
fn manifest_deps(manifest: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut linked, mut dev) = (BTreeSet::new(), BTreeSet::new());
    let mut section = String::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let Some(key) = line.split(['=', '.']).next().map(str::trim) else {
            continue;
        };
        if key.is_empty() || key.starts_with('#') {
            continue;
        }
        if section.ends_with("dev-dependencies") {
            dev.insert(key.to_string());
        } else if section.ends_with("dependencies") {
            linked.insert(key.to_string());
        }
    }
    (linked, dev)
}

/// Names of the workspace members and, per member, the dependency names only its tests use.
fn dev_only_deps() -> BTreeMap<String, BTreeSet<String>> {
    let ws = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let start = ws.find("members = [").expect("workspace members") + "members = [".len();
    let members = &ws[start..];
    let members = &members[..members.find(']').unwrap()];
    let mut out = BTreeMap::new();
    for m in members.split(',') {
        let m = m.trim().trim_matches('"');
        if m.is_empty() {
            continue;
        }
        let manifest = std::fs::read_to_string(root().join(m).join("Cargo.toml")).unwrap();
        let name = manifest
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .expect("member name")
            .trim_matches('"')
            .to_string();
        let (linked, dev) = manifest_deps(&manifest);
        out.insert(name, dev.difference(&linked).cloned().collect());
    }
    out
}

/// Every package `start` links, itself included, as `name version`.
fn closure(start: &str) -> BTreeSet<String> {
    let lock = parse_lock(&std::fs::read_to_string(root().join("Cargo.lock")).unwrap());
    let dev_only = dev_only_deps();
    let find = |dep: &str| -> &LockPackage {
        let mut it = dep.split(' ');
        let (name, version) = (it.next().unwrap(), it.next());
        let hits: Vec<&LockPackage> = lock
            .iter()
            .filter(|p| p.name == name && version.map_or(true, |v| p.version == v))
            .collect();
        assert_eq!(hits.len(), 1, "Cargo.lock: `{dep}` must name one package");
        hits[0]
    };
    let mut seen = BTreeSet::new();
    let mut todo = vec![find(start)];
    while let Some(p) = todo.pop() {
        if !seen.insert(format!("{} {}", p.name, p.version)) {
            continue;
        }
        let skip = dev_only.get(&p.name);
        for d in &p.deps {
            let name = d.split(' ').next().unwrap();
            if skip.is_some_and(|s| s.contains(name)) {
                continue;
            }
            todo.push(find(d));
        }
    }
    seen
}

fn banned(closure: &BTreeSet<String>) -> Vec<&String> {
    closure
        .iter()
        .filter(|p| p.starts_with("candle") || p.starts_with("yoco-ref "))
        .collect()
}

#[test]
fn candle_stays_out_of_the_wheel() {
    let wheel = closure("yoco-py");
    // The walk must reach the crates the wheel really links through its members, or it proves nothing.
    for needed in ["yoco-core ", "yoco-text ", "tokenizers ", "pyo3 ", "sha2 "] {
        assert!(
            wheel.iter().any(|p| p.starts_with(needed)),
            "the walk from yoco-py misses {needed}: {wheel:?}"
        );
    }
    assert!(
        banned(&wheel).is_empty(),
        "yoco-py pulls in {:?} (directly or through a dependency)",
        banned(&wheel)
    );
    // Members' dev-dependencies are not linked: criterion (yoco-core's benches) is not in the wheel.
    assert!(!wheel.iter().any(|p| p.starts_with("criterion ")));
    let core = closure("yoco-core");
    assert!(
        banned(&core).is_empty(),
        "yoco-core pulls in {:?}",
        banned(&core)
    );
    let text = closure("yoco-text");
    assert!(
        banned(&text).is_empty(),
        "yoco-text pulls in {:?}",
        banned(&text)
    );
}

#[test]
fn the_walk_finds_candle_where_it_is() {
    // yoco-ref depends on candle-core directly, and candle-core on gemm: the walk sees both, so an
    // empty `banned` above means absent, not unparsed.
    let r = closure("yoco-ref");
    assert!(r.iter().any(|p| p.starts_with("candle-core ")), "{r:?}");
    assert!(r.iter().any(|p| p.starts_with("gemm ")), "{r:?}");
}
