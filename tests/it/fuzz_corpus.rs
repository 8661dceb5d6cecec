//! Replays every file of each fuzz target's corpus (`fuzz/corpus/TARGET/`, grown by
//! fuzzing) and seeds (`fuzz/seeds/TARGET/`, written by hand) through the same function
//! the cargo-fuzz target calls, on stable Rust: what fuzzing once found stays fixed.
//! `fuzz/run.sh` fuzzes (nightly) and grows the corpora.

#[path = "../../fuzz/src/lib.rs"]
mod bodies;

use std::path::PathBuf;

/// Feeds every file of `fuzz/corpus/{target}/` and `fuzz/seeds/{target}/` to `body`;
/// fails when either is missing or empty.
fn replay(target: &str, body: fn(&[u8])) {
    for kind in ["corpus", "seeds"] {
        replay_dir(target, kind, body);
    }
}

fn replay_dir(target: &str, kind: &str, body: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(kind)
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the {kind} of {target} is missing ({e})"));
    let mut replayed = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        let input = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Err(panic) = std::panic::catch_unwind(|| body(&input)) {
            std::panic::resume_unwind(Box::new(format!(
                "{target}: {kind} file {name} fails: {:?}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
            )));
        }
        replayed += 1;
    }
    assert!(replayed > 0, "the {kind} of {target} is empty");
}

#[test]
fn probe_request_corpus() {
    replay("probe_request", bodies::probe_request);
}

#[test]
fn flag_values_corpus() {
    replay("flag_values", bodies::flag_values);
}

#[test]
fn fault_annotation_corpus() {
    replay("fault_annotation", bodies::fault_annotation);
}
