//! The pages against the repository: every relative link and anchor resolves, README.md
//! and lib/README.md name only log targets, features and flags the code has, the code
//! the pages quote from the examples is the examples' code, and README.md's kube-3
//! dependency line is the one `examples/kube-3-operator` builds with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::BIN;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Markdown pages: README.md, lib/README.md, CHANGELOG.md and docs/*.md.
fn pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = ["README.md", "lib/README.md", "CHANGELOG.md"]
        .iter()
        .map(|p| root().join(p))
        .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("a readable entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of a page outside its fenced code blocks, with their numbers (from 1).
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// `line` without its inline code spans (what a link cannot be inside).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    for (index, part) in line.split('`').enumerate() {
        if index % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// The inline code spans of `line`.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// The targets of the inline links `[text](target)` of `line`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        targets.push(rest[..end].trim().to_owned());
        rest = &rest[end..];
    }
    targets
}

/// GitHub's anchor of a heading: lowercase; letters, digits, `-` and `_` kept; spaces
/// made `-`; everything else dropped.
fn slug(heading: &str) -> String {
    // A link in a heading anchors by its text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match (after.find("]("), after.find(')')) {
            (Some(close), Some(end)) if close < end => {
                text.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            _ => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings, numbered as GitHub numbers repeated ones.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let anchor = slug(heading.trim());
        let count = seen.entry(anchor.clone()).or_default();
        anchors.insert(match *count {
            0 => anchor,
            n => format!("{anchor}-{n}"),
        });
        *count += 1;
    }
    anchors
}

#[test]
fn every_relative_link_and_anchor_of_the_pages_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        let dir = page.parent().expect("a page is in a folder");
        for (number, line) in prose(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                let at = format!("{}:{number}: {target}", page.display());
                if !file.exists() {
                    broken.push(format!("{at}: no such file"));
                    continue;
                }
                if let Some(anchor) = anchor {
                    if file.extension().is_none_or(|e| e != "md") {
                        broken.push(format!("{at}: an anchor into a file that is not a page"));
                    } else if !anchors(&read(&file)).contains(anchor) {
                        broken.push(format!("{at}: no heading with that anchor"));
                    }
                }
            }
        }
    }
    assert!(
        checked > 100,
        "too few links found ({checked}): is the parser blind?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_anchors_are_githubs() {
    assert_eq!(slug("Choosing `--on-hang`"), "choosing---on-hang");
    assert_eq!(
        slug("Where an awaiting reconcile waits: `waiting_on`, `label`, `waker`, `task_trace`"),
        "where-an-awaiting-reconcile-waits-waiting_on-label-waker-task_trace"
    );
    assert_eq!(
        slug("1. The adapter, with your own `Controller::run`"),
        "1-the-adapter-with-your-own-controllerrun"
    );
    assert_eq!(
        slug("The watchdog's flags in your command line"),
        "the-watchdogs-flags-in-your-command-line"
    );
    assert_eq!(
        anchors("# A\n\n## A\n\n```\n# not a heading\n```\n### B [link](x.md)\n"),
        ["a", "a-1", "b-link"].map(String::from).into()
    );
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("a readable entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The log targets the code names in string literals (`target: "..."` and the constants
/// it uses): every `"reconcile_watchdog…::…"` literal of lib/src and src.
fn explicit_targets() -> BTreeSet<String> {
    let mut files = Vec::new();
    sources(&root().join("lib/src"), &mut files);
    sources(&root().join("src"), &mut files);
    let mut targets = BTreeSet::new();
    for file in files {
        let text = read(&file);
        for literal in text.split('"').skip(1).step_by(2) {
            if literal.starts_with("reconcile_watchdog")
                && literal.contains("::")
                && literal
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            {
                targets.insert(literal.to_owned());
            }
        }
    }
    targets
}

/// The source file of module `path` (`reconcile_watchdog::monitor::report`), if any.
fn module_file(path: &str) -> Option<PathBuf> {
    let mut segments = path.split("::");
    let dir = match segments.next()? {
        "reconcile_watchdog" => root().join("lib/src"),
        "reconcile_watchdog_operator" => root().join("src"),
        _ => return None,
    };
    let rest: Vec<&str> = segments.collect();
    if rest.is_empty() {
        return Some(dir.join("lib.rs"));
    }
    let joined: PathBuf = rest.iter().collect();
    [
        dir.join(&joined).with_extension("rs"),
        dir.join(&joined).join("mod.rs"),
    ]
    .into_iter()
    .find(|file| file.exists())
}

/// Whether `path` names a module of the code, or an item a module of it mentions.
fn resolves(path: &str) -> bool {
    if module_file(path).is_some() {
        return true;
    }
    let Some((parent, item)) = path.rsplit_once("::") else {
        return false;
    };
    module_file(parent).is_some_and(|file| {
        read(&file)
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|word| word == item)
    })
}

/// The `reconcile_watchdog…::…` paths in `text`.
fn crate_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("reconcile_watchdog") {
        let before = rest[..at].chars().next_back();
        let path: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        rest = &rest[at + path.len()..];
        let path = path.trim_end_matches(':');
        if path.contains("::") && before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_')) {
            paths.push(path.to_owned());
        }
    }
    paths
}

