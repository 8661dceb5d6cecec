//! `docs/flags.md` against `--help`: every subcommand that `--help` lists has a section
//! whose table names exactly its flags, with their environment variables and defaults.
//! Sections for subcommands this build does not have are not checked. The page is the
//! one table of flags: `run`'s comes first, and README.md keeps none of its own.

use crate::support;

use std::collections::BTreeMap;
use std::process::Command;

use support::BIN;

/// A flag as documented or as `--help` shows it: (environment variable, default).
type Flags = BTreeMap<String, (String, String)>;

/// Runs the binary with `args`, with no RECONCILE_WATCHDOG_* variable set (clap shows a
/// set variable's value in `--help`).
fn help(args: &[&str]) -> String {
    let mut command = Command::new(BIN);
    command.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RECONCILE_WATCHDOG_") {
            command.env_remove(name);
        }
    }
    let output = command.output().expect("the binary runs");
    assert!(output.status.success(), "{args:?} failed: {output:?}");
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

/// The subcommands under `Commands:` in the top-level `--help`, but `help` itself.
fn subcommands() -> Vec<String> {
    let text = help(&["--help"]);
    let commands = text
        .split("Commands:\n")
        .nth(1)
        .expect("--help lists its commands");
    commands
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Between `[KEY: ` and the next `]` in `block`.
fn bracketed<'a>(block: &'a str, key: &str) -> Option<&'a str> {
    let start = block.find(&format!("[{key}: "))? + key.len() + 3;
    let len = block[start..].find(']')?;
    Some(&block[start..start + len])
}

/// The flags of `reconcile-watchdog SUBCOMMAND --help`, but `--help` and `--version`.
fn flags_in_help(subcommand: &str) -> Flags {
    let text = help(&[subcommand, "--help"]);
    let options = text
        .split("Options:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{subcommand} --help has no Options"));
    // Each flag starts a line `  -x, --name <VALUE>` or `      --name <VALUE>`.
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in options.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed
            .strip_prefix("--")
            .or_else(|| trimmed.split_once(", --").map(|(_, rest)| rest))
            .filter(|_| line.len() - trimmed.len() <= 6);
        match flag {
            Some(rest) => {
                let name = rest.split_whitespace().next().unwrap_or_default();
                blocks.push((format!("--{name}"), String::new()));
            }
            None => {
                if let Some((_, block)) = blocks.last_mut() {
                    block.push_str(line);
                    block.push('\n');
                }
            }
        }
    }
    blocks
        .into_iter()
        .filter(|(name, _)| name != "--help" && name != "--version")
        .map(|(name, block)| {
            let env = bracketed(&block, "env")
                .map(|e| e.trim_end_matches('=').to_owned())
                .unwrap_or_else(|| panic!("{subcommand} {name} has no environment variable"));
            let default =
                bracketed(&block, "default").map_or_else(|| "—".to_owned(), str::to_owned);
            (name, (env, default))
        })
        .collect()
}

/// `## \`NAME\`` sections of docs/flags.md and the flags in their tables.
fn flags_in_doc() -> BTreeMap<String, Flags> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md");
    let doc = std::fs::read_to_string(path).expect("docs/flags.md exists");
    let unquote = |cell: &str| {
        let cell = cell.trim();
        cell.strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .unwrap_or(cell)
            .to_owned()
    };
    // The subcommands' sections; others (builder methods) have no flag rows of a subcommand.
    doc.split("\n## ")
        .filter_map(|section| section.strip_prefix('`'))
        .map(|section| {
            let (name, body) = section.split_once('`').expect("a section heading");
            let flags = body
                .lines()
                .filter(|l| l.starts_with("| `--"))
                .map(|row| {
                    let cells: Vec<&str> = row.split('|').collect();
                    assert!(cells.len() >= 5, "short table row {row:?}");
                    (unquote(cells[1]), (unquote(cells[2]), unquote(cells[3])))
                })
                .collect();
            (name.to_owned(), flags)
        })
        .collect()
}

#[test]
fn flags_md_matches_help_for_every_subcommand() {
    let documented = flags_in_doc();
    let subcommands = subcommands();
    assert!(subcommands.contains(&"demo".to_owned()), "{subcommands:?}");
    for subcommand in &subcommands {
        let doc = documented
            .get(subcommand)
            .unwrap_or_else(|| panic!("docs/flags.md has no section for `{subcommand}`"));
        let help = flags_in_help(subcommand);
        let missing: Vec<_> = help.keys().filter(|f| !doc.contains_key(*f)).collect();
        let stale: Vec<_> = doc.keys().filter(|f| !help.contains_key(*f)).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "{subcommand}: undocumented flags {missing:?}; documented but gone {stale:?}"
        );
        for (flag, (env, default)) in &help {
            assert_eq!(
                &doc[flag],
                &(env.clone(), default.clone()),
                "docs/flags.md `{subcommand}` {flag}: (variable, default) differ from --help"
            );
        }
    }
}

#[test]
fn flags_md_shows_run_first_and_readme_has_no_table_of_its_own() {
    let first = flags_in_doc_order().into_iter().next();
    assert_eq!(
        first.as_deref(),
        Some("run"),
        "docs/flags.md opens with `run`"
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).expect("README.md exists");
    let rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `--")).collect();
    assert!(
        rows.is_empty(),
        "README.md has flag rows of its own; link to docs/flags.md instead: {rows:?}"
    );
}

/// The subcommands of docs/flags.md's sections, in the page's order.
fn flags_in_doc_order() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md");
    let doc = std::fs::read_to_string(path).expect("docs/flags.md exists");
    doc.split("\n## ")
        .filter_map(|section| section.strip_prefix('`'))
        .filter_map(|section| section.split_once('`').map(|(name, _)| name.to_owned()))
        .collect()
}
