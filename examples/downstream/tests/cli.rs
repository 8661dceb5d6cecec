//! The operator's command line carries the watchdog's flags: `--help` lists them, and a
//! malformed one exits 2 naming it, before any cluster is looked for.

#![cfg(feature = "watchdog")]

use std::process::{Command, Output};

fn operator(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_downstream-operator"));
    command.args(args);
    // clap shows a set variable's value in --help, and reads it as the flag.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RECONCILE_WATCHDOG_") {
            command.env_remove(name);
        }
    }
    command.output().expect("the operator runs")
}

#[test]
fn help_lists_the_watchdogs_flags_beside_the_operators_own() {
    let output = operator(&["--help"]);
    assert!(output.status.success(), "{output:?}");
    let help = String::from_utf8(output.stdout).expect("UTF-8");
    for flag in [
        "--namespace",
        "--reconcile-deadline <DURATION>",
        "--reconcile-deadline-for <NAME=DURATION>",
        "--watchdog-interval",
        "--on-hang",
        "--health-probe-bind-address",
        "--metrics-bind-address",
        "--api-server-check-interval",
        "RECONCILE_WATCHDOG_RECONCILE_DEADLINE_FOR",
        "[default: 5m]",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn a_malformed_deadline_exits_2_naming_its_flag() {
    for args in [
        &["--reconcile-deadline-for", "configmaps=soon"][..],
        &["--reconcile-deadline-for", "configmaps"][..],
        &["--reconcile-deadline", "0s"][..],
    ] {
        let output = operator(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(args[0]), "{args:?}: {stderr}");
    }
}

#[test]
fn flags_that_cannot_work_together_exit_2_naming_both() {
    let output = operator(&["--reconcile-deadline-for", "fast=1s"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--watchdog-interval 1s")
            && stderr.contains("--reconcile-deadline-for fast=1s"),
        "{stderr}"
    );
}