/// The library's and the binary's features.
fn features() -> BTreeSet<String> {
    let mut features = BTreeSet::new();
    for manifest in ["lib/Cargo.toml", "Cargo.toml"] {
        let text = read(&root().join(manifest));
        let mut inside = false;
        for line in text.lines() {
            if line.starts_with('[') {
                inside = line.trim() == "[features]";
                continue;
            }
            if inside && let Some((name, _)) = line.split_once(" = ") {
                features.insert(name.trim().to_owned());
            }
        }
    }
    features
}

/// The flags of every subcommand, as the binary's `--help` lists them.
fn flags() -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for command in [&[][..], &["run"], &["demo"], &["deadlines"], &["crd"]] {
        let output = Command::new(BIN)
            .args(command)
            .arg("--help")
            .env_remove("RUST_LOG")
            .output()
            .expect("the binary runs");
        assert!(output.status.success(), "{command:?} --help: {output:?}");
        let help = String::from_utf8(output.stdout).expect("UTF-8");
        for word in help.split(|c: char| c.is_whitespace() || c == ',' || c == '=') {
            if let Some(name) = word.strip_prefix("--")
                && !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                flags.insert(format!("--{name}"));
            }
        }
    }
    assert!(
        flags.len() > 20,
        "too few flags read from --help: {flags:?}"
    );
    flags
}

/// The feature names a page gives: in a sentence, `feature `x``, `features `x`, `y` and
/// `z`` and `the `x` feature`; the first column of a table headed `feature`; and the
/// list of a `reconcile-watchdog = { ... features = [...] }` line.
fn features_named(text: &str) -> Vec<String> {
    let mut named = Vec::new();
    let is_name = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    };
    for line in text.lines() {
        if line.trim_start().starts_with("reconcile-watchdog = ")
            && let Some((_, list)) = line.split_once("features = [")
        {
            let list = list.split(']').next().unwrap_or_default();
            named.extend(
                list.split(',')
                    .map(|f| f.trim().trim_matches('"').to_owned()),
            );
        }
    }
    let mut in_table = false;
    for (_, line) in prose(text) {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if !line.trim_start().starts_with('|') {
            in_table = false;
        } else if cells[0] == "feature" {
            in_table = true;
        } else if in_table && !cells[0].starts_with("---") {
            named.extend(
                code_spans(cells[0])
                    .into_iter()
                    .filter(|s| is_name(s))
                    .map(str::to_owned),
            );
        }
    }
    let flat = without_fences(text).replace('\n', " ");
    for sentence in flat.split(". ") {
        if !sentence.to_lowercase().contains("feature") {
            continue;
        }
        let parts: Vec<&str> = sentence.split('`').collect();
        let mut listing = false;
        for (index, span) in parts.iter().enumerate().skip(1).step_by(2) {
            let before = parts[index - 1].trim_end().to_lowercase();
            let after = parts
                .get(index + 1)
                .map_or(String::new(), |s| s.to_lowercase());
            let separator = matches!(before.trim(), "," | "and" | "or" | ", and" | ", or");
            listing = before.ends_with("feature")
                || before.ends_with("features")
                || (listing && separator);
            let trails = after.trim_start().starts_with("feature");
            if (listing || trails) && is_name(span) {
                named.push((*span).to_owned());
            }
        }
    }
    named
}

