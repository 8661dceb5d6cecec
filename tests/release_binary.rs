//! The release binary as it ships: without debug sections, beside its GSYM symbol file
//! (`tools/ship-symbols.sh`, as the Dockerfile makes it), so that a blocked reconcile's
//! report names function, file and line, with paths relative to the repository wherever
//! it was built, at a peak memory near an awaiting hang's; and without its symbols,
//! a report of addresses and the build id.
//!
//! It tests the binary that `RECONCILE_WATCHDOG_RELEASE_BIN` names, and the example
//! operator that embeds the library (`examples/downstream`, built with the release
//! profile docs/diagnostics.md gives embedders and nothing else: the repository's
//! rustc wrapper leaves it alone; shipped the same way) that
//! `RECONCILE_WATCHDOG_DOWNSTREAM_BIN` names: `.ci/test` builds both once with `cargo
//! build --release --locked` and runs this test explicitly (it is not part of `cargo
//! test --all-targets`, whose builds are debug builds). The embedder's test runs against
//! the kmock emulator, as the end-to-end tests do (`RECONCILE_WATCHDOG_E2E_PYTHON`).

// The end-to-end harness, for its emulator: most of it is for other tests.
#[allow(dead_code)]
#[path = "it/e2e/harness.rs"]
mod harness;
mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// A child process, killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The path of the release binary under test.
fn release_binary() -> String {
    std::env::var("RECONCILE_WATCHDOG_RELEASE_BIN").unwrap_or_else(|_| {
        panic!(
            "RECONCILE_WATCHDOG_RELEASE_BIN is not set: build the binary with \
             `cargo build --release --locked --bin reconcile-watchdog` and name it there \
             (.ci/test does both)"
        )
    })
}

/// The path of the embedding example operator's release binary.
fn downstream_binary() -> String {
    std::env::var("RECONCILE_WATCHDOG_DOWNSTREAM_BIN").unwrap_or_else(|_| {
        panic!(
            "RECONCILE_WATCHDOG_DOWNSTREAM_BIN is not set: build the example operator with \
             `cargo build --release --locked -p downstream-operator` and name its binary \
             there (.ci/test does both)"
        )
    })
}

/// The shipped layout of `binary` in `out`, as `tools/ship-symbols.sh` makes it: the
/// binary without its debug sections, and `NAME.gsym` beside it.
fn ship(binary: &str, out: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(out);
    let status = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/ship-symbols.sh"))
        .arg(binary)
        .arg(&out)
        .status()
        .expect("bash runs");
    assert!(status.success(), "tools/ship-symbols.sh failed: {status}");
    out.join(Path::new(binary).file_name().expect("a file name"))
}

/// The shipped layout of the release binary, made once.
fn shipped_binary() -> &'static Path {
    static SHIPPED: OnceLock<PathBuf> = OnceLock::new();
    SHIPPED.get_or_init(|| ship(&release_binary(), "shipped"))
}

/// One ELF section header: name, flags, file offset and size.
struct Section {
    name: String,
    flags: u64,
    offset: usize,
    size: usize,
}

/// The ELF section headers of `elf`; 64-bit little-endian only.
fn sections(elf: &[u8]) -> Vec<Section> {
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap());
    let to_usize = |n: u64| usize::try_from(n).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(
        (elf[4], elf[5]),
        (2, 1),
        "not a 64-bit little-endian ELF file"
    );
    let (table, entry_size) = (to_usize(u64_at(0x28)), usize::from(u16_at(0x3a)));
    let (count, names_index) = (usize::from(u16_at(0x3c)), usize::from(u16_at(0x3e)));
    let header = |i: usize| table + i * entry_size;
    let names = to_usize(u64_at(header(names_index) + 0x18));
    (0..count)
        .map(|i| {
            let start = names + to_usize(u64::from(u32_at(header(i))));
            let len = elf[start..].iter().position(|&b| b == 0).unwrap();
            let name = String::from_utf8_lossy(&elf[start..start + len]).into_owned();
            Section {
                name,
                flags: u64_at(header(i) + 8),
                offset: to_usize(u64_at(header(i) + 0x18)),
                size: to_usize(u64_at(header(i) + 0x20)),
            }
        })
        .collect()
}

