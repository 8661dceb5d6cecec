//! The release binary as it ships: compressed debug sections that the symbolizer still
//! reads, so a blocked reconcile's report names function, file and line, with paths
//! relative to the repository wherever it was built.
//!
//! It tests the binary that `RECONCILE_WATCHDOG_RELEASE_BIN` names: `.ci/test` builds it
//! once with `cargo build --release --locked` and runs this test explicitly (it is not
//! part of `cargo test --all-targets`, whose builds are debug builds).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
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

/// The ELF section headers of `elf` as (name, flags); 64-bit little-endian only.
fn sections(elf: &[u8]) -> Vec<(String, u64)> {
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
            (name, u64_at(header(i) + 8))
        })
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
        .filter(|(name, flags)| name.starts_with(".debug_") && flags & ALLOC == 0)
        .collect();
    assert!(
        debug.iter().any(|(name, _)| name == ".debug_line"),
        "no line tables: {debug:?}"
    );
    let plain: Vec<_> = debug
        .iter()
        .filter(|(_, flags)| flags & COMPRESSED == 0)
        .collect();
    assert!(plain.is_empty(), "uncompressed debug sections: {plain:?}");
}

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn a_block_hang_names_function_file_and_line_relative_to_the_repository() {
    let mut demo = Command::new(release_binary())
        .args(["demo", "--log-format=json", "--duration=5m"])
        .args([
            "--health-probe-bind-address=127.0.0.1:0",
            "--metrics-bind-address=0",
            // The tests run at once: none may take the default debug port.
            "--debug-bind-address=0",
        ])
        .args([
            "--hang-kind=block",
            "--hang-after=500ms",
            "--reconcile-deadline=1s",
        ])
        .args(["--watchdog-interval=100ms", "--stack-capture-after=500ms"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map(Killed)
        .expect("the release binary starts");
    let (events, received) = mpsc::channel();
    let logs = BufReader::new(demo.0.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in logs.lines().map_while(Result::ok) {
            if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) {
                let _ = events.send(event);
            }
        }
    });
    let field = |e: &serde_json::Value, key: &str| e[key].as_str().unwrap_or_default().to_owned();
    let start = Instant::now();
    let hung = loop {
        let left = PATIENCE.saturating_sub(start.elapsed());
        let event = received
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no block hang report within {PATIENCE:?}: {e}"));
        // Another reconcile queued behind the blocked worker may be reported (awaiting)
        // as well; this test is about the one blocked inside its poll.
        if field(&event, "message").starts_with("reconcile hung:")
            && field(&event, "object") == "demo/cert-7"
            && field(&event, "state") == "in-poll"
        {
            break event;
        }
    };
    let stack = field(&hung, "stack");
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
    // No frame carries the build machine's folders: the checkout is remapped away, the
    // toolchain's and the registry's folders are shortened by the report itself.
    let absolute: Vec<_> = stack
        .lines()
        .filter_map(|l| l.split_once(" at ").map(|(_, file)| file))
        .filter(|file| file.starts_with('/'))
        .collect();
    assert!(absolute.is_empty(), "absolute paths: {absolute:?}\n{stack}");
}

/// The resident memory of process `pid`, from `/proc/PID/status`.
#[cfg(target_os = "linux")]
fn resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line");
    kib * 1024
}

/// The budget of docs/performance.md: resident memory after any number of stack
/// captures within this much of the memory at rest.
const CAPTURE_MEMORY_BUDGET: u64 = 24 * 1024 * 1024;

#[test]
#[cfg(all(feature = "stack-capture", target_os = "linux"))]
fn resident_memory_after_a_hundred_captures_stays_near_rest() {
    // A block hang every 1.2 s, each a new stuck poll with a stack of its own (about
    // two minutes for a hundred).
    let mut demo = Command::new(release_binary())
        .args(["demo", "--log-format=json", "--duration=10m"])
        .args([
            "--health-probe-bind-address=127.0.0.1:0",
            "--metrics-bind-address=0",
            // The tests run at once: none may take the default debug port.
            "--debug-bind-address=0",
        ])
        .args([
            "--hang-kind=block",
            "--hang-after=600ms",
            "--hang-for=600ms",
            "--hang-times=1000",
            "--reconcile-deadline=300ms",
        ])
        .args(["--watchdog-interval=50ms", "--stack-capture-after=150ms"])
        // Each report of its own carries a stack: none may go to a summary.
        .args([
            "--hang-report-burst=1000",
            "--hang-reports-per-minute=60000",
        ])
        .env("RUST_LOG", "info,reconcile_watchdog::stack=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map(Killed)
        .expect("the release binary starts");
    let pid = demo.0.id();
    let (events, received) = mpsc::channel();
    let logs = BufReader::new(demo.0.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in logs.lines().map_while(Result::ok) {
            if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) {
                let _ = events.send(event);
            }
        }
    });
    // At rest: before the first hang.
    std::thread::sleep(Duration::from_millis(400));
    let rest = resident(pid);
    let mut captures = 0;
    let mut took_ms = Vec::new();
    let start = Instant::now();
    let patience = PATIENCE * 6;
    while captures < 100 {
        let left = patience.saturating_sub(start.elapsed());
        let event = received
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("{captures} captures within {patience:?}: {e}"));
        if event["message"] == "stack symbolized" {
            let us = event["took_us"].as_u64().unwrap_or_default();
            took_ms.push(us / 1000);
            captures += 1;
            if [1, 10, 100].contains(&captures) {
                // The scan releases the symbolizer's memory once its reports are written.
                std::thread::sleep(Duration::from_millis(300));
                let now = resident(pid);
                eprintln!(
                    "resident after capture {captures}: {} MiB (rest {} MiB); symbolization took {} ms",
                    now / (1024 * 1024),
                    rest / (1024 * 1024),
                    took_ms.last().unwrap()
                );
                assert!(
                    now <= rest + CAPTURE_MEMORY_BUDGET,
                    "resident {now} bytes after capture {captures}, rest {rest}: over the budget"
                );
            }
        }
    }
    took_ms.sort_unstable();
    eprintln!(
        "symbolization of one stack: median {} ms, max {} ms over {} captures",
        took_ms[took_ms.len() / 2],
        took_ms.last().unwrap(),
        took_ms.len()
    );
}
