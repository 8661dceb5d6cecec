//! The command line: flags, subcommands and logging set-up. The only module that knows
//! about the process (its arguments, exit status and signals).

pub mod deadlines;
pub mod flags;
pub mod logging;
pub mod run;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::demo::{self, DemoOptions, HangKind};
use flags::{ProcessArgs, WatchdogArgs};

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
    /// Read a running operator's /debug/deadlines and print its figures and suggested
    /// deadlines per controller, with the flag lines to paste
    Deadlines(deadlines::DeadlinesArgs),
}

/// `demo`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    #[allow(missing_docs)] // flattened: each flag has its own doc
    #[command(flatten)]
    pub watchdog: WatchdogArgs,

    #[allow(missing_docs)] // flattened: each flag has its own doc
    #[command(flatten)]
    pub process: ProcessArgs,

    /// When the hanging reconcile starts
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_HANG_AFTER", value_name = "DURATION", default_value = "5s", value_parser = flags::duration)]
    pub hang_after: Duration,

    /// How it hangs: await (never woken), block (blocking lock in a poll), spin (busy loop), wedge (every runtime worker blocked), none
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_HANG_KIND", value_name = "KIND", value_enum, default_value_t = HangKind::Await)]
    pub hang_kind: HangKind,

    /// Release the hang after this long (default: never), to watch the recovery
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_HANG_FOR", value_name = "DURATION", value_parser = flags::positive_duration)]
    pub hang_for: Option<Duration>,

    /// With --hang-for: hang this many times, each --hang-after the previous release
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_HANG_TIMES", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub hang_times: u32,

    /// Exit after this long (default: run until Ctrl-C)
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_DURATION", value_name = "DURATION", value_parser = flags::positive_duration)]
    pub duration: Option<Duration>,

    /// Objects per synthetic controller
    #[arg(long, env = "RECONCILE_WATCHDOG_DEMO_OBJECTS", value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub objects: u32,

    /// Every Nth reconcile of deployment-scaler runs 85% of its deadline, a near miss (0: never)
    #[arg(
        long,
        env = "RECONCILE_WATCHDOG_DEMO_NEAR_MISS_EVERY",
        value_name = "N",
        default_value_t = 0
    )]
    pub near_miss_every: u32,
}

/// Parses the arguments (exit status 2 on bad input, from clap) and runs the command.
pub fn main() -> ExitCode {
    // Flags that do not parse, or cannot work together: exit 2, from clap.
    let cli = parse_from(std::env::args_os()).unwrap_or_else(|error| error.exit());
    match cli.command {
        Command::Demo(args) => {
            let _logs = logging::init(args.process.log_format);
            let options = DemoOptions {
                hang_after: args.hang_after,
                hang_kind: args.hang_kind,
                hang_for: args.hang_for,
                hang_times: args.hang_times,
                duration: args.duration,
                objects: args.objects,
                near_miss_every: args.near_miss_every,
            };
            let signals = match reconcile_watchdog::shutdown::listen() {
                Ok(signals) => signals,
                Err(error) => return report(Err(error)),
            };
            let wait = move || match args.duration {
                Some(d) => drop(signals.recv_timeout(d)),
                None => drop(signals.recv()),
            };
            report(demo::run(args.watchdog.builder(), &options, wait))
        }
        Command::Run(args) => run::main(args),
        Command::Crd => run::crd(),
        Command::Deadlines(args) => deadlines::main(&args),
    }
}

/// The command line: [`Cli`]'s, with `demo`'s own defaults for the watchdog's flags.
#[must_use]
pub fn command() -> clap::Command {
    Cli::command().mut_subcommand("demo", flags::with_demo_defaults)
}

/// Parses `args` as clap does, with [`command`]'s defaults, except that a value that is
/// not UTF-8 is refused naming its flag (clap names none).
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let parsed = command()
        .try_get_matches_from(&args)
        .and_then(|mut matches| {
            Cli::from_arg_matches_mut(&mut matches).map_err(|error| error.format(&mut command()))
        });
    parsed.map_err(|error| {
        if error.kind() != clap::error::ErrorKind::InvalidUtf8 {
            return error;
        }
        match flag_of_non_utf8_value(&args) {
            Some(flag) => clap::Error::raw(
                clap::error::ErrorKind::InvalidUtf8,
                format!("invalid UTF-8 in the value of '{flag}'\n"),
            )
            .with_cmd(&command()),
            None => error,
        }
    })
}

/// The flag whose value is the first argument that is not UTF-8: `--flag=VALUE`, or
/// `--flag VALUE`.
fn flag_of_non_utf8_value(args: &[std::ffi::OsString]) -> Option<String> {
    let at = args.iter().position(|a| a.to_str().is_none())?;
    let lossy = args[at].to_string_lossy();
    if let Some((flag, _)) = lossy.split_once('=').filter(|(f, _)| f.starts_with("--")) {
        return Some(flag.to_owned());
    }
    let previous = args.get(at.checked_sub(1)?)?.to_str()?;
    previous.starts_with("--").then(|| previous.to_owned())
}

/// Exit status 1 with the whole error chain on stderr.
/// An error and its sources, joined by `: `; a source whose text its error already
/// repeats (kube's errors do) is not repeated again.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

fn report<E: std::error::Error + 'static>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}
