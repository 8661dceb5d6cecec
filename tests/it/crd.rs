//! `manifests/crd.yaml` is exactly what `reconcile-watchdog crd` prints.

use std::path::Path;
use std::process::Command;

#[test]
fn manifests_crd_matches_the_crd_subcommand() {
    let output = Command::new(env!("CARGO_BIN_EXE_reconcile-watchdog"))
        .arg("crd")
        .output()
        .expect("cannot run the binary");
    assert!(
        output.status.success(),
        "crd failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).expect("the CRD is not UTF-8");
    assert!(
        printed.contains("kind: CustomResourceDefinition"),
        "{printed}"
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/crd.yaml");
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read manifests/crd.yaml: {e}"));
    assert!(
        committed == printed,
        "manifests/crd.yaml has drifted from the Rust types; regenerate it with \
         `cargo run -- crd > manifests/crd.yaml`"
    );
}
