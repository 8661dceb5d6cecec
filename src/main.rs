//! The `reconcile-watchdog` binary: see `reconcile-watchdog --help`.

fn main() -> std::process::ExitCode {
    reconcile_watchdog_operator::cli::main()
}