/// The GNU build id of `elf` in hex, from its `.note.gnu.build-id` note.
fn build_id(elf: &[u8]) -> String {
    let note = sections(elf)
        .into_iter()
        .find(|s| s.name == ".note.gnu.build-id")
        .expect("a build id note");
    let note = &elf[note.offset..note.offset + note.size];
    // namesz, descsz, type, then the name "GNU\0" and the id.
    let name_size = u32::from_le_bytes(note[0..4].try_into().unwrap()) as usize;
    let id_size = u32::from_le_bytes(note[4..8].try_into().unwrap()) as usize;
    let id_start = 12 + name_size.next_multiple_of(4);
    note[id_start..id_start + id_size]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
#[cfg(target_os = "linux")]
fn the_debug_sections_are_compressed() {
    /// `SHF_COMPRESSED`: the section holds a compression header, then zlib data.
    const COMPRESSED: u64 = 0x800;
    /// `SHF_ALLOC`: loaded at run time, like `.debug_gdb_scripts`; not debug info.
    const ALLOC: u64 = 0x2;
    let elf = std::fs::read(release_binary()).expect("the release binary is readable");
    let debug: Vec<_> = sections(&elf)
        .into_iter()
        .filter(|s| s.name.starts_with(".debug_") && s.flags & ALLOC == 0)
        .collect();
    let names: Vec<_> = debug.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&".debug_line"), "no line tables: {names:?}");
    let plain: Vec<_> = debug
        .iter()
        .filter(|s| s.flags & COMPRESSED == 0)
        .map(|s| s.name.as_str())
        .collect();
    assert!(plain.is_empty(), "uncompressed debug sections: {plain:?}");
}

/// The budgets of docs/performance.md for what ships: the binary, and the binary with its
/// symbol file.
const BINARY_BUDGET: u64 = 40_000_000;
const SHIPPED_BUDGET: u64 = 60_000_000;

#[test]
#[cfg(target_os = "linux")]
fn the_shipped_binary_and_its_symbol_file_fit_their_budgets() {
    let binary = shipped_binary();
    let size = |path: &Path| std::fs::metadata(path).expect("it was written").len();
    let (alone, symbols) = (size(binary), size(&binary.with_extension("gsym")));
    eprintln!("shipped: binary {alone} bytes, symbol file {symbols} bytes");
    assert!(alone <= BINARY_BUDGET, "binary {alone} bytes");
    assert!(
        alone + symbols <= SHIPPED_BUDGET,
        "{alone} + {symbols} bytes"
    );
    // What the symbol file is matched by: the binary keeps its build id.
    let elf = std::fs::read(binary).unwrap();
    assert_eq!(build_id(&elf).len(), 40, "a 20-byte build id");
}

/// `demo` of `binary` with one reconcile hanging as `kind` and these timings, its JSON
/// log events sent to the receiver.
fn demo(
    binary: &Path,
    kind: &str,
    timings: &[&str],
) -> (Killed, mpsc::Receiver<serde_json::Value>) {
    let mut demo = Command::new(binary)
        .args(["demo", "--log-format=json", "--duration=10m"])
        .args([
            "--health-probe-bind-address=127.0.0.1:0",
            "--metrics-bind-address=0",
            // The tests run at once: none may take the default debug port.
            "--debug-bind-address=0",
        ])
        .arg(format!("--hang-kind={kind}"))
        .args(timings)
        .env("RUST_LOG", "info,reconcile_watchdog::stack=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map(Killed)
        .expect("the release binary starts");
    let received = json_events(demo.0.stderr.take().unwrap());
    (demo, received)
}

/// The JSON objects among the lines of `logs`, read on a thread of their own.
fn json_events(logs: impl std::io::Read + Send + 'static) -> mpsc::Receiver<serde_json::Value> {
    let (events, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(logs).lines().map_while(Result::ok) {
            if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) {
                let _ = events.send(event);
            }
        }
    });
    received
}

