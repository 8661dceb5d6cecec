//! The examples shown in README.md and docs/ against the current code: every block marked
//! `<!-- example: RUN KIND -->` must have the shape of what `demo --hang-kind RUN` writes
//! now. A log line must match an event of that run in level, target, message (numbers
//! and durations aside) and set of fields, and its stack frame for frame (function,
//! file and line); a probe body its checks and reasons; a `/debug/reconciles` row its
//! fields and their types; the demo's banner its lines. A `…` in an example stands for
//! what it leaves out.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;
use support::{Process, eventually, field, request};

/// How long any eventual outcome may take: generous, for a busy two-core machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// The pages whose examples are checked.
const PAGES: &[&str] = &[
    "README.md",
    "docs/design.md",
    "docs/diagnostics.md",
    "docs/embedding.md",
    "docs/end-to-end-tests.md",
    "docs/fire-drill.md",
    "docs/flags.md",
    "docs/install.md",
    "docs/older-kube.md",
    "docs/operations.md",
    "docs/performance.md",
    "docs/probes.md",
    "docs/runtime-rescue.md",
    "docs/stack-capture.md",
];

const RUNS: &[&str] = &["await", "block", "wedge"];
const KINDS: &[&str] = &["log", "probe", "stack", "debug-reconciles", "stdout"];

/// One marked block of a page.
struct Example {
    /// `page:line` of the marker.
    place: String,
    run: String,
    kind: String,
    lines: Vec<String>,
}

/// The marked blocks of `text`, their fences' indentation taken off.
fn examples_in(page: &str, text: &str) -> Vec<Example> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let Some(marker) = line
            .trim()
            .strip_prefix("<!-- example:")
            .and_then(|m| m.strip_suffix("-->"))
        else {
            continue;
        };
        let place = format!("{page}:{}", index + 1);
        let words: Vec<&str> = marker.split_whitespace().collect();
        let [run, kind] = words[..] else {
            panic!("{place}: a marker is `<!-- example: RUN KIND -->`, not {line:?}");
        };
        assert!(RUNS.contains(&run), "{place}: unknown run {run:?}");
        assert!(KINDS.contains(&kind), "{place}: unknown kind {kind:?}");
        let fence = lines.get(index + 1).copied().unwrap_or_default();
        let indent = fence.len() - fence.trim_start().len();
        assert!(
            fence.trim_start().starts_with("```"),
            "{place}: the marker must stand right above a fenced block"
        );
        let body: Vec<String> = lines[index + 2..]
            .iter()
            .take_while(|l| l.trim() != "```")
            .map(|l| l.get(indent..).unwrap_or(l.trim_start()).to_owned())
            .collect();
        found.push(Example {
            place,
            run: run.to_owned(),
            kind: kind.to_owned(),
            lines: body,
        });
    }
    found
}

fn all_examples() -> Vec<Example> {
    PAGES
        .iter()
        .flat_map(|page| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(page);
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
            examples_in(page, &text)
        })
        .collect()
}

// ---- shapes --------------------------------------------------------------------------

const UNITS: &[&str] = &["ms", "us", "µs", "ns", "s", "m", "h", "d"];

/// The end of a duration unit at `at`, if one is there and no letter or digit follows it.
fn unit_end(chars: &[char], at: usize) -> Option<usize> {
    UNITS.iter().find_map(|unit| {
        let unit: Vec<char> = unit.chars().collect();
        let end = at + unit.len();
        let follows = chars.get(end).is_some_and(|c| c.is_alphanumeric());
        (chars.get(at..end) == Some(&unit[..]) && !follows).then_some(end)
    })
}

/// The end of a number (digits and dots) at `at`.
fn number_end(chars: &[char], mut at: usize) -> usize {
    while chars
        .get(at)
        .is_some_and(|c| c.is_ascii_digit() || *c == '.')
    {
        at += 1;
    }
    at
}

