//! The unwinder on code built without frame pointers: an embedding operator's own code
//! usually is (only this repository's build forces them, through its workspace wrapper).
//! Builds `tests/fixtures/no_frame_pointers.rs` as a crate of its own, outside this
//! workspace and without the wrapper, against the library, and runs it: the function
//! that blocks is named in the stack captured from outside.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fixture crate, written under cargo's temporary folder for integration tests.
fn fixture() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-frame-pointers");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = format!(
        r#"[package]
name = "no-frame-pointers"
version = "0.0.0"
edition = "2024"
publish = false

# A workspace of its own: not this repository's, so not its wrapper's either.
[workspace]

[dependencies]
reconcile-watchdog = {{ path = {lib:?}, default-features = false, features = ["stack-capture"] }}

# Its own code optimised, as a release build's: without frame pointers, the register
# holds anything by the time it calls into the standard library, whose frame record
# then saves that. (Its dependencies stay debug builds, which are quicker to build.)
[profile.dev.package.no-frame-pointers]
opt-level = 3
"#,
        lib = root.join("lib").display().to_string()
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::copy(
        root.join("tests/fixtures/no_frame_pointers.rs"),
        dir.join("src/main.rs"),
    )
    .unwrap();
    // The repository's versions: nothing to resolve, nothing to download.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    dir
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux", target_arch = "x86_64"))]
fn a_blocking_function_built_without_frame_pointers_is_named() {
    let dir = fixture();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(&cargo)
        .args(["build", "--offline", "--quiet"])
        .current_dir(&dir)
        // No wrapper, no frame pointers forced: as an embedding operator builds.
        .env("RUSTC_WORKSPACE_WRAPPER", "")
        .env_remove("RUSTFLAGS")
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .status()
        .expect("cargo runs");
    assert!(built.success(), "the fixture did not build");
    let binary = dir.join("target/debug/no-frame-pointers");
    // It has no frame pointers of its own: the blocking function does not push one.
    let listing = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(&binary)
        .output();
    if let Ok(listing) = listing {
        let text = String::from_utf8_lossy(&listing.stdout);
        let body: Vec<&str> = text
            .split("\n\n")
            .find(|f| {
                f.lines().next().is_some_and(|l| {
                    l.contains("blocking_without_frame_pointers") && l.ends_with(">:")
                })
            })
            .expect("the blocking function in the listing")
            .lines()
            .skip(1)
            .take(2)
            .collect();
        assert!(
            !body
                .iter()
                .any(|l| l.contains("push") && l.contains("%rbp")),
            "the fixture was built with frame pointers: {body:?}"
        );
    }
    let run = Command::new(&binary).output().expect("the fixture runs");
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "not named:\n{out}");
    eprintln!("{out}");
}
