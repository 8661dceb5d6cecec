//! The table of every figure beside its budget and its reference, with the machine it ran on.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use crate::detection::Detection;
use crate::http::quantile;
use crate::insert_latency::InsertLatency;
use crate::memory::Memory;
use crate::overhead::{Overhead, median};
use crate::probe_load::{Plan, ProbeLoad};
use crate::support::{Shape, Variant};

/// Everything measured in one run.
pub struct Figures {
    pub full: bool,
    pub memory: Memory,
    pub overhead: Vec<Overhead>,
    pub instructions: Option<HashMap<(Variant, Shape), f64>>,
    /// Instructions per entry per scan: the monitor's scan, and the deadline-only pass.
    pub scan_instructions: Option<(f64, f64)>,
    pub insert: InsertLatency,
    pub detection: Detection,
    pub probe: ProbeLoad,
    pub probe_plan: Plan,
    pub load_before: String,
    pub load_after: String,
}

/// One row: what, the figure, its budget, the reference beside it, and the verdict.
struct Row {
    measure: String,
    figure: String,
    budget: String,
    reference: String,
    /// "yes", "**no**", "—", or one verdict per budget when a row has two.
    met: String,
}

/// A verdict as the table shows it.
fn verdict(met: Option<bool>) -> String {
    match met {
        Some(true) => "yes".into(),
        Some(false) => "**no**".into(),
        None => "—".into(),
    }
}

/// The verdicts of a row with two budgets.
fn verdicts(first: (&str, bool), second: (&str, bool)) -> String {
    format!(
        "{}: {}; {}: {}",
        first.0,
        verdict(Some(first.1)),
        second.0,
        verdict(Some(second.1))
    )
}

