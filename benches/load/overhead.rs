//! Guard overhead in alternating turns: each round runs a short burst of every variant, so a change in the machine's load hits all of them alike.

use std::collections::HashMap;

use crate::support::{Ops, Shape, Variant, run_on_threads};

/// The variants a verdict compares.
const COMPARED: [Variant; 3] = [Variant::Guarded, Variant::Floor, Variant::Timeout];

/// Nanoseconds per reconcile of each variant, one figure per round.
pub struct Overhead {
    /// Threads running at once.
    pub threads: usize,
    /// The no-op reconcile's shape.
    pub shape: Shape,
    /// Per variant, its time per reconcile in each round, in round order.
    pub rounds: HashMap<Variant, Vec<f64>>,
}

impl Overhead {
    /// Guarded over floor in each round, sorted.
    pub fn ratios_to_floor(&self) -> Vec<f64> {
        let mut ratios: Vec<f64> = self.rounds[&Variant::Guarded]
            .iter()
            .zip(&self.rounds[&Variant::Floor])
            .map(|(g, f)| g / f)
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios
    }

    /// One line: threads, shape, the median times and the median ratio.
    pub fn summary(&self) -> String {
        format!(
            "{} thread(s) {}: guarded {:.1} ns, floor {:.1} ns, timeout {:.1} ns; {:.2} x floor",
            self.threads,
            self.shape.name(),
            self.median(Variant::Guarded),
            self.median(Variant::Floor),
            self.median(Variant::Timeout),
            median(&self.ratios_to_floor())
        )
    }

    /// The median of a variant's rounds.
    pub fn median(&self, variant: Variant) -> f64 {
        let mut v = self.rounds[&variant].clone();
        v.sort_by(f64::total_cmp);
        median(&v)
    }
}

/// The middle of sorted `v`.
pub fn median(v: &[f64]) -> f64 {
    v[v.len() / 2]
}

/// For 1 and 2 threads and both shapes: `rounds` rounds, each running `ops_per_turn`
/// reconciles (per thread) of the guarded, floor and timeout variants in turn.
pub fn run(rounds: usize, ops_per_turn: u64) -> Vec<Overhead> {
    let ops = Ops::new();
    let mut all = Vec::new();
    for threads in [1, 2] {
        for shape in Shape::ALL {
            let mut seen: HashMap<Variant, Vec<f64>> = HashMap::new();
            for _ in 0..rounds {
                for variant in COMPARED {
                    let took = run_on_threads(&ops, threads, ops_per_turn, variant, shape);
                    #[allow(clippy::cast_precision_loss)]
                    let ns = took.as_nanos() as f64 / ops_per_turn as f64;
                    seen.entry(variant).or_default().push(ns);
                }
            }
            all.push(Overhead {
                threads,
                shape,
                rounds: seen,
            });
        }
    }
    assert!(ops.is_idle(), "every reconcile left its map");
    all
}