/// One block hang, reported once with its stack.
const ONE_BLOCK_HANG: &[&str] = &[
    "--hang-after=500ms",
    "--reconcile-deadline=1s",
    "--watchdog-interval=100ms",
    "--stack-capture-after=500ms",
];

fn field(event: &serde_json::Value, key: &str) -> String {
    event[key].as_str().unwrap_or_default().to_owned()
}

/// The stack of the first report of `demo/cert-7` blocked inside its poll.
fn blocked_stack(received: &mpsc::Receiver<serde_json::Value>) -> String {
    let start = Instant::now();
    loop {
        let left = PATIENCE.saturating_sub(start.elapsed());
        let event = received
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no block hang report within {PATIENCE:?}: {e}"));
        // Another reconcile queued behind the blocked worker may be reported (awaiting)
        // as well; this is about the one blocked inside its poll.
        if field(&event, "message").starts_with("reconcile hung:")
            && field(&event, "object") == "demo/cert-7"
            && field(&event, "state") == "in-poll"
        {
            return field(&event, "stack");
        }
    }
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn a_block_hang_names_function_file_and_line_relative_to_the_repository() {
    let (_demo, received) = demo(shipped_binary(), "block", ONE_BLOCK_HANG);
    let stack = blocked_stack(&received);
    // A frame reads `N: function at file:line`; the blocking one is in src/demo.rs.
    let blocked = stack
        .lines()
        .find(|l| l.contains("take_config_lock"))
        .unwrap_or_else(|| panic!("no take_config_lock frame:\n{stack}"));
    let (_, location) = blocked
        .split_once(" at src/demo.rs:")
        .unwrap_or_else(|| panic!("not at a repository-relative src/demo.rs: {blocked}"));
    assert!(
        location.parse::<u32>().is_ok_and(|line| line > 0),
        "no line number: {blocked}"
    );
    // The lock it waits in was inlined into it: named, with the standard library's file.
    assert!(
        stack.contains("Mutex<T>::lock at rust/library/std/src/sync/poison/mutex.rs:"),
        "no inlined frame of the lock:\n{stack}"
    );
    assert!(!stack.contains("no symbol file"), "{stack}");
    // No frame carries the build machine's folders: the checkout is remapped away, the
    // toolchain's and the registry's folders are shortened by the report itself.
    let absolute: Vec<_> = stack
        .lines()
        .filter_map(|l| l.split_once(" at ").map(|(_, file)| file))
        .filter(|file| file.starts_with('/'))
        .collect();
    assert!(absolute.is_empty(), "absolute paths: {absolute:?}\n{stack}");
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn a_binary_without_symbols_reports_addresses_and_its_build_id() {
    // The shipped binary with its symbol table stripped too, and no symbol file beside.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("without-symbols");
    std::fs::create_dir_all(&dir).unwrap();
    let stripped = dir.join("reconcile-watchdog");
    let status = Command::new("strip")
        .arg(shipped_binary())
        .arg("-o")
        .arg(&stripped)
        .status()
        .expect("strip runs");
    assert!(status.success(), "strip failed: {status}");
    let id = build_id(&std::fs::read(&stripped).unwrap());
    let (mut demo, received) = demo(&stripped, "block", ONE_BLOCK_HANG);
    let stack = blocked_stack(&received);
    let note = stack
        .lines()
        .find(|l| l.contains("no symbol file for"))
        .unwrap_or_else(|| panic!("no note of the missing symbols:\n{stack}"));
    assert!(
        note.contains(&format!("(build id {id})")),
        "not build id {id}: {note}"
    );
    assert!(
        note.contains("addr2line -Cfipe"),
        "no offline command: {note}"
    );
    // Frames of the binary are addresses: every file-relative one the note lists.
    let listed = note
        .split_once("its frames are at ")
        .and_then(|(_, rest)| rest.split_once(':'))
        .map(|(addresses, _)| addresses.split(' ').collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(
        !listed.is_empty() && listed.iter().all(|a| a.starts_with("0x")),
        "{note}"
    );
    assert!(demo.0.try_wait().unwrap().is_none(), "the demo exited");
}

/// A figure of `/proc/PID/status` in bytes: `VmRSS:` (resident now) or `VmHWM:` (the
/// peak resident so far).
#[cfg(target_os = "linux")]
fn status_bytes(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("a {key} line"));
    kib * 1024
}

/// The budget of docs/performance.md: peak resident memory with any number of stack
/// captures within this much of the same run whose hangs capture none.
const CAPTURE_MEMORY_BUDGET: u64 = 24 * 1024 * 1024;

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn peak_memory_over_a_hundred_captures_stays_near_an_awaiting_hang() {
    // A hang every 1.2 s; each block hang a new stuck poll with a stack of its own
    // (about two minutes for a hundred). The awaiting run hangs the same, captures none.
    let timings = [
        "--hang-after=600ms",
        "--hang-for=600ms",
        "--hang-times=1000",
        "--reconcile-deadline=300ms",
        "--watchdog-interval=50ms",
        "--stack-capture-after=150ms",
        // Each report of its own carries a stack: none may go to a summary.
        "--hang-report-burst=1000",
        "--hang-reports-per-minute=60000",
    ];
    let (blocking, received) = demo(shipped_binary(), "block", &timings);
    let (awaiting, _) = demo(shipped_binary(), "await", &timings);
    let _ =
        peak_over_a_hundred_captures("reconcile-watchdog demo", &blocking, &received, &awaiting);
}

/// Reads the peak resident memory of `capturing`, whose JSON log events `received`
/// gets, and of `resting`, which runs the same hangs without capturing, at the 1st,
/// 10th and 100th stack captured; asserts the budget at each. Returns the stack of the
/// first report of a reconcile blocked in its poll.
fn peak_over_a_hundred_captures(
    label: &str,
    capturing: &Killed,
    received: &mpsc::Receiver<serde_json::Value>,
    resting: &Killed,
) -> String {
    let (capturing_pid, resting_pid) = (capturing.0.id(), resting.0.id());
    let mut captures = 0;
    let mut took_ms = Vec::new();
    let mut first_stack = None;
    let start = Instant::now();
    let patience = PATIENCE * 6;
    while captures < 100 {
        let left = patience.saturating_sub(start.elapsed());
        let event = received
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("{captures} captures within {patience:?}: {e}"));
        if first_stack.is_none()
            && field(&event, "message").starts_with("reconcile hung:")
            && field(&event, "state") == "in-poll"
        {
            first_stack = Some(field(&event, "stack"));
        }
        if event["message"] == "stack symbolized" {
            let us = event["took_us"].as_u64().unwrap_or_default();
            took_ms.push(us / 1000);
            captures += 1;
            if [1, 10, 100].contains(&captures) {
                // The peak so far includes this capture's; the resting run's is its
                // peak with as many hangs reported.
                let peak = status_bytes(capturing_pid, "VmHWM:");
                let resting_peak = status_bytes(resting_pid, "VmHWM:");
                let now = status_bytes(capturing_pid, "VmRSS:");
                eprintln!(
                    "{label}: after capture {captures}: peak {} KiB (the run without captures: \
                     peak {} KiB), resident {} KiB; symbolization took {} ms",
                    peak / 1024,
                    resting_peak / 1024,
                    now / 1024,
                    took_ms.last().unwrap()
                );
                assert!(
                    peak <= resting_peak + CAPTURE_MEMORY_BUDGET,
                    "peak {peak} bytes by capture {captures}, without captures \
                     {resting_peak}: over the budget"
                );
            }
        }
    }
    took_ms.sort_unstable();
    eprintln!(
        "{label}: symbolization of one stack: median {} ms, max {} ms over {} captures",
        took_ms[took_ms.len() / 2],
        took_ms.last().unwrap(),
        took_ms.len()
    );
    first_stack.expect("an in-poll hang report")
}

/// The example operator of `binary`, watching the cluster's namespace with these
/// watchdog flags; its JSON log events sent to the receiver.
fn downstream(
    binary: &Path,
    cluster: &harness::Cluster,
    flags: &[&str],
) -> (Killed, mpsc::Receiver<serde_json::Value>) {
    let mut operator = Command::new(binary)
        .arg(format!("--namespace={}", cluster.namespace))
        .args([
            "--log-format=json",
            "--health-probe-bind-address=127.0.0.1:0",
            "--metrics-bind-address=0",
            "--debug-bind-address=0",
        ])
        .args(flags)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("RUST_LOG", "info,reconcile_watchdog::stack=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Killed)
        .expect("the example operator starts");
    // tracing-subscriber's fmt writes to standard output; the rest goes to standard error.
    let received = json_events(operator.0.stdout.take().unwrap());
    let errors = BufReader::new(operator.0.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in errors.lines().map_while(Result::ok) {
            eprintln!("downstream-operator: {line}");
        }
    });
    (operator, received)
}

#[test]
#[cfg(target_os = "linux")]
fn an_embedding_operators_captures_stay_near_its_peak_without_them() {
    let shipped = {
        static SHIPPED: OnceLock<PathBuf> = OnceLock::new();
        SHIPPED.get_or_init(|| ship(&downstream_binary(), "shipped-downstream"))
    };
    let size = |path: &Path| std::fs::metadata(path).expect("it was written").len();
    eprintln!(
        "downstream-operator shipped: binary {} bytes, symbol file {} bytes",
        size(shipped),
        size(&shipped.with_extension("gsym"))
    );
    let cluster = harness::Cluster::start("embedder_capture_memory");
    // Its reconcile blocks its worker for 600 ms and comes back 600 ms later: a hang
    // every 1.2 s, each a new stuck poll (about two minutes for a hundred).
    let mut configmap = k8s_openapi::api::core::v1::ConfigMap::default();
    configmap.metadata.name = Some("times-out".into());
    configmap.metadata.annotations = Some(
        [(
            "downstream.example/block-for".to_owned(),
            "600ms".to_owned(),
        )]
        .into(),
    );
    cluster
        .runtime
        .block_on(
            cluster
                .configmaps()
                .create(&kube::api::PostParams::default(), &configmap),
        )
        .expect("the ConfigMap is created");
    let flags = |capture: &'static str| {
        [
            "--reconcile-deadline=300ms",
            "--watchdog-interval=50ms",
            capture,
            "--hang-report-burst=1000",
            "--hang-reports-per-minute=60000",
        ]
    };
    let (capturing, received) =
        downstream(shipped, &cluster, &flags("--stack-capture-after=150ms"));
    let (resting, _) = downstream(shipped, &cluster, &flags("--stack-capture-after=off"));
    let stack =
        peak_over_a_hundred_captures("downstream-operator", &capturing, &received, &resting);
    // The reports name the synchronous call with the example's file and line.
    let blocked = stack
        .lines()
        .find(|l| l.contains("call_synchronous_dependency"))
        .unwrap_or_else(|| panic!("no call_synchronous_dependency frame:\n{stack}"));
    // Built as an embedder builds (no repository wrapper, so no path remapping): the
    // file is the absolute path of the example's source.
    let at_the_example = |line: &str, function: &str| {
        line.split_once(&format!("{function} at /"))
            .and_then(|(_, file)| file.split_once("/examples/downstream/src/main.rs:"))
            .is_some_and(|(_, number)| number.parse::<u32>().is_ok_and(|n| n > 0))
    };
    assert!(
        at_the_example(blocked, "downstream_operator::call_synchronous_dependency"),
        "not named with the example's file and line: {blocked}"
    );
    // Its caller, the reconcile (an async fn's body, inlined into the guard's poll),
    // then the guard's poll: no frame between them that is off the chain.
    let lines: Vec<&str> = stack.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("call_synchronous_dependency"))
        .unwrap();
    assert!(
        lines
            .get(at + 1)
            .is_some_and(|l| at_the_example(l, "downstream_operator::reconcile::{{closure}}")),
        "no reconcile frame with its file and line after the blocking one:\n{stack}"
    );
    assert!(
        stack.contains("reconcile_watchdog::guard::guarded::Guarded<F>"),
        "the stack does not reach the guard's poll:\n{stack}"
    );
}