/// `text` with every duration (`3s 493ms`) made `D` and every other number `N`.
fn normalize(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let mut end = number_end(&chars, i);
        let mut duration = false;
        while let Some(after_unit) = unit_end(&chars, end) {
            duration = true;
            end = after_unit;
            // `3s 493ms` is one duration: a space, then another number with a unit.
            let next = end + 1;
            let more = chars.get(end) == Some(&' ')
                && chars.get(next).is_some_and(char::is_ascii_digit)
                && unit_end(&chars, number_end(&chars, next)).is_some();
            if !more {
                break;
            }
            end = number_end(&chars, next);
        }
        out.push(if duration { 'D' } else { 'N' });
        i = end;
    }
    out
}

fn is_ellipsis(line: &str) -> bool {
    matches!(line.trim(), "…" | "...")
}

/// Whether the message of an example matches an actual one: the same clauses (`; `
/// apart), numbers and durations aside; an example clause with `…` matches any clause
/// that starts with what comes before it, and the example then need not list them all.
fn message_matches(example: &str, actual: &str) -> bool {
    let example = normalize(example.trim());
    let actual = normalize(actual.trim());
    let wanted: Vec<&str> = example.split("; ").collect();
    let have: Vec<&str> = actual.split("; ").collect();
    let elided = example.contains('…') || example.contains("...");
    if !elided {
        let (mut w, mut h) = (wanted.clone(), have.clone());
        w.sort_unstable();
        h.sort_unstable();
        return w == h;
    }
    wanted.iter().all(|clause| {
        let clause = clause.trim();
        match clause.find(['…']).or_else(|| clause.find("...")) {
            Some(cut) => {
                let prefix = clause[..cut].trim_end();
                prefix.is_empty() || have.iter().any(|h| h.starts_with(prefix))
            }
            None => have.contains(&clause),
        }
    })
}

/// A frame of a stack as shown: `N: FUNCTION at FILE:LINE`, without its number.
fn frames_and_notes(stack: &str) -> (Vec<String>, Vec<String>, bool) {
    let (mut frames, mut notes, mut elided) = (Vec::new(), Vec::new(), false);
    for line in stack.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if is_ellipsis(line) {
            elided = true;
            continue;
        }
        let numbered = line
            .split_once(": ")
            .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        match numbered {
            Some((_, frame)) => frames.push(frame.to_owned()),
            None => notes.push(normalize(line)),
        }
    }
    (frames, notes, elided)
}

/// Whether an example stack matches an actual one: the same frames (function, file and
/// line) in the same order, or, with a `…` line, a subsequence of them; and every other
/// line (what was left out, how it was unwound, a thread's heading) there too.
fn stack_mismatch(example: &str, actual: &str) -> Option<String> {
    let (want, notes, elided) = frames_and_notes(example);
    let (have, have_notes, _) = frames_and_notes(actual);
    let mut rest = have.iter();
    let in_order = want.iter().all(|w| rest.any(|h| h == w));
    let frames_ok = if elided { in_order } else { want == have };
    if !frames_ok {
        return Some(format!("frames differ; the current stack:\n{actual}"));
    }
    let missing: Vec<_> = notes.iter().filter(|n| !have_notes.contains(n)).collect();
    (!missing.is_empty())
        .then(|| format!("lines {missing:?} are not in the current stack:\n{actual}"))
}

/// A log record of an example: one text line (and the stack lines below it) or one JSON
/// object.
#[derive(Debug)]
struct Record {
    level: String,
    target: String,
    message: String,
    /// Each field and its value as shown.
    fields: BTreeMap<String, String>,
}

const LEVELS: &[&str] = &["ERROR", "WARN", "INFO", "DEBUG", "TRACE"];

/// `LEVEL target: REST` of a text line, after an optional timestamp.
fn text_head(line: &str) -> Option<(String, String, String)> {
    let mut rest = line.trim_start();
    if rest.starts_with(|c: char| c.is_ascii_digit()) {
        rest = rest.split_once(' ')?.1.trim_start();
    }
    let (level, rest) = rest.split_once(' ')?;
    if !LEVELS.contains(&level) {
        return None;
    }
    let (target, rest) = rest.split_once(": ")?;
    Some((level.to_owned(), target.to_owned(), rest.to_owned()))
}

