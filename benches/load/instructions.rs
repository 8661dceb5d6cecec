//! Instructions per reconcile for each variant, counted by callgrind: a ratio that does not depend on the machine's load.

use std::path::Path;
use std::process::Command;

use crate::support::{FloorScan, InFlightSet, Ops, Shape, Variant};

/// The `count VARIANT SHAPE N` subcommand, run under callgrind: `n` reconciles, nothing
/// else; or `count scan LEN N`: `n` monitor scans of `len` reconciles in flight (or
/// `scan_floor`: `n` passes that only check deadlines).
pub fn count(args: &[String]) {
    let [variant, shape, n] = args else {
        panic!("usage: count VARIANT SHAPE N | count scan|scan_floor LEN N");
    };
    if variant == "scan" || variant == "scan_floor" {
        let len = shape.parse().expect("a length");
        let scans = n.parse::<u64>().expect("a count");
        if variant == "scan" {
            let mut set = InFlightSet::new(len);
            for _ in 0..scans {
                set.scan();
            }
        } else {
            let floor = FloorScan::new(len);
            for _ in 0..scans {
                assert_eq!(floor.count_overdue(std::time::Instant::now()), 0);
            }
        }
        return;
    }
    let variant = Variant::named(variant).expect("a variant name");
    let shape = Shape::ALL
        .into_iter()
        .find(|s| s.name() == shape)
        .expect("a shape name");
    let n: u64 = n.parse().expect("a count");
    if variant == Variant::Guarded {
        // As `run` ships: its client's request layer makes every guard publish its
        // reconcile to the thread while it polls.
        let _layer = reconcile_watchdog::kube::requests::layer();
    }
    let ops = Ops::new();
    let _runtime = ops.enter();
    for _ in 0..n {
        ops.run(variant, shape);
    }
    assert!(ops.is_idle());
}

/// Instructions per reconcile: two callgrind runs of this program with `n` and `2n`
/// reconciles, so that start-up and shut-down cancel out.
pub fn per_op(variant: Variant, shape: Shape, n: u64) -> f64 {
    let once = total(variant, shape, n);
    let twice = total(variant, shape, 2 * n);
    #[allow(clippy::cast_precision_loss)]
    let per_op = twice.saturating_sub(once) as f64 / n as f64;
    per_op
}

/// Instructions per entry per scan, for `scan` (the monitor's) or `scan_floor`: runs
/// of one and of three scans of `len` entries, so that building them cancels out.
pub fn per_scanned_entry(kind: &str, len: usize) -> f64 {
    let len_arg = len.to_string();
    let once = callgrind(&["count", kind, &len_arg, "1"]);
    let thrice = callgrind(&["count", kind, &len_arg, "3"]);
    #[allow(clippy::cast_precision_loss)]
    let per_entry = thrice.saturating_sub(once) as f64 / (2 * len) as f64;
    per_entry
}

fn total(variant: Variant, shape: Shape, n: u64) -> u64 {
    callgrind(&["count", variant.name(), shape.name(), &n.to_string()])
}

/// Runs this program with `args` under callgrind; the instructions it executed.
fn callgrind(args: &[&str]) -> u64 {
    let exe = std::env::current_exe().expect("this program's path");
    let output = Command::new("valgrind")
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(exe)
        .args(args)
        .output()
        .expect("valgrind runs (apt-get install valgrind)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "callgrind run failed:\n{stderr}");
    stderr
        .lines()
        .find_map(|l| {
            l.split_once("Collected :")
                .map(|(_, n)| n.trim().to_owned())
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no instruction count in callgrind's output:\n{stderr}"))
}

/// How far above its recorded figure a count may rise before the check fails.
const TOLERANCE: f64 = 0.10;

/// The guard as `run` ships it may cost at most this many times the floor.
const BUDGET: f64 = 1.3;

/// Reconciles per callgrind run for the check (and twice that): enough that start-up
/// cancels out to well under one instruction per reconcile.
const CHECK_OPS: u64 = 20_000;

/// The `check-instructions FILE` subcommand: counts instructions per reconcile for each
/// `VARIANT SHAPE FIGURE` line of `file` and compares each with its figure. Prints a
/// line per count; returns the exit status (1 when one rose more than 10 % above its
/// figure, so that the guard's hot path cannot creep unnoticed). The shipped guard's
/// counts are also held to [`BUDGET`] times the floor's, counted beside them.
pub fn check(file: &Path) -> i32 {
    let recorded = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    let mut failed = 0;
    let mut checked = 0;
    for line in recorded.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let [variant, shape, figure] = line.split_whitespace().collect::<Vec<_>>()[..] else {
            panic!("{}: not `VARIANT SHAPE FIGURE`: {line}", file.display());
        };
        let variant = Variant::named(variant).unwrap_or_else(|| panic!("no variant {variant}"));
        let shape = Shape::ALL
            .into_iter()
            .find(|s| s.name() == shape)
            .unwrap_or_else(|| panic!("no shape {shape}"));
        let figure: f64 = figure.parse().expect("a figure");
        let counted = per_op(variant, shape, CHECK_OPS);
        let limit = figure * (1.0 + TOLERANCE);
        let verdict = if counted > limit { "ROSE" } else { "ok" };
        println!(
            "{:<20} {:<10} {counted:>7.0} instructions per reconcile (recorded {figure:.0}, limit {limit:.0}): {verdict}",
            variant.name(),
            shape.name()
        );
        failed += usize::from(counted > limit);
        checked += 1;
        if variant == Variant::Guarded {
            let floor = per_op(Variant::Floor, shape, CHECK_OPS);
            let budget = floor * BUDGET;
            let within = counted <= budget;
            println!(
                "{:<20} {:<10} {counted:>7.0} instructions per reconcile ({:.2} x the floor's {floor:.0}, budget {BUDGET} x): {}",
                variant.name(),
                shape.name(),
                counted / floor,
                if within { "ok" } else { "OVER BUDGET" }
            );
            failed += usize::from(!within);
            checked += 1;
        }
    }
    assert!(checked > 0, "{}: no figure to check", file.display());
    if failed > 0 {
        println!(
            "{failed} of {checked} counts rose more than {:.0} % above the figure recorded in {}: \
             find what the guard's hot path gained, or record the new figure in a commit that says why",
            TOLERANCE * 100.0,
            file.display()
        );
    }
    println!("{} passed, {failed} failed", checked - failed);
    i32::from(failed > 0)
}
