//! `run`, the reference operator, and `crd`: the process around [`crate::operator`],
//! with graceful shutdown bounded by `--shutdown-grace`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::error_chain;
use super::flags::{ProcessArgs, WatchdogArgs};
use super::logging;
use crate::operator::{self, Context};
use reconcile_watchdog::kube::events::HangEvents;
use reconcile_watchdog::kube::leader::{self, LeaderElection};
use reconcile_watchdog::kube::quarantine::ConfigMapStore;
use reconcile_watchdog::kube::restarts::PreviousRun;
use reconcile_watchdog::kube::watches::Watches;
use reconcile_watchdog::kube::{ApiServerCheck, Controllers, requests};
use reconcile_watchdog::quarantine::MemoryStore;
use reconcile_watchdog::shutdown::{Ending, Supervisor};

/// `run`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    #[allow(missing_docs)] // flattened: each flag has its own doc
    #[command(flatten)]
    pub watchdog: WatchdogArgs,

    #[allow(missing_docs)] // flattened: each flag has its own doc
    #[command(flatten)]
    pub process: ProcessArgs,

    /// Honour the watchdog.example.com/fault annotation (hang, block, panic, sleep=DURATION), to fire-drill the probes
    #[arg(long, env = "RECONCILE_WATCHDOG_ENABLE_FAULT_INJECTION")]
    pub enable_fault_injection: bool,

    /// Publish hang reports as Events on the hung objects (ReconcileHung, ReconcileHangEnded, ReconcileCancelled), within the hang report budget, and LivenessFailing on the operator's own Pod (POD_NAMESPACE, POD_NAME); false disables
    #[arg(long, env = "RECONCILE_WATCHDOG_HANG_EVENTS", value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub hang_events: bool,

    /// Watch ConfigTemplates in this namespace only (default: every namespace)
    #[arg(long, env = "RECONCILE_WATCHDOG_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    #[allow(missing_docs)] // flattened: each flag has its own doc
    #[command(flatten)]
    pub leader_election: LeaderElectArgs,
}

/// `run`'s leader-election flags, named like kube-controller-manager's.
#[derive(clap::Args, Debug, Clone)]
pub struct LeaderElectArgs {
    /// Run as one of several replicas: only the holder of a Lease reconciles, the others are ready and idle
    #[arg(long, env = "RECONCILE_WATCHDOG_LEADER_ELECT")]
    pub leader_elect: bool,

    /// How long followers wait, after the Lease last changed, before taking it over
    #[arg(long, env = "RECONCILE_WATCHDOG_LEADER_ELECT_LEASE_DURATION", value_name = "DURATION", default_value = "15s", value_parser = super::flags::positive_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it steps down; shorter than the lease duration
    #[arg(long, env = "RECONCILE_WATCHDOG_LEADER_ELECT_RENEW_DEADLINE", value_name = "DURATION", default_value = "10s", value_parser = super::flags::positive_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How often candidates try to take the lease and the leader renews it; shorter than the renew deadline
    #[arg(long, env = "RECONCILE_WATCHDOG_LEADER_ELECT_RETRY_PERIOD", value_name = "DURATION", default_value = "2s", value_parser = super::flags::positive_duration)]
    pub leader_elect_retry_period: Duration,

    /// The name of the Lease
    #[arg(
        long,
        env = "RECONCILE_WATCHDOG_LEADER_ELECT_RESOURCE_NAME",
        value_name = "NAME",
        default_value = "reconcile-watchdog"
    )]
    pub leader_elect_resource_name: String,

    /// The namespace of the Lease; unset, POD_NAMESPACE, else the service account's namespace (so required outside a cluster)
    #[arg(
        long,
        env = "RECONCILE_WATCHDOG_LEADER_ELECT_RESOURCE_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub leader_elect_resource_namespace: Option<String>,
}

/// Where a pod's service account names its namespace.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