/// The message and the fields of the rest of a text line: `MESSAGE k=v k="v" …`.
fn text_fields(rest: &str) -> Record {
    let bytes = rest.as_bytes();
    let mut starts = Vec::new();
    let mut quoted = false;
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'"' if i == 0 || bytes[i - 1] != b'\\' => quoted = !quoted,
            b' ' if !quoted => {
                let key: String = rest[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !key.is_empty() && rest[i + 1 + key.len()..].starts_with('=') {
                    starts.push((i, key));
                }
            }
            _ => {}
        }
    }
    let message = starts.first().map_or(rest, |(i, _)| &rest[..*i]).to_owned();
    let fields = starts
        .iter()
        .enumerate()
        .map(|(at, (i, key))| {
            let from = i + 1 + key.len() + 1;
            let to = starts.get(at + 1).map_or(rest.len(), |(next, _)| *next);
            let value = rest[from..to].trim_matches(' ');
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .map_or_else(|| value.to_owned(), |v| v.replace("\\\"", "\""));
            (key.clone(), value)
        })
        .collect();
    Record {
        level: String::new(),
        target: String::new(),
        message,
        fields,
    }
}

/// The records of a log example.
fn records(example: &Example) -> Vec<Record> {
    let mut records: Vec<Record> = Vec::new();
    let mut open: Option<(String, String, String)> = None;
    let close = |open: &mut Option<(String, String, String)>, records: &mut Vec<Record>| {
        if let Some((level, target, rest)) = open.take() {
            records.push(Record {
                level,
                target,
                ..text_fields(&rest)
            });
        }
    };
    for line in &example.lines {
        if line.trim().is_empty() || line.starts_with("$ ") {
            continue;
        }
        if line.trim_start().starts_with('{') {
            close(&mut open, &mut records);
            let event: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: not a JSON event: {e}", example.place));
            records.push(Record {
                level: field(&event, "level").to_owned(),
                target: field(&event, "target").to_owned(),
                message: field(&event, "message").to_owned(),
                fields: event_fields(&event),
            });
        } else if let Some(head) = text_head(line) {
            close(&mut open, &mut records);
            open = Some(head);
        } else {
            let (_, _, rest) = open.as_mut().unwrap_or_else(|| {
                panic!(
                    "{}: {line:?} is neither a log line nor under one",
                    example.place
                )
            });
            rest.push('\n');
            rest.push_str(line);
        }
    }
    close(&mut open, &mut records);
    records
}

/// The fields of a JSON event beside its timestamp, level, message and target, and
/// their values as text.
fn event_fields(event: &Value) -> BTreeMap<String, String> {
    event
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "timestamp" | "level" | "message" | "target"))
        .map(|(k, v)| {
            let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            (k.clone(), text)
        })
        .collect()
}

/// Fields whose value depends on the machine (the kernel's names, the cgroup's
/// throttling, the build), not on what the code says: their presence is checked, their
/// value is not; a stack is compared frame by frame.
const MACHINE_FIELDS: &[&str] = &["kernel_state", "throttled", "stack", "task_trace"];

/// Fields whose value the demo draws at random for that target: a near miss is of a
/// synthetic reconcile, one in twenty of which fails.
const RANDOM_FIELDS: &[(&str, &str)] = &[("reconcile_watchdog::near_miss", "outcome")];

/// What differs between the fields of an example and those of an event: a field only
/// in one, or a value other than the code's (numbers and durations aside; a value with
/// `…` in it is not compared).
fn field_problems(example: &BTreeMap<String, String>, event: &Value) -> Vec<String> {
    let actual = event_fields(event);
    let mut problems = Vec::new();
    let shown: BTreeSet<&String> = example.keys().collect();
    let have: BTreeSet<&String> = actual.keys().collect();
    if shown != have {
        problems.push(format!(
            "the example's fields {shown:?} are not the code's {have:?}"
        ));
    }
    for (key, value) in example {
        let Some(current) = actual.get(key) else {
            continue;
        };
        let random = RANDOM_FIELDS.contains(&(field(event, "target"), key.as_str()));
        let compared = !MACHINE_FIELDS.contains(&key.as_str()) && !random && !value.contains('…');
        if compared && normalize(value) != normalize(current) {
            problems.push(format!("{key}={value:?}, where the code wrote {current:?}"));
        }
    }
    if let (Some(stack), Some(current)) = (example.get("stack"), actual.get("stack")) {
        problems.extend(stack_mismatch(stack, current));
    }
    problems
}

