//! Flags that parse alone but cannot work together exit 2, naming both.

use crate::support;

use std::process::Command;

use support::BIN;

fn demo(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .arg("demo")
        .args(args)
        .args(["--duration=1s", "--health-probe-bind-address=127.0.0.1:0"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn conflicting_flags_exit_2_naming_both() {
    let cases: [(&[&str], [&str; 2]); 3] = [
        (
            &["--runtime-stall-threshold=100ms"],
            ["--runtime-stall-threshold", "--watchdog-interval"],
        ),
        (&["--watchdog-interval=1ns"], ["--watchdog-interval", "1ns"]),
        (
            &["--watchdog-interval=2s", "--reconcile-deadline=3s"],
            ["--watchdog-interval", "--reconcile-deadline 3s"],
        ),
    ];
    for (args, named) in cases {
        let (code, stderr) = demo(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        for name in named {
            assert!(
                stderr.contains(name),
                "{args:?} does not name {name}: {stderr}"
            );
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
