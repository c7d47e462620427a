//! The house's structure, checked from the source: no source file over 1,000 lines, no
//! crate that depends on a crate above it, and inside every crate no file that imports
//! a file above it. The order is written down once, in ARCHITECTURE.md's `layers`
//! block; a new file has to be placed there, and an import that points up fails here
//! with both files named.
//!
//! An import is any path through `crate::`, `super::` or `self::` (in `use` lines and
//! in code), a name that lib.rs re-exports taken through the crate root, and a `mod`
//! declaration (a module file stands above the files it declares). Comments and the
//! trailing `#[cfg(test)]` module of a file are not read: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 1000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The `layers` block of ARCHITECTURE.md: `name: a < b < c` lines, bottom first.
fn layer_lines() -> BTreeMap<String, Vec<String>> {
    let text = fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let block = text
        .split("```layers\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("ARCHITECTURE.md has a ```layers block");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, order) = l.split_once(':').expect("a layers line is `name: a < b`");
            let files = order.split('<').map(|f| f.trim().to_string()).collect();
            (name.trim().to_string(), files)
        })
        .collect()
}

/// The workspace's member crates: folder name -> package name.
fn members() -> Vec<(String, String)> {
    let ws = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let list = ws
        .split("members = [")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap();
    list.split(',')
        .map(|s| s.trim().trim_matches('"').to_string())
        .filter(|s| !s.is_empty())
        .map(|dir| {
            let toml = fs::read_to_string(root().join(&dir).join("Cargo.toml")).unwrap();
            let name = toml
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .and_then(|l| l.strip_suffix('"'))
                .unwrap()
                .to_string();
            (dir, name)
        })
        .collect()
}

#[test]
fn no_source_file_is_over_1000_lines() {
    let mut long = Vec::new();
    for (dir, _) in members() {
        for f in rust_files(&root().join(&dir).join("src")) {
            let n = fs::read_to_string(&f).unwrap().lines().count();
            if n > MAX_LINES {
                long.push(format!(
                    "{} ({n} lines)",
                    f.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these along a concept: {}",
        long.join(", ")
    );
}

#[test]
fn no_crate_depends_on_a_crate_above_it() {
    let layers = layer_lines();
    let order = &layers["crates"];
    let members = members();
    let by_package: BTreeMap<&str, &str> = members
        .iter()
        .map(|(d, n)| (n.as_str(), d.as_str()))
        .collect();
    let mut problems = Vec::new();
    for (dir, _) in &members {
        let Some(at) = order.iter().position(|c| c == dir) else {
            problems.push(format!("crate folder {dir} is not in the `crates:` line"));
            continue;
        };
        let toml = fs::read_to_string(root().join(dir).join("Cargo.toml")).unwrap();
        // Regular dependencies only: a dev-dependency (tests, benches) may sit anywhere.
        let deps = toml
            .split("[dependencies]")
            .nth(1)
            .map(|s| s.split("\n[").next().unwrap_or(""))
            .unwrap_or("");
        for line in deps.lines() {
            let Some((name, _)) = line.split_once(['.', ' ', '=']) else {
                continue;
            };
            let Some(dep_dir) = by_package.get(name.trim()) else {
                continue;
            };
            let dep_at = order.iter().position(|c| c == dep_dir);
            if dep_at.is_none_or(|d| d >= at) {
                problems.push(format!("{dir} depends on {dep_dir}, which is not below it"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A crate's source as modules: `a/b` for src/a/b.rs (and src/a/b/mod.rs).
struct Crate {
    src: PathBuf,
    /// Module name -> its text, comments and trailing test module removed.
    files: BTreeMap<String, String>,
    /// Names lib.rs re-exports -> the module they come from.
    reexports: BTreeMap<String, String>,
}

fn module_name(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let s = rel.to_string_lossy().replace('\\', "/");
    s.strip_suffix("/mod").map(str::to_string).unwrap_or(s)
}

/// The text without comments (doc links are not imports) and without the trailing
/// `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        // A `//` inside a string literal is rare in these files; a URL in a string
        // would only hide an import on the same line.
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

impl Crate {
    fn load(dir: &str) -> Crate {
        let src = root().join(dir).join("src");
        let mut files = BTreeMap::new();
        for f in rust_files(&src) {
            files.insert(
                module_name(&src, &f),
                code_of(&fs::read_to_string(&f).unwrap()),
            );
        }
        let mut reexports = BTreeMap::new();
        let lib = files.get("lib").cloned().unwrap_or_default();
        for stmt in lib.split(';') {
            let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
                continue;
            };
            let Some((module, names)) = rest.split_once("::") else {
                continue;
            };
            if !files.contains_key(module) {
                continue; // a re-export from another crate
            }
            for name in names.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if !name.is_empty() && name != "self" {
                    reexports.insert(name.to_string(), module.to_string());
                }
            }
        }
        Crate {
            src,
            files,
            reexports,
        }
    }

    /// The file a module path names: the longest prefix that is a file.
    fn resolve(&self, segments: &[String]) -> Option<String> {
        for n in (1..=segments.len()).rev() {
            let name = segments[..n].join("/");
            if self.files.contains_key(&name) && name != "lib" && name != "main" {
                return Some(name);
            }
        }
        let first = segments.first()?;
        self.reexports.get(first).cloned()
    }

    /// The files `module` imports.
    fn imports(&self, module: &str) -> BTreeSet<String> {
        let text = &self.files[module];
        let parent: Vec<String> = match module.rsplit_once('/') {
            Some((p, _)) => p.split('/').map(str::to_string).collect(),
            None => Vec::new(),
        };
        let this: Vec<String> = module.split('/').map(str::to_string).collect();
        let mut out = BTreeSet::new();
        for (prefix, base) in [
            ("crate::", Vec::new()),
            // A file's `super::` is its parent module, whether the file is a leaf or a
            // module file of its own; `self::` is the file itself.
            ("super::", parent),
            ("self::", this),
        ] {
            for (i, _) in text.match_indices(prefix) {
                let before = text[..i].chars().last();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue; // `super::super::`, `foo::crate::`...
                }
                for path in paths_after(&text[i + prefix.len()..]) {
                    let mut segs = base.clone();
                    segs.extend(path);
                    if let Some(target) = self.resolve(&segs) {
                        if target != module {
                            out.insert(target);
                        }
                    }
                }
            }
        }
        // `mod child;` declarations: the module file stands above its children.
        for stmt in text.split(';') {
            let s = stmt.trim();
            let s = s.rsplit('\n').next().unwrap_or(s).trim();
            let s = s.strip_prefix("pub ").unwrap_or(s);
            let s = s.strip_prefix("pub(crate) ").unwrap_or(s);
            if let Some(child) = s.strip_prefix("mod ") {
                let name = if module == "lib" || module == "main" {
                    child.to_string()
                } else {
                    format!("{module}/{child}")
                };
                if self.files.contains_key(&name) {
                    out.insert(name);
                }
            }
        }
        out
    }
}

