//! `run`, the reference operator, and `crd`: the process around [`crate::operator`],
//! with graceful shutdown bounded by `--shutdown-grace`.

use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::flags::{Defaults, WatchdogArgs};
use super::logging;
use super::signals::{self, Signal};
use crate::guard::Registry;
use crate::kube::{Controllers, error_chain};
use crate::operator::{self, Context};

/// `run`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub watchdog: WatchdogArgs,

    /// Honour the watchdog.example.com/fault annotation (hang, block, panic, sleep=DURATION), to fire-drill the probes
    #[arg(long, env = "RECONCILE_WATCHDOG_ENABLE_FAULT_INJECTION")]
    pub enable_fault_injection: bool,

    /// Watch ConfigTemplates in this namespace only (default: every namespace)
    #[arg(long, env = "RECONCILE_WATCHDOG_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// Errors that stop the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime did not start.
    #[error("failed to start the operator's runtime")]
    Runtime(#[source] std::io::Error),
    /// The signal handlers did not install.
    #[error("failed to listen for signals")]
    Signals(#[source] std::io::Error),
    /// The watchdog did not start.
    #[error(transparent)]
    Watchdog(#[from] crate::watchdog::Error),
    /// No cluster configuration was found.
    #[error("failed to configure the Kubernetes client (in-cluster, or KUBECONFIG)")]
    Client(#[source] kube::Error),
    /// The CRD did not serialize.
    #[error("failed to write the CRD as YAML")]
    Crd(#[source] serde_saphyr::ser::Error),
}

/// What the main thread waits for.
enum Event {
    Signal(Signal),
    /// The operator ended on its own: drained after shutdown, or failed to start.
    Stopped(Result<(), Error>),
}

const WORKERS: usize = 4;

/// Runs the operator until a signal, then drains; the exit status says how that went.
pub fn main(args: RunArgs) -> ExitCode {
    logging::init(args.watchdog.log_format);
    match run(&args) {
        Ok(code) => code,
        Err(error) => {
            tracing::error!(error = %error_chain(&error), "the operator failed");
            ExitCode::FAILURE
        }
    }
}

/// `crd`: the CRD as YAML on stdout.
pub fn crd() -> ExitCode {
    match operator::crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {}", error_chain(&Error::Crd(error)));
            ExitCode::FAILURE
        }
    }
}

fn run(args: &RunArgs) -> Result<ExitCode, Error> {
    let (events, received) = mpsc::channel();
    forward_signals(signals::listen().map_err(Error::Signals)?, events.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name("operator-worker")
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    let watchdog = args
        .watchdog
        .builder(Defaults::RUN)
        .watch_runtime(runtime.handle().clone())
        .start()?;
    if let Some(addr) = watchdog.probe_address() {
        tracing::info!(%addr, "probe server listening");
    }
    if let Some(addr) = watchdog.debug_address() {
        tracing::info!(%addr, "debug server listening");
    }
    if args.enable_fault_injection {
        tracing::warn!(
            "fault injection is on: the {} annotation is honoured",
            operator::fault::ANNOTATION
        );
    }

    let shutdown = CancellationToken::new();
    let controllers = Controllers::new(&watchdog, shutdown.clone());
    let (fault_injection, namespace) = (args.enable_fault_injection, args.namespace.clone());
    runtime.spawn(async move {
        let started = async {
            let client = kube::Client::try_default().await.map_err(Error::Client)?;
            let ctx = Context {
                client,
                fault_injection,
            };
            operator::add_to(controllers, ctx, namespace.as_deref())
                .run()
                .await;
            Ok(())
        };
        let _ = events.send(Event::Stopped(started.await));
    });

    let code = supervise(
        &received,
        &watchdog,
        &shutdown,
        args.watchdog.shutdown_grace,
    );
    // Reconciles still hung must not hold the process.
    runtime.shutdown_background();
    code
}

fn forward_signals(signals: mpsc::Receiver<Signal>, events: mpsc::Sender<Event>) {
    // The thread ends with the process; nothing needs to join it.
    let _ = std::thread::Builder::new()
        .name("signal-forwarder".into())
        .spawn(move || {
            while let Ok(signal) = signals.recv() {
                if events.send(Event::Signal(signal)).is_err() {
                    return;
                }
            }
        });
}

/// Waits for the first signal, then drains for at most `grace`; a second signal, or
/// reconciles that outlive the grace, end it with a failure.
fn supervise(
    events: &mpsc::Receiver<Event>,
    watchdog: &crate::Watchdog,
    shutdown: &CancellationToken,
    grace: Duration,
) -> Result<ExitCode, Error> {
    let first = match events.recv() {
        Ok(Event::Signal(signal)) => signal,
        Ok(Event::Stopped(result)) => return result.map(|()| ExitCode::SUCCESS),
        Err(mpsc::RecvError) => return Ok(ExitCode::FAILURE),
    };
    watchdog.health().shutdown.begin();
    shutdown.cancel();
    tracing::info!(
        signal = ?first,
        in_flight = watchdog.registry().len(),
        grace = %humantime::format_duration(grace),
        "shutting down: not ready, taking no new work, draining reconciles in flight; a second signal exits at once"
    );
    match events.recv_timeout(grace) {
        Ok(Event::Stopped(result)) => {
            result?;
            tracing::info!("drained; exiting");
            Ok(ExitCode::SUCCESS)
        }
        Ok(Event::Signal(signal)) => {
            tracing::error!(
                ?signal,
                still_running = %still_running(watchdog.registry()),
                "second signal: exiting at once"
            );
            Ok(ExitCode::FAILURE)
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            tracing::error!(
                grace = %humantime::format_duration(grace),
                still_running = %still_running(watchdog.registry()),
                "reconciles still running after the shutdown grace; exiting"
            );
            Ok(ExitCode::FAILURE)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Ok(ExitCode::FAILURE),
    }
}

/// The reconciles in flight, as `controller object (elapsed)`.
fn still_running(registry: &Registry) -> String {
    let now = Instant::now();
    let running: Vec<String> = registry
        .snapshot()
        .iter()
        .map(|r| {
            format!(
                "{} {} ({})",
                r.controller,
                r.object,
                humantime::format_duration(Duration::from_secs(r.elapsed(now).as_secs()))
            )
        })
        .collect();
    if running.is_empty() {
        "none".into()
    } else {
        running.join(", ")
    }
}