// ---- the runs ------------------------------------------------------------------------

/// What one `demo` run wrote and answered.
#[derive(Default)]
struct Output {
    events: Vec<Value>,
    stdout: Vec<String>,
    /// `/healthz?verbose` while the hang fails it: (status, body).
    healthz: Option<(u16, String)>,
    debug_rows: Vec<Value>,
}

fn demo(args: &[&str]) -> Process {
    let mut all = vec![
        "demo",
        "--log-format=json",
        "--health-probe-bind-address=127.0.0.1:0",
        "--metrics-bind-address=127.0.0.1:0",
        "--watchdog-interval=100ms",
        "--runtime-stall-threshold=1s",
        "--hang-after=500ms",
        "--duration=2m",
    ];
    all.extend_from_slice(args);
    Process::start(&all)
}

fn wait_for(process: &Process, what: &str, matches: impl Fn(&Value) -> bool) {
    eventually(PATIENCE, what, || {
        process.events().iter().any(&matches).then_some(())
    });
}

fn message_starts(event: &Value, prefix: &str) -> bool {
    field(event, "message").starts_with(prefix)
}

/// `/healthz?verbose` once the check `failing` fails; with `alone`, once its reason
/// names that object and no other (a reconcile slowed by a busy machine may be overdue
/// for a moment too).
fn failing_healthz(addr: SocketAddr, failing: &str, alone: Option<&str>) -> (u16, String) {
    let prefix = format!("[-]{failing} failed: ");
    eventually(PATIENCE, &format!("/healthz to fail on {failing}"), || {
        let response = request(addr, "GET", "/healthz?verbose").ok()?;
        let reason = response
            .body
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))?;
        let only = alone.is_none_or(|object| reason.contains(object) && !reason.contains("; "));
        (response.status == 500 && only).then_some((response.status, response.body))
    })
}

fn output(process: &Process) -> Output {
    Output {
        events: process.events(),
        stdout: process.stdout.lock().unwrap().clone(),
        ..Output::default()
    }
}

/// `await`: the labelled await's report, its reminder and end, a near miss, and a
/// pause of the whole process.
fn await_run() -> Output {
    let process = demo(&[
        "--hang-kind=await",
        "--reconcile-deadline=2s",
        "--hang-for=4500ms",
        "--near-miss-every=25",
    ]);
    let addr = process.probe_address();
    wait_for(&process, "the await hang's report", |e| {
        message_starts(e, "reconcile hung: cert-renewer demo/cert-7")
    });
    let healthz = failing_healthz(addr, "reconcilers", Some("demo/cert-7"));
    wait_for(&process, "the end of the hang", |e| {
        message_starts(e, "reconcile ended after hang")
    });
    wait_for(&process, "a near miss", |e| {
        message_starts(e, "reconcile near miss")
    });
    let pid = Pid::from_child(&process.child);
    kill_process(pid, Signal::STOP).expect("SIGSTOP to the demo");
    std::thread::sleep(Duration::from_millis(2500));
    kill_process(pid, Signal::CONT).expect("SIGCONT to the demo");
    wait_for(&process, "the pause's WARN", |e| {
        message_starts(e, "the process was not scheduled")
    });
    Output {
        healthz: Some(healthz),
        ..output(&process)
    }
}