/// The module paths written after `crate::` (or `super::`/`self::`): `a::b::C` gives
/// `[a, b, C]`; a group `{a::X, b::{Y, Z}}` gives one path per item's first segments.
fn paths_after(s: &str) -> Vec<Vec<String>> {
    let s = s.trim_start();
    if let Some(rest) = s.strip_prefix('{') {
        let mut depth = 1;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let inner = &rest[..end];
        let mut items = Vec::new();
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&inner[start..]);
        return items
            .into_iter()
            .filter(|t| !t.trim().is_empty())
            .flat_map(|t| paths_after(t.trim()))
            .collect();
    }
    let mut segs = Vec::new();
    let mut rest = s;
    loop {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            if let Some(r) = rest.strip_prefix('{') {
                // `a::{X, Y}`: the group's items under the segments so far.
                return paths_after(&format!("{{{r}"))
                    .into_iter()
                    .map(|p| segs.iter().cloned().chain(p).collect())
                    .collect();
            }
            break;
        }
        segs.push(rest[..end].to_string());
        match rest[end..].strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    if segs.is_empty() {
        Vec::new()
    } else {
        vec![segs]
    }
}

#[test]
fn files_inside_each_crate_stand_in_layers() {
    let layers = layer_lines();
    let mut problems = Vec::new();
    for (dir, _) in members() {
        let krate = Crate::load(&dir);
        let modules: Vec<&String> = krate
            .files
            .keys()
            .filter(|m| *m != "lib" && *m != "main")
            .collect();
        let Some(order) = layers.get(&dir) else {
            problems.push(format!(
                "ARCHITECTURE.md has no layers line for {dir} (its files: {})",
                modules
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        };
        let before = problems.len();
        let mut seen = BTreeSet::new();
        for m in order {
            if !krate.files.contains_key(m) {
                problems.push(format!(
                    "{dir}: the layers line names {m}, which is not a file of {}",
                    krate.src.display()
                ));
            }
            if !seen.insert(m) {
                problems.push(format!("{dir}: {m} is named twice in its layers line"));
            }
        }
        for m in &modules {
            let Some(at) = order.iter().position(|o| o == *m) else {
                problems.push(format!("{dir}: src/{m}.rs is not in its layers line"));
                continue;
            };
            for target in krate.imports(m) {
                if target == "lib" || target == "main" {
                    continue;
                }
                match order.iter().position(|o| *o == target) {
                    Some(t) if t < at => {}
                    _ => problems.push(format!(
                        "{dir}: {m} imports {target}, which does not stand below it"
                    )),
                }
            }
        }
        if problems.len() > before {
            problems.push(format!("{dir}: {}", suggested_order(&krate, &modules)));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// A layers line the imports allow (Kahn's order, ties by name), or the files that
/// import each other in a circle.
fn suggested_order(krate: &Crate, modules: &[&String]) -> String {
    let imports: BTreeMap<&str, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.as_str(), krate.imports(m)))
        .collect();
    let mut placed: Vec<&str> = Vec::new();
    let mut left: BTreeSet<&str> = modules.iter().map(|m| m.as_str()).collect();
    while let Some(next) = left
        .iter()
        .copied()
        .find(|m| imports[m].iter().all(|t| !left.contains(t.as_str())))
    {
        placed.push(next);
        left.remove(next);
    }
    if left.is_empty() {
        format!("an order its imports allow: {}", placed.join(" < "))
    } else {
        let circle: Vec<&str> = left.into_iter().collect();
        format!(
            "no order exists: these files import each other in a circle (or through one): {}",
            circle.join(", ")
        )
    }
}

/// The checker itself reads grouped and nested paths.
#[test]
fn paths_after_reads_groups() {
    let p = paths_after("{a::X, b::{Y, Z}, c}; rest");
    assert_eq!(
        p,
        vec![
            vec!["a".to_string(), "X".to_string()],
            vec!["b".to_string(), "Y".to_string()],
            vec!["b".to_string(), "Z".to_string()],
            vec!["c".to_string()],
        ]
    );
    assert_eq!(
        paths_after("lower::rows::Bound;"),
        vec![vec![
            "lower".to_string(),
            "rows".to_string(),
            "Bound".to_string()
        ]]
    );
}