impl LeaderElectArgs {
    /// The election these flags describe, None without `--leader-elect`; bad
    /// combinations are an error that names the flag.
    pub fn config(&self) -> Result<Option<leader::Config>, (&'static str, String)> {
        if !self.leader_elect {
            return Ok(None);
        }
        let namespace = self
            .leader_elect_resource_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .or_else(|| std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok())
            .map(|ns| ns.trim().to_owned())
            .filter(|ns| !ns.is_empty())
            .ok_or((
                "--leader-elect-resource-namespace <NAMESPACE>",
                "required with --leader-elect outside a cluster (no POD_NAMESPACE, no service account namespace)".to_owned(),
            ))?;
        if self.leader_elect_resource_name.trim().is_empty() {
            return Err((
                "--leader-elect-resource-name <NAME>",
                "must not be empty".into(),
            ));
        }
        let config = leader::Config::new(
            namespace,
            self.leader_elect_resource_name.trim(),
            leader::identity(),
        )
        .lease_duration(self.leader_elect_lease_duration)
        .renew_deadline(self.leader_elect_renew_deadline)
        .retry_period(self.leader_elect_retry_period);
        if self.leader_elect_renew_deadline >= self.leader_elect_lease_duration {
            return Err((
                "--leader-elect-renew-deadline <DURATION>",
                format!(
                    "must be shorter than --leader-elect-lease-duration ({})",
                    humantime::format_duration(self.leader_elect_lease_duration)
                ),
            ));
        }
        if self.leader_elect_retry_period >= self.leader_elect_renew_deadline {
            return Err((
                "--leader-elect-retry-period <DURATION>",
                format!(
                    "must be shorter than --leader-elect-renew-deadline ({})",
                    humantime::format_duration(self.leader_elect_renew_deadline)
                ),
            ));
        }
        config
            .validate()
            .map_err(|e| ("--leader-elect", e.to_string()))?;
        Ok(Some(config))
    }
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
    Watchdog(#[from] reconcile_watchdog::watchdog::Error),
    /// No cluster configuration was found.
    #[error("failed to configure the Kubernetes client (in-cluster, or KUBECONFIG)")]
    Client(#[source] kube::Error),
    /// The CRD did not serialize.
    #[error("failed to write the CRD as YAML")]
    Crd(#[source] serde_saphyr::ser::Error),
    /// Leader election failed to start, or this process lost the lease.
    #[error(transparent)]
    Leader(#[from] leader::Error),
}

/// How the controllers run: alone, or under leader election.
enum Mode {
    Alone(Controllers),
    Elected(LeaderElection),
}

const WORKERS: usize = 4;

/// Runs the operator until a signal, then drains; the exit status says how that went.
pub fn main(args: RunArgs) -> ExitCode {
    let election = args
        .leader_election
        .config()
        .unwrap_or_else(|(flag, message)| {
            super::command()
                .error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!("invalid value for '{flag}': {message}"),
                )
                .exit()
        });
    let _logs = logging::init(args.process.log_format);
    match run(&args, election) {
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

fn run(args: &RunArgs, election: Option<leader::Config>) -> Result<ExitCode, Error> {
    // SIGTERM and SIGINT, from now on, on a thread of their own.
    let supervisor = Supervisor::<Result<(), Error>>::listen().map_err(Error::Signals)?;
    let stopped = supervisor.stopped();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name("operator-worker")
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    // The kube integration plugs into the watchdog: the API server check, the
    // watches' ages and the hang Events.
    let api_server = args
        .watchdog
        .api_server_check_interval()
        .map(ApiServerCheck::every);
    let watches = Watches::new(args.watchdog.watch_stall_threshold());
    let hang_events = args.hang_events.then(|| {
        let events = HangEvents::new(HangEvents::instance_from_env());
        // LivenessFailing on the operator's own Pod, named by the downward API.
        events.own_pod_from_env();
        events
    });
    let mut builder = args
        .watchdog
        .builder()
        .watch_runtime(runtime.handle().clone())
        .watches(watches.clone());
    if let Some(api_server) = &api_server {
        builder = builder.api_server(api_server.clone());
    }
    if let Some(hang_events) = &hang_events {
        builder = builder.hang_reports(hang_events.clone());
    }
    let watchdog = builder.start()?;
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
    // Alone, the controllers (and their informer-sync readiness latch) exist from the
    // start; elected, they are made on taking the lease, so followers are ready.
    let mode = match election {
        None => Mode::Alone(Controllers::new(&watchdog, shutdown.clone())),
        Some(config) => Mode::Elected(LeaderElection::new(&watchdog, config)?),
    };
    let (registry, health) = (watchdog.registry().clone(), Arc::clone(watchdog.health()));
    let quarantine = watchdog.quarantine().cloned();
    let quarantine_configmap = args.watchdog.quarantine_configmap();
    let previous_run = PreviousRun::new(&watchdog);
    let (fault_injection, namespace) = (args.enable_fault_injection, args.namespace.clone());
    let (until, election_shutdown) = (shutdown.clone(), shutdown.clone());
    runtime.spawn(async move {
        let started = async {
            let config = kube::Config::infer()
                .await
                .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?;
            // Whether the API server answers at all: an outage fails readiness, not
            // liveness.
            if let Some(Err(error)) = api_server.map(|check| check.watch(config.clone())) {
                tracing::error!(error = %error_chain(&error), "the API server check did not start");
            }
            // Events from a thread, runtime and client of their own.
            if let Some(Err(error)) = hang_events.as_ref().map(|e| e.start(config.clone())) {
                tracing::error!(error = %error_chain(&error), "the hang Events did not start");
            }
            // The quarantine's ledger too, in its ConfigMap.
            if let Some(keeper) = &quarantine {
                let started = match quarantine_configmap {
                    Some((namespace, name)) => {
                        keeper.start(ConfigMapStore::new(config.clone(), &namespace, &name))
                    }
                    None => {
                        tracing::warn!("no namespace for the quarantine's ConfigMap (no --quarantine-namespace, POD_NAMESPACE or service account): liveness failures are remembered within this process only");
                        keeper.start(MemoryStore::default())
                    }
                };
                if let Err(error) = started {
                    tracing::error!(error = %error_chain(&error), "the quarantine did not start");
                }
            }
            // No read timeout (kube's default): the reference operator lets a request that
            // never returns hang, to show the watchdog catching it. An operator of your own
            // should set one; the watchdog is the backstop (docs/embedding.md).
            // The watches' signs of life are dated on the client's responses, and each
            // request a reconcile awaits is named in its hang report.
            let client = kube::client::ClientBuilder::try_from(config)
                .map_err(Error::Client)?
                .with_layer(&watches.layer())
                .with_layer(&requests::layer())
                .build();
            // Whether this container was restarted after liveness failed: a gauge the
            // ReconcileHangRestart alert reads, and a WARN.
            tokio::spawn(previous_run.read(client.clone()));
            let ctx = Context {
                client: client.clone(),
                fault_injection,
            };
            match mode {
                Mode::Alone(controllers) => {
                    operator::expect_watches(&watches);
                    let controllers = with_hang_events(controllers, hang_events);
                    operator::add_to(controllers, ctx, namespace.as_deref())
                        .run()
                        .await;
                }
                // The controllers start on taking the lease, and are dropped on losing it.
                Mode::Elected(election) => {
                    let lead = move |leadership| {
                        // A follower watches nothing; the leader's watches count from here.
                        operator::expect_watches(&watches);
                        let controllers = Controllers::with_parts(registry, &health, until)
                            .only_while(leadership);
                        let controllers = match quarantine.clone() {
                            Some(keeper) => controllers.quarantine(keeper),
                            None => controllers,
                        };
                        let controllers = with_hang_events(controllers, hang_events.clone());
                        operator::add_to(controllers, ctx, namespace.as_deref()).run()
                    };
                    election.run(client, election_shutdown, lead).await?;
                }
            }
            Ok(())
        };
        stopped.send(started.await);
    });

    let code = match supervisor.wait(&watchdog, &shutdown, args.process.shutdown_grace) {
        Ending::Stopped(result) | Ending::Drained { result, .. } => {
            result.map(|()| ExitCode::SUCCESS)
        }
        Ending::SecondSignal { .. } | Ending::GraceExpired { .. } => Ok(ExitCode::FAILURE),
    };
    // The watchdog first: as it goes, it writes the termination message if liveness
    // fails, from what the monitor found before the runtime's tasks are dropped.
    drop(watchdog);
    // Reconciles still hung must not hold the process.
    runtime.shutdown_background();
    code
}

/// `controllers`, publishing hang Events through `events` when they are on.
fn with_hang_events(controllers: Controllers, events: Option<Arc<HangEvents>>) -> Controllers {
    match events {
        Some(events) => controllers.hang_events(events),
        None => controllers,
    }
}
