//! The load program: detection latency, probe latency under load, registration during scans, memory and instruction counts, then the table of every figure beside its budget.
//!
//! `cargo bench --bench load` (or `bash benches/run.sh`, which runs the criterion
//! benches first so their figures join the table) takes the real measurements;
//! `cargo test --all-targets` runs the same code once at toy sizes and asserts only
//! that it works.

mod detection;
mod http;
mod insert_latency;
mod instructions;
mod mass;
mod memory;
mod overhead;
mod probe_load;
mod report;
mod rescue;
#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use support::{Shape, Variant};

/// Sizes of one run.
struct Plan {
    hangs: usize,
    deadline: Duration,
    interval: Duration,
    probe: probe_load::Plan,
    insert_in_flight: usize,
    insert_for: Duration,
    completed: usize,
    in_flight: usize,
    /// Reconciles per callgrind run; `None` leaves callgrind out (the quick test run).
    instruction_ops: Option<u64>,
    /// Rounds of alternating turns for the guard overhead, and reconciles per turn.
    overhead_rounds: usize,
    overhead_ops: u64,
}

impl Plan {
    fn full() -> Self {
        Self {
            hangs: 200,
            deadline: Duration::from_millis(20),
            interval: Duration::from_millis(10),
            probe: probe_load::Plan {
                requests_per_sec: 2_000,
                connections: 2,
                reconciles_per_sec: 10_000,
                turn: Duration::from_secs(5),
                turns: 3,
            },
            insert_in_flight: 100_000,
            insert_for: Duration::from_secs(3),
            completed: 1_000_000,
            in_flight: 100_000,
            instruction_ops: Some(50_000),
            overhead_rounds: 31,
            overhead_ops: 100_000,
        }
    }

    fn quick() -> Self {
        Self {
            hangs: 5,
            deadline: Duration::from_millis(20),
            interval: Duration::from_millis(10),
            probe: probe_load::Plan {
                requests_per_sec: 400,
                connections: 2,
                reconciles_per_sec: 1_000,
                turn: Duration::from_millis(250),
                turns: 1,
            },
            insert_in_flight: 1_000,
            insert_for: Duration::from_millis(100),
            completed: 10_000,
            in_flight: 10_000,
            instruction_ops: None,
            overhead_rounds: 1,
            overhead_ops: 1_000,
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if args.first().map(String::as_str) == Some("count") {
        instructions::count(&args[1..]);
        return;
    }
    if args.first().map(String::as_str) == Some("check-instructions") {
        // `check-instructions FILE`: instructions per reconcile against the recorded
        // figures (benches/guard-instructions.txt); fails past 10 % above one.
        let [file] = &args[1..] else {
            panic!("usage: check-instructions FILE");
        };
        std::process::exit(instructions::check(std::path::Path::new(file)));
    }
    if args.first().map(String::as_str) == Some("overhead") {
        // `overhead ROUNDS OPS`: the alternating-turns measurement alone, for profiling.
        let [rounds, ops] = &args[1..] else {
            panic!("usage: overhead ROUNDS OPS_PER_TURN");
        };
        let rounds = rounds.parse().expect("a round count");
        let ops = ops.parse().expect("an op count");
        for o in overhead::run(rounds, ops) {
            println!("{}", o.summary());
        }
        return;
    }
    if args.first().map(String::as_str) == Some("mass") {
        // `mass OVERDUE SECONDS`: reconciles overdue at once, scanned for SECONDS.
        let [overdue, seconds] = &args[1..] else {
            panic!("usage: mass OVERDUE SECONDS");
        };
        let overdue = overdue.parse().expect("a reconcile count");
        let seconds = seconds.parse().expect("a number of seconds");
        let mut mass = mass::run(
            overdue,
            Duration::from_millis(20),
            Duration::from_secs(seconds),
        );
        println!("{}", mass.summary());
        return;
    }
    if args.first().map(String::as_str) == Some("rescue") {
        // `rescue ROUNDS BLOCK_MS`: timers with one worker of four blocked, with and
        // without the watchdog's rescue, and the cost of its check.
        let [rounds, block] = &args[1..] else {
            panic!("usage: rescue ROUNDS BLOCK_MS");
        };
        let rounds = rounds.parse().expect("a round count");
        let block = Duration::from_millis(block.parse().expect("milliseconds"));
        println!(
            "{}",
            rescue::run(rounds, block, Duration::from_secs(10)).summary()
        );
        return;
    }
    let full = support::benchmarking();
    let plan = if full { Plan::full() } else { Plan::quick() };
    let load_before = report::load_average();

    // Memory first, while the heap is fresh.
    eprintln!(
        "memory: {} reconciles, {} in flight",
        plan.completed, plan.in_flight
    );
    let memory = memory::run(plan.completed, plan.in_flight);
    eprintln!(
        "guard overhead: {} rounds of alternating turns",
        plan.overhead_rounds
    );
    let overhead = overhead::run(plan.overhead_rounds, plan.overhead_ops);
    // Mass failure (its figures are in docs/performance.md's section of their own).
    let (overdue, scanned_for) = if full {
        (10_000, Duration::from_secs(5))
    } else {
        (200, Duration::from_millis(300))
    };
    eprintln!("mass failure: {overdue} overdue at once");
    eprintln!(
        "{}",
        mass::run(overdue, Duration::from_millis(20), scanned_for).summary()
    );
    // The runtime's sysmon (its figures are in docs/performance.md's section of their own).
    let (rounds, block, idle_for) = if full {
        (10, Duration::from_millis(1500), Duration::from_secs(10))
    } else {
        (1, Duration::from_millis(100), Duration::from_millis(200))
    };
    eprintln!("rescue: {rounds} rounds of one blocked worker");
    eprintln!("{}", rescue::run(rounds, block, idle_for).summary());
    let instructions = plan.instruction_ops.map(|n| {
        eprintln!(
            "instructions: callgrind, {n} and {} reconciles per run",
            2 * n
        );
        Shape::ALL
            .into_iter()
            .flat_map(|shape| Variant::ALL.into_iter().map(move |v| (v, shape)))
            .map(|(variant, shape)| {
                let per_op = instructions::per_op(variant, shape, n);
                ((variant, shape), per_op)
            })
            .collect()
    });
    let scan_instructions = plan.instruction_ops.map(|_| {
        eprintln!("instructions: callgrind, scans of 20000");
        (
            instructions::per_scanned_entry("scan", 20_000),
            instructions::per_scanned_entry("scan_floor", 20_000),
        )
    });
    eprintln!("insert latency: {} in flight", plan.insert_in_flight);
    let insert = insert_latency::run(plan.insert_in_flight, plan.insert_for);
    eprintln!("detection: {} hangs", plan.hangs);
    let detection = detection::run(plan.hangs, plan.deadline, plan.interval);
    eprintln!("probe latency under load");
    let probe = probe_load::run(&plan.probe);
    let load_after = report::load_average();

    let table = report::Figures {
        full,
        memory,
        overhead,
        instructions,
        scan_instructions,
        insert,
        detection,
        probe,
        probe_plan: plan.probe,
        load_before,
        load_after,
    }
    .render();
    println!("{table}");
}