fn without_fences(text: &str) -> String {
    prose(text)
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The flags a page's prose names: a code span that starts with `--`, and the `--x`
/// words of a span that runs the binary.
fn flags_named(text: &str) -> Vec<String> {
    let mut named = Vec::new();
    for (_, line) in prose(text) {
        for span in code_spans(line) {
            let words: Vec<&str> = span.split_whitespace().collect();
            let runs_binary = words
                .first()
                .is_some_and(|w| *w == "reconcile-watchdog" || w.ends_with("/reconcile-watchdog"));
            for (index, word) in words.iter().enumerate() {
                if word.starts_with("--") && (index == 0 || runs_binary) {
                    let name = word.split('=').next().unwrap_or_default();
                    named.push(name.to_owned());
                }
            }
        }
    }
    named
}

#[test]
fn the_readmes_name_only_targets_features_and_flags_the_code_has() {
    let targets = explicit_targets();
    assert!(
        targets.contains("reconcile_watchdog::hang")
            && targets.contains("reconcile_watchdog::near_miss"),
        "the code's targets were not found: {targets:?}"
    );
    let (features, flags) = (features(), flags());
    let mut wrong = Vec::new();
    for page in ["README.md", "lib/README.md"] {
        let text = read(&root().join(page));
        for path in crate_paths(&text) {
            if !targets.contains(&path) && !resolves(&path) {
                wrong.push(format!(
                    "{page}: `{path}` is neither a log target nor a path of the code"
                ));
            }
        }
        // What a page calls a target must be one: named by the code, or a module that logs.
        let flat = without_fences(&text).replace('\n', " ");
        for (at, _) in flat.match_indices("target") {
            let window: String = flat[at..].chars().take(240).collect();
            let window = window.split(". ").next().unwrap_or_default();
            for span in code_spans(window) {
                if !span.starts_with("reconcile_watchdog") || span.contains(' ') {
                    continue;
                }
                let logs = module_file(span).is_some_and(|f| read(&f).contains("tracing::"));
                if !targets.contains(span) && !logs {
                    wrong.push(format!(
                        "{page}: target `{span}` is not one the code logs under"
                    ));
                }
            }
        }
        let named = features_named(&text);
        for feature in &named {
            if !features.contains(feature) {
                wrong.push(format!(
                    "{page}: feature `{feature}` is not the library's nor the binary's"
                ));
            }
        }
        for flag in flags_named(&text) {
            if !flags.contains(&flag) {
                wrong.push(format!(
                    "{page}: flag `{flag}` is not in any subcommand's --help"
                ));
            }
        }
        assert!(
            !named.is_empty(),
            "{page}: no feature found: is the reader blind?"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_readers_of_names_see_what_a_page_says() {
    let text = "Build with the `task-dump` feature. The features `kube-4`, `kube-3` and `nope`,\n\
                not `Controllers`. Targets `reconcile_watchdog::hang` and\n\
                `reconcile_watchdog::kube::guarded`.\n\n\
                | feature | on by default |\n|---|---|\n| `clap` | no |\n\n\
                ```toml\nreconcile-watchdog = { path = \"x\", features = [\"kube-3\", \"stack-capture\"] }\n```\n\
                Run `reconcile-watchdog demo --hang-kind block` or with `--on-hang=cancel`; `cargo run --release`.";
    assert_eq!(
        features_named(text),
        [
            "kube-3",
            "stack-capture",
            "clap",
            "task-dump",
            "kube-4",
            "kube-3",
            "nope"
        ]
    );
    assert_eq!(flags_named(text), ["--hang-kind", "--on-hang"]);
    assert_eq!(
        crate_paths(text),
        [
            "reconcile_watchdog::hang",
            "reconcile_watchdog::kube::guarded"
        ]
    );
    assert!(resolves("reconcile_watchdog::kube::guarded"));
    assert!(!resolves("reconcile_watchdog::kube::no_such_thing"));
    assert!(!features().contains("nope"));
}

/// The blocks between `// docs: begin NAME` and `// docs: end NAME` of a source file,
/// their indentation taken off.
fn regions(source: &str) -> BTreeMap<String, String> {
    let mut regions = BTreeMap::new();
    let mut open: Option<(String, usize, Vec<String>)> = None;
    for line in source.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("// docs: begin ") {
            assert!(open.is_none(), "`{name}` opens inside another block");
            open = Some((
                name.to_owned(),
                line.len() - line.trim_start().len(),
                Vec::new(),
            ));
        } else if let Some(name) = trimmed.strip_prefix("// docs: end ") {
            let (begun, _, lines) = open
                .take()
                .unwrap_or_else(|| panic!("`{name}` ends unopened"));
            assert_eq!(begun, name, "a block ends under another name");
            regions.insert(begun, lines.join("\n"));
        } else if let Some((_, indent, lines)) = &mut open {
            lines.push(line.get(*indent..).unwrap_or("").trim_end().to_owned());
        }
    }
    assert!(open.is_none(), "a block is not ended");
    regions
}

/// The blocks a page quotes: `<!-- quote: PATH#NAME -->`, then a fenced block, whose
/// lines (its fence's indentation taken off) are returned with `PATH`, `NAME` and the
/// marker's line.
fn quotes(page: &str) -> Vec<(String, String, usize, String)> {
    let lines: Vec<&str> = page.lines().collect();
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let Some(marker) = line
            .trim()
            .strip_prefix("<!-- quote: ")
            .and_then(|m| m.strip_suffix(" -->"))
        else {
            continue;
        };
        let (path, name) = marker.split_once('#').expect("a quote is PATH#NAME");
        let fence = lines.get(index + 1).expect("a block follows the marker");
        let indent = fence.len() - fence.trim_start().len();
        assert!(
            fence.trim_start().starts_with("```"),
            "line {}: no fence after the marker",
            index + 2
        );
        let body: Vec<&str> = lines[index + 2..]
            .iter()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .map(|l| l.get(indent..).unwrap_or(""))
            .collect();
        found.push((path.to_owned(), name.to_owned(), index + 1, body.join("\n")));
    }
    found
}

#[test]
fn the_code_the_pages_quote_is_the_examples_code() {
    let mut quoted: BTreeSet<(String, String)> = BTreeSet::new();
    for page in pages() {
        for (path, name, line, body) in quotes(&read(&page)) {
            let regions = regions(&read(&root().join(&path)));
            let region = regions.get(&name).unwrap_or_else(|| {
                panic!("{}:{line}: {path} has no block `{name}`", page.display())
            });
            assert_eq!(
                &body,
                region,
                "{}:{line}: the block differs from {path}'s `{name}`: copy the example's code",
                page.display()
            );
            quoted.insert((path, name));
        }
    }
    // Every marked block of the examples is on a page.
    for path in [
        "examples/downstream/src/main.rs",
        "examples/kube-3-operator/src/main.rs",
        "examples/older-kube/src/lib.rs",
    ] {
        for name in regions(&read(&root().join(path))).keys() {
            assert!(
                quoted.contains(&(path.to_owned(), name.clone())),
                "{path}'s block `{name}` is quoted by no page"
            );
        }
    }
    assert!(quoted.len() >= 6, "too few quotes found: {quoted:?}");
}

#[test]
fn a_changed_example_is_a_differing_quote() {
    let source = "fn main() {\n    // docs: begin one\n    let a = 1;\n\n    let b = 2;\n    // docs: end one\n}\n";
    let regions = regions(source);
    assert_eq!(regions["one"], "let a = 1;\n\nlet b = 2;");
    let page =
        "Text\n\n  <!-- quote: x.rs#one -->\n  ```rust\n  let a = 1;\n\n  let b = 3;\n  ```\n";
    let quoted = quotes(page);
    assert_eq!(quoted.len(), 1);
    assert_ne!(quoted[0].3, regions["one"]);
}

/// README.md's dependency line for kube 3, marked by a comment before its block.
fn readme_kube_3_line() -> String {
    let readme = read(&root().join("README.md"));
    let at = readme
        .find("<!-- the kube-3 dependency line")
        .expect("README.md marks its kube-3 dependency line");
    readme[at..]
        .lines()
        .find(|l| l.starts_with("reconcile-watchdog = "))
        .expect("a dependency line follows the marker")
        .to_owned()
}

#[test]
fn the_kube_3_example_builds_with_the_readmes_dependency_line() {
    let line = readme_kube_3_line();
    assert!(line.contains("default-features = false"), "{line}");
    assert!(line.contains("\"kube-3\""), "{line}");
    // The example depends on the checkout instead of the repository's URL.
    let source = "git = \"https://URL-OF-THIS-REPOSITORY\", rev = \"COMMIT\"";
    assert!(line.contains(source), "{line}");
    let local = line.replace(source, "path = \"../../lib\"");
    let manifest = read(&root().join("examples/kube-3-operator/Cargo.toml"));
    assert!(
        manifest.lines().any(|l| l == local),
        "examples/kube-3-operator/Cargo.toml does not depend on the library as README.md says:\n{local}"
    );
}

/// The library's modules that allow `unsafe` code outside tests, as paths under
/// `lib/src/` (`guard/clock.rs`).
fn unsafe_modules() -> BTreeSet<String> {
    let src = root().join("lib/src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut modules = BTreeSet::new();
    for file in files {
        if !read(&file).contains("#![allow(unsafe_code)]") {
            continue;
        }
        // A module its parent declares under `#[cfg(test)]`, or `cfg(all(test, …))`, is
        // the tests' own.
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a file name");
        let dir = file.parent().expect("a folder");
        let parent = [
            dir.join("mod.rs"),
            dir.with_extension("rs"),
            src.join("lib.rs"),
        ]
        .into_iter()
        .find(|p| p.exists() && *p != file)
        .expect("a parent module");
        let parent = read(&parent);
        let lines: Vec<&str> = parent.lines().collect();
        let test_only = lines.iter().enumerate().any(|(at, line)| {
            line.trim() == format!("mod {name};")
                && at > 0
                && (lines[at - 1].contains("cfg(test)") || lines[at - 1].contains("cfg(all(test"))
        });
        if !test_only {
            let relative = file.strip_prefix(&src).expect("under lib/src");
            modules.insert(relative.to_string_lossy().into_owned());
        }
    }
    modules
}

#[test]
fn the_pages_name_every_module_that_allows_unsafe_code() {
    let modules = unsafe_modules();
    assert!(modules.contains("guard/clock.rs"), "{modules:?}");
    let count = [
        "no", "one", "two", "three", "four", "five", "six", "seven", "eight",
    ]
    .get(modules.len())
    .copied()
    .unwrap_or("many");
    let front_page = read(&root().join("lib/src/lib.rs"));
    let table = read(&root().join("docs/stack-capture.md"));
    let readme = read(&root().join("README.md"));
    let mut wrong = Vec::new();
    if !front_page.contains(&format!(
        "`unsafe` code is denied except in {count} modules"
    )) {
        wrong.push(format!(
            "lib/src/lib.rs does not say `unsafe` is in {count} modules"
        ));
    }
    if !table.contains(&format!("except in {count} modules")) {
        wrong.push(format!(
            "docs/stack-capture.md does not say `unsafe` is in {count} modules"
        ));
    }
    for module in &modules {
        if !front_page.contains(&format!("`{module}`")) {
            wrong.push(format!("lib/src/lib.rs does not name {module}"));
        }
        if !table.contains(&format!("`lib/src/{module}`")) {
            wrong.push(format!(
                "docs/stack-capture.md's table has no row for lib/src/{module}"
            ));
        }
        // The layout's table names the file, alone or with its folder.
        let file = module.rsplit('/').next().expect("a file");
        if !readme.contains(&format!("{file}`")) {
            wrong.push(format!("README.md's layout does not name {file}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "modules with unsafe code: {modules:?}\n{}",
        wrong.join("\n")
    );
}
