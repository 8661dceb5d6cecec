//! The command line: flags, subcommands and logging set-up. The only module that knows
//! about the process (its arguments, exit status and signals).

pub mod flags;
pub mod logging;
pub mod run;
pub mod signals;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

use crate::demo::{self, DemoOptions, HangKind};
use flags::{Defaults, WatchdogArgs};

/// Truthful liveness and readiness probes for kube-rs operators.
#[derive(Parser, Debug)]
#[command(name = "reconcile-watchdog", version, about, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the watchdog, probes and logs on a synthetic workload, no cluster needed;
    /// one reconcile hangs after --hang-after
    Demo(DemoArgs),
    /// Run the reference operator (ConfigTemplates that own ConfigMaps) against a
    /// cluster: in-cluster config, or KUBECONFIG
    Run(run::RunArgs),
    /// Print the reference operator's CRD as YAML
    Crd,
}

/// `demo`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    #[command(flatten)]
    pub watchdog: WatchdogArgs,

    /// When the hanging reconcile starts
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_HANG_AFTER", value_name = "DURATION", default_value = "5s", value_parser = flags::duration)]
    pub hang_after: Duration,

    /// How it hangs: await (never woken), block (blocking lock in a poll), spin (busy loop), wedge (every runtime worker blocked), none
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_HANG_KIND", value_name = "KIND", value_enum, default_value_t = HangKind::Await)]
    pub hang_kind: HangKind,

    /// Release the hang after this long (default: never), to watch the recovery
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_HANG_FOR", value_name = "DURATION", value_parser = flags::positive_duration)]
    pub hang_for: Option<Duration>,

    /// Exit after this long (default: run until Ctrl-C)
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_DURATION", value_name = "DURATION", value_parser = flags::positive_duration)]
    pub duration: Option<Duration>,

    /// Objects per synthetic controller
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_OBJECTS", value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub objects: u32,
}

/// Parses the arguments (exit status 2 on bad input, from clap) and runs the command.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // Flags that parse alone but cannot work together: exit 2, as clap does.
    let checked = match &cli.command {
        Command::Demo(args) => args.watchdog.check(Defaults::DEMO),
        Command::Run(args) => args.watchdog.check(Defaults::RUN),
        Command::Crd => Ok(()),
    };
    if let Err(message) = checked {
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit();
    }
    match cli.command {
        Command::Demo(args) => {
            logging::init(args.watchdog.log_format);
            let options = DemoOptions {
                hang_after: args.hang_after,
                hang_kind: args.hang_kind,
                hang_for: args.hang_for,
                duration: args.duration,
                objects: args.objects,
            };
            let signals = match signals::listen() {
                Ok(signals) => signals,
                Err(error) => return report(Err(error)),
            };
            let wait = move || match args.duration {
                Some(d) => drop(signals.recv_timeout(d)),
                None => drop(signals.recv()),
            };
            report(demo::run(
                args.watchdog.builder(Defaults::DEMO),
                &options,
                wait,
            ))
        }
        Command::Run(args) => run::main(args),
        Command::Crd => run::crd(),
    }
}

/// Exit status 1 with the whole error chain on stderr.
fn report<E: std::error::Error + 'static>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", crate::kube::error_chain(&error));
            ExitCode::FAILURE
        }
    }
}