/// `block`: the in-poll report with its stack, its reminder and end, the rescue's WARN,
/// and the reconcile's `/debug/reconciles` row.
fn block_run() -> Output {
    let process = demo(&[
        "--hang-kind=block",
        "--reconcile-deadline=1s",
        // Long enough for the stack's capture (which loads the debug binary's symbols
        // first) to end before the hang does, on a loaded machine too.
        "--hang-for=5s",
        "--stack-capture-after=500ms",
    ]);
    let addr = process.probe_address();
    let debug = process.debug_address().expect("the debug views are on");
    wait_for(&process, "the block hang's report", |e| {
        message_starts(e, "reconcile hung: cert-renewer demo/cert-7")
    });
    let healthz = failing_healthz(addr, "reconcilers", Some("demo/cert-7"));
    let rows = request(debug, "GET", "/debug/reconciles?limit=5").expect("the debug views answer");
    let rows: Value = serde_json::from_str(&rows.body).expect("JSON rows");
    wait_for(&process, "the end of the hang", |e| {
        message_starts(e, "reconcile ended after hang")
    });
    Output {
        healthz: Some(healthz),
        debug_rows: rows.as_array().cloned().unwrap_or_default(),
        ..output(&process)
    }
}

/// `wedge`: the stall report with the threads' stacks, and its victims.
fn wedge_run() -> Output {
    let process = demo(&[
        "--hang-kind=wedge",
        "--reconcile-deadline=2s",
        "--stack-capture-after=500ms",
    ]);
    let addr = process.probe_address();
    let healthz = failing_healthz(addr, "runtime", None);
    wait_for(&process, "the stall's victims", |e| {
        message_starts(e, "async runtime stalled:") && field(e, "message").contains("victims")
    });
    Output {
        healthz: Some(healthz),
        ..output(&process)
    }
}

// ---- the checks ----------------------------------------------------------------------

fn check_log(example: &Example, run: &Output) -> Vec<String> {
    let mut problems = Vec::new();
    let records = records(example);
    if records.is_empty() {
        problems.push(format!("{}: no log line in the example", example.place));
    }
    for record in records {
        let alike: Vec<&Value> = run
            .events
            .iter()
            .filter(|e| field(e, "level") == record.level && field(e, "target") == record.target)
            .filter(|e| message_matches(&record.message, field(e, "message")))
            .collect();
        let best = alike
            .iter()
            .map(|e| field_problems(&record.fields, e))
            .min_by_key(Vec::len);
        match best {
            None => problems.push(format!(
                "{}: no {} {} event of the `{}` run says {:?}",
                example.place, record.level, record.target, example.run, record.message
            )),
            Some(found) => problems.extend(
                found
                    .into_iter()
                    .map(|p| format!("{}: {:?}: {p}", example.place, record.message)),
            ),
        }
    }
    problems
}

fn check_stack(example: &Example, run: &Output) -> Option<String> {
    let stack = example.lines.join("\n");
    let stacks: Vec<&str> = run
        .events
        .iter()
        .map(|e| field(e, "stack"))
        .filter(|s| !s.is_empty() && !s.starts_with("unavailable"))
        .collect();
    let reasons: Vec<String> = stacks
        .iter()
        .filter_map(|s| stack_mismatch(&stack, s))
        .collect();
    (reasons.len() == stacks.len()).then(|| {
        format!(
            "{}: no stack of the `{}` run matches: {}",
            example.place,
            example.run,
            reasons.first().map_or("none captured", String::as_str)
        )
    })
}

fn check_probe(example: &Example, run: &Output) -> Vec<String> {
    let Some((status, body)) = &run.healthz else {
        return vec![format!(
            "{}: the `{}` run read no probe",
            example.place, example.run
        )];
    };
    let mut problems = Vec::new();
    let mut shown = Vec::new();
    for line in example
        .lines
        .iter()
        .filter(|l| !l.starts_with("$ ") && !l.trim().is_empty())
    {
        if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
            if !rest.starts_with(&status.to_string()) {
                problems.push(format!("{}: status {line:?}, not {status}", example.place));
            }
        } else {
            shown.push(line.as_str());
        }
    }
    let actual: Vec<&str> = body.lines().collect();
    let check = |l: &str| {
        l.split_once(" failed: ")
            .map_or(l.to_owned(), |(c, _)| c.to_owned())
    };
    let names = |lines: &[&str]| lines.iter().map(|l| check(l)).collect::<Vec<_>>();
    if names(&shown) != names(&actual) {
        problems.push(format!(
            "{}: the checks differ from the current body:\n{body}",
            example.place
        ));
        return problems;
    }
    for (want, have) in shown.iter().zip(&actual) {
        if let (Some((_, w)), Some((_, h))) =
            (want.split_once(" failed: "), have.split_once(" failed: "))
            && !message_matches(w, h)
        {
            problems.push(format!(
                "{}: {want:?} is not the current {have:?}",
                example.place
            ));
        }
    }
    problems
}