impl Figures {
    /// The markdown: machine, load, then the table.
    pub fn render(mut self) -> String {
        let mut rows = Vec::new();
        self.overhead_rows(&mut rows);
        self.guard_rows(&mut rows);
        self.scan_rows(&mut rows);
        self.detection_row(&mut rows);
        self.probe_row(&mut rows);
        self.memory_rows(&mut rows);

        let mut out = String::new();
        let _ = writeln!(
            out,
            "Machine: {} cores, {}. Load average (1, 5, 15 min) before: {}; after: {}.{}\n",
            std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            cpu_model(),
            self.load_before,
            self.load_after,
            if self.full {
                ""
            } else {
                " QUICK RUN at toy sizes (cargo test): these figures measure nothing."
            }
        );
        out.push_str("| measure | figure | budget | reference | met |\n|---|---|---|---|---|\n");
        for row in rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                row.measure, row.figure, row.budget, row.reference, row.met
            );
        }
        out
    }

    fn overhead_rows(&self, rows: &mut Vec<Row>) {
        for o in &self.overhead {
            let ratios = o.ratios_to_floor();
            let (guarded, floor, timeout) = (
                o.median(Variant::Guarded),
                o.median(Variant::Floor),
                o.median(Variant::Timeout),
            );
            let ratio = median(&ratios);
            rows.push(Row {
                measure: format!(
                    "1. guard, {} thread{}, no-op `{}`: {} rounds of alternating turns",
                    o.threads,
                    if o.threads == 1 { "" } else { "s" },
                    o.shape.name(),
                    ratios.len()
                ),
                figure: format!(
                    "{guarded:.1} ns; per round {ratio:.2} × floor (median; from {:.2} to {:.2})",
                    ratios[0],
                    ratios[ratios.len() - 1]
                ),
                budget: "≤ 1.3 × floor; < timeout".into(),
                reference: format!("floor {floor:.1} ns; timeout {timeout:.1} ns"),
                met: verdicts(
                    ("≤ 1.3 × floor", ratio <= 1.3),
                    ("< timeout", guarded < timeout),
                ),
            });
        }
    }

    /// Criterion's figures (each variant measured on its own, so a change in the
    /// machine's load between two benches shows as a difference between them).
    fn guard_rows(&self, rows: &mut Vec<Row>) {
        for threads in [1, 2] {
            for shape in Shape::ALL {
                let time = |v: Variant| {
                    criterion_median(&format!(
                        "guard_{threads}_thread/{}/{}",
                        v.name(),
                        shape.name()
                    ))
                };
                let measure = format!(
                    "1. guard, {threads} thread{}, no-op `{}`: criterion",
                    if threads == 1 { "" } else { "s" },
                    shape.name()
                );
                let (Some(guarded), Some(floor), Some(unguarded), Some(timeout)) = (
                    time(Variant::Guarded),
                    time(Variant::Floor),
                    time(Variant::Unguarded),
                    time(Variant::Timeout),
                ) else {
                    rows.push(Row {
                        measure,
                        figure: "not measured: run `bash benches/run.sh`".into(),
                        budget: "≤ 1.3 × floor, < timeout".into(),
                        reference: String::new(),
                        met: verdict(None),
                    });
                    continue;
                };
                rows.push(Row {
                    measure,
                    figure: format!("{guarded:.1} ns ({:.2} × floor)", guarded / floor),
                    budget: format!("≤ {:.1} ns (1.3 × floor); < timeout", 1.3 * floor),
                    reference: format!(
                        "floor {floor:.1} ns; timeout {timeout:.1} ns; unguarded {unguarded:.1} ns"
                    ),
                    met: verdicts(
                        ("≤ 1.3 × floor", guarded <= 1.3 * floor),
                        ("< timeout", guarded < timeout),
                    ),
                });
            }
        }
        if let Some(ns) = criterion_median("reference/instant_now") {
            rows.push(Row {
                measure: "1. one `Instant::now()` (for scale)".into(),
                figure: format!("{ns:.1} ns"),
                budget: "—".into(),
                reference: String::new(),
                met: verdict(None),
            });
        }
        if let Some(counts) = &self.instructions {
            for shape in Shape::ALL {
                let n = |v: Variant| counts[&(v, shape)];
                let (guarded, floor) = (n(Variant::Guarded), n(Variant::Floor));
                rows.push(Row {
                    measure: format!("1. guard, instructions, no-op `{}`", shape.name()),
                    figure: format!("{guarded:.0} ({:.2} × floor)", guarded / floor),
                    budget: format!("≤ {:.0} (1.3 × floor); < timeout", 1.3 * floor),
                    reference: format!(
                        "floor {floor:.0}; timeout {:.0}; unguarded {:.0}",
                        n(Variant::Timeout),
                        n(Variant::Unguarded)
                    ),
                    met: verdicts(
                        ("≤ 1.3 × floor", guarded <= 1.3 * floor),
                        ("< timeout", guarded < n(Variant::Timeout)),
                    ),
                });
            }
        }
    }

    fn scan_rows(&mut self, rows: &mut Vec<Row>) {
        for len in [1_000, 10_000, 100_000] {
            let figure = criterion_median(&format!("scan/{len}"));
            rows.push(Row {
                measure: format!("2. scan, {len} in flight"),
                figure: figure.map_or("not measured: run `bash benches/run.sh`".into(), |ns| {
                    fmt(Duration::from_secs_f64(ns / 1e9))
                }),
                budget: if len == 100_000 {
                    "≤ 5 ms".into()
                } else {
                    "—".into()
                },
                reference: criterion_median(&format!("scan/floor/{len}")).map_or_else(
                    String::new,
                    |ns| {
                        format!(
                            "deadline check only, no copy: {}",
                            fmt(Duration::from_secs_f64(ns / 1e9))
                        )
                    },
                ),
                met: verdict(figure.filter(|_| len == 100_000).map(|ns| ns <= 5e6)),
            });
        }
        if let Some((scan, floor)) = self.scan_instructions {
            rows.push(Row {
                measure: "2. scan, instructions per entry".into(),
                figure: format!("{scan:.0}"),
                budget: "—".into(),
                reference: format!("deadline check only, no copy: {floor:.0}"),
                met: verdict(None),
            });
        }
        let insert = &self.insert;
        let describe = |r: &crate::insert_latency::Registrations| {
            let worst = |class: &[Duration]| {
                let over = class
                    .iter()
                    .filter(|d| **d >= Duration::from_millis(1))
                    .count();
                class.iter().max().map_or_else(
                    || format!("none of {}", class.len()),
                    |w| format!("worst {} of {} ({over} ≥ 1 ms)", fmt(*w), class.len()),
                )
            };
            let mut all = r.all();
            format!(
                "worst {}; p99.99 {}; p99.9 {} ({} registrations). Ran through: {}; parked on a lock: {}; preempted: {}",
                fmt(quantile(&mut all, 1.0)),
                fmt(quantile(&mut all, 0.9999)),
                fmt(quantile(&mut all, 0.999)),
                all.len(),
                worst(&r.ran_through),
                worst(&r.parked),
                worst(&r.preempted),
            )
        };
        let worst = insert.during_scans.all().into_iter().max();
        rows.push(Row {
            measure: format!(
                "2. registration while scanning {} in flight ({} scans back to back; the scanner preempted {} times)",
                insert.in_flight, insert.scans, insert.scanner_preempted
            ),
            figure: describe(&insert.during_scans),
            budget: "worst < 1 ms".into(),
            reference: format!("no scan: {}", describe(&insert.idle)),
            met: verdict(worst.map(|w| w < Duration::from_millis(1))),
        });
    }

    fn detection_row(&mut self, rows: &mut Vec<Row>) {
        let d = &mut self.detection;
        let p99 = quantile(&mut d.latencies, 0.99);
        let budget = d.interval + Duration::from_millis(5);
        rows.push(Row {
            measure: format!(
                "3. detection, {} hangs (deadline {}, interval {})",
                d.latencies.len(),
                fmt(d.deadline),
                fmt(d.interval)
            ),
            figure: format!(
                "p50 {}; p99 {}; max {}",
                fmt(quantile(&mut d.latencies, 0.5)),
                fmt(p99),
                fmt(*d.latencies.iter().max().expect("hangs"))
            ),
            budget: format!("p99 ≤ {} (interval + 5 ms)", fmt(budget)),
            reference: "a hang lands anywhere in a scan interval".into(),
            met: verdict(Some(p99 <= budget)),
        });
    }

    fn probe_row(&mut self, rows: &mut Vec<Row>) {
        let plan = &self.probe_plan;
        let p = &mut self.probe;
        let probe_p99 = quantile(&mut p.probe.latencies, 0.99);
        let bare_p99 = quantile(&mut p.bare.latencies, 0.99);
        rows.push(Row {
            measure: format!(
                "4. `/healthz` at {} req/s over {} connections, {:.0} guarded reconciles/s",
                plan.requests_per_sec, plan.connections, p.reconciles_per_sec
            ),
            figure: format!(
                "p50 {}; p99 {} ({} requests, {} not 200, {} sent late)",
                fmt(quantile(&mut p.probe.latencies, 0.5)),
                fmt(probe_p99),
                p.probe.latencies.len(),
                p.probe.not_ok,
                p.probe.late
            ),
            budget: format!(
                "p99 ≤ 1 ms and ≤ {} (1.2 × reference)",
                fmt(bare_p99 * 6 / 5)
            ),
            reference: format!(
                "server answering `ok`: p50 {}; p99 {} ({} requests, {} sent late)",
                fmt(quantile(&mut p.bare.latencies, 0.5)),
                fmt(bare_p99),
                p.bare.latencies.len(),
                p.bare.late
            ),
            met: verdicts(
                (
                    "≤ 1 ms",
                    p.probe.not_ok == 0 && probe_p99 <= Duration::from_millis(1),
                ),
                ("≤ 1.2 × reference", probe_p99 <= bare_p99 * 6 / 5),
            ),
        });
    }

    fn memory_rows(&self, rows: &mut Vec<Row>) {
        let m = &self.memory;
        rows.push(Row {
            measure: "5. bytes per in-flight guard".into(),
            figure: format!(
                "computed {} inline (`Guarded<F>` of a 1-byte F, in the task; the `Guard` in it is {}) + {} entry + {} map slot (+1 control byte, up to 8/7 spare) = {}; measured heap {:.0} per guard over {} in flight",
                m.guarded_inline,
                m.guard_inline,
                m.entry_heap,
                m.map_slot,
                m.guarded_inline + m.entry_heap + m.map_slot + 1,
                m.measured_heap_per_guard,
                m.in_flight
            ),
            budget: "—".into(),
            reference: format!("floor entry {} bytes", m.entry_heap),
            met: verdict(None),
        });
        let growth = m.rss_end.saturating_sub(m.rss_start);
        rows.push(Row {
            measure: format!(
                "5. resident growth over {} completed reconciles",
                m.completed
            ),
            figure: format!(
                "{} KiB ({} → {} KiB)",
                growth / 1024,
                m.rss_start / 1024,
                m.rss_end / 1024
            ),
            budget: "≤ 1024 KiB".into(),
            reference: "after a warm-up of 1% as many".into(),
            met: verdict(Some(growth <= 1 << 20)),
        });
    }
}

/// The median time criterion recorded for bench `id`, in nanoseconds.
fn criterion_median(id: &str) -> Option<f64> {
    let home = std::env::var_os("CRITERION_HOME").map_or_else(
        || {
            std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| PathBuf::from("target"), PathBuf::from)
                .join("criterion")
        },
        PathBuf::from,
    );
    let path = home.join(id).join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["median"]["point_estimate"].as_f64()
}

/// `/proc/loadavg`'s first three fields.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|_| "unknown".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn fmt(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}
