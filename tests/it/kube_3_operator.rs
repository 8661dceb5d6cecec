//! An operator on kube 3 builds with README.md's dependency line: `cargo check` of
//! `examples/kube-3-operator` (its own workspace and lockfile, `--locked`), whose
//! dependency on the library `docs.rs` holds to that line. Its first run checks kube 3,
//! k8s-openapi 0.27 and the rest of the example's tree in a target folder of its own
//! (2 min 30 s to 3 min, 100 s of CPU, on two busy cores); later runs take seconds.

use std::path::Path;
use std::process::Command;

#[test]
fn an_operator_on_kube_3_compiles_its_controller_with_the_readmes_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["check", "--locked", "--quiet", "--manifest-path"])
        .arg(root.join("examples/kube-3-operator/Cargo.toml"))
        // As an operator's author builds: no wrapper of this repository, no flags of this
        // build.
        .env("RUSTC_WORKSPACE_WRAPPER", "")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env(
            "CARGO_TARGET_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("kube-3-operator"),
        )
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "examples/kube-3-operator does not compile:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