/// The JSON type of a value, for comparing rows.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check_debug_rows(example: &Example, run: &Output) -> Vec<String> {
    let rows: Value = serde_json::from_str(&example.lines.join("\n"))
        .unwrap_or_else(|e| panic!("{}: not JSON: {e}", example.place));
    let mut problems = Vec::new();
    for row in rows.as_array().into_iter().flatten() {
        let shape = |r: &Value| -> BTreeMap<String, &'static str> {
            r.as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), json_type(v)))
                .collect()
        };
        let actual = run
            .debug_rows
            .iter()
            .find(|r| r["object"] == row["object"] && r["state"] == row["state"]);
        match actual {
            Some(actual) if shape(actual) == shape(row) => {}
            Some(actual) => problems.push(format!(
                "{}: the row's fields and types {:?} are not the code's {:?}",
                example.place,
                shape(row),
                shape(actual)
            )),
            None => problems.push(format!(
                "{}: no current row of {} in state {}: {:?}",
                example.place, row["object"], row["state"], run.debug_rows
            )),
        }
    }
    problems
}

fn check_stdout(example: &Example, run: &Output) -> Option<String> {
    let shown: BTreeSet<String> = example
        .lines
        .iter()
        .filter(|l| !l.starts_with("$ ") && !l.trim().is_empty() && !is_ellipsis(l))
        .map(|l| normalize(l))
        .collect();
    let actual: BTreeSet<String> = run.stdout.iter().map(|l| normalize(l)).collect();
    (shown != actual).then(|| {
        format!(
            "{}: the banner is not the current one:\n{}",
            example.place,
            run.stdout.join("\n")
        )
    })
}

#[test]
fn every_marked_example_has_the_shape_of_the_current_output() {
    let examples = all_examples();
    for kind in KINDS {
        assert!(
            examples.iter().any(|e| e.kind == *kind),
            "no example of kind {kind} is marked: the markers were lost"
        );
    }
    let (awaiting, blocking, wedged) = std::thread::scope(|s| {
        let a = s.spawn(await_run);
        let b = s.spawn(block_run);
        let w = s.spawn(wedge_run);
        (a.join().unwrap(), b.join().unwrap(), w.join().unwrap())
    });
    let mut problems = Vec::new();
    for example in &examples {
        let run = match example.run.as_str() {
            "await" => &awaiting,
            "block" => &blocking,
            _ => &wedged,
        };
        match example.kind.as_str() {
            "log" => problems.extend(check_log(example, run)),
            "stack" => problems.extend(check_stack(example, run)),
            "probe" => problems.extend(check_probe(example, run)),
            "debug-reconciles" => problems.extend(check_debug_rows(example, run)),
            _ => problems.extend(check_stdout(example, run)),
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} examples no longer match what the code writes (regenerate them with \
         `cargo run -- demo --hang-kind KIND`):\n\n{}",
        problems.len(),
        examples.len(),
        problems.join("\n\n")
    );
}

#[test]
fn normalizing_keeps_words_and_makes_numbers_and_durations_alike() {
    assert_eq!(
        normalize("has run 3s 493ms (2 deadlines), tid 9233, 85% of 5m"),
        "has run D (N deadlines), tid N, N% of D"
    );
    assert_eq!(normalize("demo/cert-7 after 20ms"), "demo/cert-N after D");
    assert!(message_matches(
        "reconcile hung: a demo/cert-7 has run 3s 1ms; stuck",
        "reconcile hung: a demo/cert-9 has run 1s; stuck"
    ));
    assert!(!message_matches(
        "reconcile hung: a demo/cert-7 has run 3s; stuck",
        "reconcile hung: a demo/cert-7 has run 3s; waiting"
    ));
    assert!(message_matches("stalled: …", "stalled: x; y; z"));
    assert!(!message_matches("stalled: x", "stalled: x; y"));
}
