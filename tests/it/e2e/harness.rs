//! The end-to-end harness: the kmock emulator (or a real cluster), the operator binary,
//! its logs, and plain HTTP to its probes.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, CustomResourceExt};
use reconcile_watchdog_operator::operator::ConfigTemplate;
use reconcile_watchdog_operator::operator::crd::ConfigTemplateSpec;
use serde_json::Value;

use crate::support::{self, Process};

/// The Python that has kmock (`bash tests/support/venv.sh` prints the venv).
pub const PYTHON_VAR: &str = "RECONCILE_WATCHDOG_E2E_PYTHON";
/// A kubeconfig of a real cluster to run the tests against instead of the emulator.
pub const KUBECONFIG_VAR: &str = "RECONCILE_WATCHDOG_E2E_KUBECONFIG";

/// Bounds for "eventually": generous, since the machine may be busy.
pub const SETTLE: Duration = Duration::from_secs(60);

/// Polls `condition` every 100 ms until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("no free loopback port")
        .port()
}

fn scratch_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("e2e")
        .join(format!("{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("cannot create the test's scratch directory");
    dir
}

/// The kmock emulator, killed on drop.
pub struct Emulator {
    child: Child,
    pub url: String,
}

impl Emulator {
    /// Starts the emulator on `port` (0: any) and waits until it listens.
    pub fn start(port: u16) -> Self {
        let python = std::env::var_os(PYTHON_VAR).unwrap_or_else(|| {
            panic!(
                "{PYTHON_VAR} is not set: it must name a Python (>= 3.11) with kmock==0.8, e.g. \
                 {PYTHON_VAR}=\"$(bash tests/support/venv.sh)/bin/python\" (bash .ci/test sets it); \
                 or set {KUBECONFIG_VAR} to test against a real cluster"
            )
        });
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/emulator.py");
        let mut child = Command::new(&python)
            .arg(&script)
            .arg("--port")
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {python:?} {script:?}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(SETTLE).unwrap_or_default();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                let _ = child.kill();
                panic!("the emulator did not start (is kmock==0.8 installed for {python:?}?); it said {line:?}")
            })
            .to_owned();
        Self { child, url }
    }

    fn control(&self, command: &str, name: &str) {
        let addr = self.url.trim_start_matches("http://").parse().unwrap();
        let response = support::request(addr, "POST", &format!("/_emulator/{command}/{name}"))
            .expect("the emulator does not answer");
        assert_eq!(
            response.status, 200,
            "emulator {command} {name}: {}",
            response.body
        );
    }

    /// From now on, every request whose path names `name` goes unanswered.
    pub fn black_hole(&self, name: &str) {
        self.control("black-hole", name);
    }

    /// Answers the requests held for `name`, and those to come.
    pub fn release(&self, name: &str) {
        self.control("release", name);
    }

    /// From now on, every request with a path segment starting with `prefix` goes
    /// unanswered (many objects at once, cheaply).
    pub fn hold_prefix(&self, prefix: &str) {
        self.control("hold-prefix", prefix);
    }

    /// Answers the requests held for `prefix`, and those to come.
    pub fn release_prefix(&self, prefix: &str) {
        self.control("release-prefix", prefix);
    }

    /// Every watch, open or new, delivers nothing (no response head, no event, no
    /// bookmark), or (`false`) delivers again.
    pub fn hold_watches(&self, held: bool) {
        self.control(
            if held {
                "hold-watches"
            } else {
                "release-watches"
            },
            "all",
        );
    }

    /// How many writes (POST, PATCH) to events.k8s.io Events it has seen, held or not.
    pub fn event_writes(&self) -> u64 {
        let addr = self.url.trim_start_matches("http://").parse().unwrap();
        let response = support::request(addr, "GET", "/_emulator/event-writes")
            .expect("the emulator does not answer");
        assert_eq!(response.status, 200, "event-writes: {}", response.body);
        response.body.trim().parse().expect("a count")
    }

    /// The whole API server stops answering (discovery and `/version` included), or
    /// (`false`) answers everything it held.
    pub fn outage(&self, out: bool) {
        self.control("outage", if out { "start" } else { "end" });
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the objects live: the emulator, or a real cluster.
pub struct Cluster {
    pub runtime: tokio::runtime::Runtime,
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub namespace: String,
    pub emulator: Option<Emulator>,
    real: bool,
}

impl Cluster {
    /// The emulator on a free port, or the real cluster of `RECONCILE_WATCHDOG_E2E_KUBECONFIG`.
    pub fn start(test: &str) -> Self {
        match std::env::var_os(KUBECONFIG_VAR) {
            Some(path) => Self::real(test, PathBuf::from(path)),
            None => {
                let emulator = Emulator::start(0);
                let port = emulator.url.rsplit(':').next().unwrap().parse().unwrap();
                let mut cluster = Self::emulated(test, port);
                cluster.emulator = Some(emulator);
                cluster
            }
        }
    }

    /// A client for an emulator that will listen on `port` (it need not run yet).
    /// Fails, with a clear message, when pointed at a real cluster.
    pub fn emulated(test: &str, port: u16) -> Self {
        assert!(
            std::env::var_os(KUBECONFIG_VAR).is_none(),
            "{test} needs the emulator (it black-holes requests or starts the API server late); \
             against a real cluster run the tests with `-- --skip emulator_`"
        );
        let dir = scratch_dir(test);
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\n\
                 clusters:\n- name: kmock\n  cluster:\n    server: http://127.0.0.1:{port}\n\
                 users:\n- name: kmock\n  user: {{}}\n\
                 contexts:\n- name: kmock\n  context:\n    cluster: kmock\n    user: kmock\n\
                 current-context: kmock\n"
            ),
        )
        .expect("cannot write the kubeconfig");
        let (runtime, client) = connect(&kubeconfig);
        Self {
            runtime,
            client,
            kubeconfig,
            namespace: "e2e".into(),
            emulator: None,
            real: false,
        }
    }

    fn real(test: &str, kubeconfig: PathBuf) -> Self {
        let (runtime, client) = connect(&kubeconfig);
        let namespace = format!("rw-e2e-{}-{}", test.replace('_', "-"), std::process::id());
        runtime.block_on(async {
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            let crd = ConfigTemplate::crd();
            let name = crd.metadata.name.clone().unwrap();
            crds.patch(
                &name,
                &PatchParams::apply("reconcile-watchdog-e2e").force(),
                &Patch::Apply(&crd),
            )
            .await
            .expect("cannot apply the CRD");
            let namespaces: Api<Namespace> = Api::all(client.clone());
            let mut ns = Namespace::default();
            ns.metadata.name = Some(namespace.clone());
            namespaces
                .create(&PostParams::default(), &ns)
                .await
                .expect("cannot create the test namespace");
            // The CRD serves once it is established.
            let templates: Api<ConfigTemplate> = Api::namespaced(client.clone(), &namespace);
            let until = Instant::now() + SETTLE;
            while templates.list(&Default::default()).await.is_err() {
                assert!(Instant::now() < until, "the CRD never became established");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self {
            runtime,
            client,
            kubeconfig,
            namespace,
            emulator: None,
            real: true,
        }
    }

    pub fn emulator(&self) -> &Emulator {
        self.emulator
            .as_ref()
            .expect("this test needs the emulator")
    }

    pub fn templates(&self) -> Api<ConfigTemplate> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn configmaps(&self) -> Api<k8s_openapi::api::core::v1::ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates a ConfigTemplate `name` with one data key, and `fault` annotation if any.
    pub fn create(&self, name: &str, fault: Option<&str>) -> ConfigTemplate {
        let mut template = ConfigTemplate::new(
            name,
            ConfigTemplateSpec {
                data: [("name".to_owned(), name.to_owned())].into(),
            },
        );
        if let Some(fault) = fault {
            template.metadata.annotations = Some(
                [(
                    reconcile_watchdog_operator::operator::fault::ANNOTATION.to_owned(),
                    fault.to_owned(),
                )]
                .into(),
            );
        }
        self.runtime
            .block_on(self.templates().create(&PostParams::default(), &template))
            .unwrap_or_else(|e| panic!("cannot create ConfigTemplate {name}: {e}"))
    }

    /// Deletes the ConfigTemplate `name`, and waits until it is gone.
    pub fn delete(&self, name: &str) {
        self.runtime
            .block_on(self.templates().delete(name, &DeleteParams::default()))
            .unwrap_or_else(|e| panic!("cannot delete ConfigTemplate {name}: {e}"));
        let gone = eventually(SETTLE, || {
            self.runtime
                .block_on(self.templates().get_opt(name))
                .is_ok_and(|t| t.is_none())
        });
        assert!(gone, "ConfigTemplate {name} was not deleted");
    }

    /// The events.k8s.io Events in the namespace about the object `name`.
    pub fn events_about(&self, name: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.namespace);
        self.runtime
            .block_on(events.list(&Default::default()))
            .map(|list| list.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| {
                e.regarding
                    .as_ref()
                    .is_some_and(|r| r.name.as_deref() == Some(name))
            })
            .collect()
    }

    /// Whether `name` has its ConfigMap, owned by it, and a Ready status for its
    /// generation.
    pub fn reconciled(&self, name: &str) -> bool {
        self.runtime.block_on(async {
            let Ok(Some(template)) = self.templates().get_opt(name).await else {
                return false;
            };
            let Ok(Some(configmap)) = self.configmaps().get_opt(name).await else {
                return false;
            };
            let owned = configmap
                .metadata
                .owner_references
                .unwrap_or_default()
                .iter()
                .any(|o| {
                    o.controller == Some(true)
                        && o.kind == "ConfigTemplate"
                        && Some(&o.uid) == template.metadata.uid.as_ref()
                });
            let status = template.status.unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            owned
                && configmap.data.as_ref() == Some(&template.spec.data)
                && status.observed_generation == template.metadata.generation
                && ready
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.real {
            let namespaces: Api<Namespace> = Api::all(self.client.clone());
            let _ = self
                .runtime
                .block_on(namespaces.delete(&self.namespace, &DeleteParams::default()));
        }
    }
}

fn connect(kubeconfig: &Path) -> (tokio::runtime::Runtime, Client) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("cannot start the test's runtime");
    let client = runtime.block_on(async {
        let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("cannot read the kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("bad kubeconfig");
        Client::try_from(config).expect("cannot build a client")
    });
    (runtime, client)
}

/// The operator binary's `run`, killed on drop, its JSON logs collected (and shown
/// when the test fails).
pub struct Operator {
    process: Process,
    pub probes: SocketAddr,
    /// Where the debug views are served.
    pub debug: SocketAddr,
}

impl Operator {
    /// Runs `run` against `cluster`'s kubeconfig with reconcile `deadline`, a 250 ms
    /// watchdog interval and `extra` flags (no metrics server unless they ask for one).
    pub fn start(cluster: &Cluster, deadline: Duration, extra: &[&str]) -> Self {
        Self::start_with_env(cluster, deadline, extra, &[])
    }

    /// [`start`](Self::start) with `env` besides the kubeconfig.
    pub fn start_with_env(
        cluster: &Cluster,
        deadline: Duration,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let deadline = format!("{}ms", deadline.as_millis());
        let probes: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let probe_flag = probes.to_string();
        let mut args = vec!["run", "--health-probe-bind-address", &probe_flag];
        if !extra.contains(&"--metrics-bind-address") {
            args.extend(["--metrics-bind-address", "0"]);
        }
        args.extend(["--log-format", "json"]);
        let debug: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let debug_flag = debug.to_string();
        args.extend(["--debug-bind-address", &debug_flag]);
        args.extend([
            "--reconcile-deadline",
            &deadline,
            "--watchdog-interval",
            "250ms",
        ]);
        args.extend(["--namespace", &cluster.namespace]);
        args.extend(extra);
        let kubeconfig = cluster
            .kubeconfig
            .to_str()
            .expect("a UTF-8 kubeconfig path");
        let mut env = env.to_vec();
        env.push(("KUBECONFIG", kubeconfig));
        let mut operator = Self {
            process: Process::start_with_env(&args, &env),
            probes,
            debug,
        };
        let answered = eventually(SETTLE, || {
            operator.get("/healthz").is_some()
                || operator.process.child.try_wait().ok().flatten().is_some()
        });
        if let Ok(Some(status)) = operator.process.child.try_wait() {
            panic!("the operator exited at start with {status}");
        }
        assert!(answered, "the probe server never answered");
        operator
    }

    /// `GET path` on the probe server: status and body.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        support::request(self.probes, "GET", path)
            .ok()
            .map(|r| (r.status, r.body))
    }

    /// A GET on the debug address (`/debug/...`).
    pub fn get_debug(&self, path: &str) -> Option<(u16, String)> {
        support::request(self.debug, "GET", path)
            .ok()
            .map(|r| (r.status, r.body))
    }

    pub fn status(&self, path: &str) -> u16 {
        self.get(path).map_or(0, |(status, _)| status)
    }

    /// Whether a log event that `matches` accepts comes within `SETTLE`.
    pub fn eventually_logged(&self, matches: impl Fn(&Value) -> bool) -> bool {
        eventually(SETTLE, || !self.logged(&matches).is_empty())
    }

    /// The JSON log events so far that `matches` accepts.
    pub fn logged(&self, matches: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.process
            .events()
            .into_iter()
            .filter(|e| matches(e))
            .collect()
    }

    /// Whether any log line, JSON or not (a panic message is not), contains `text`.
    pub fn said(&self, text: &str) -> bool {
        self.process.logs().iter().any(|l| l.contains(text))
    }

    /// `/debug/reconciles` rows for `object`.
    pub fn in_flight(&self, object: &str) -> Vec<Value> {
        let Some((200, body)) = self.get_debug("/debug/reconciles") else {
            return Vec::new();
        };
        let rows: Vec<Value> = serde_json::from_str(&body).unwrap_or_default();
        rows.into_iter().filter(|r| r["object"] == object).collect()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.process.child.id().to_string()])
            .status()
            .expect("cannot run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.process.wait(timeout)
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for line in self.process.logs() {
                eprintln!("operator: {line}");
            }
        }
    }
}

/// Whether log `event` is at `level` with `message` containing `text`.
pub fn is(event: &Value, level: &str, text: &str) -> bool {
    event["level"] == level && event["message"].as_str().is_some_and(|m| m.contains(text))
}
