//! Sets up the process's logs: text or JSON lines, level from `RUST_LOG`, written to
//! stderr by a thread of their own so that no thread waits for the log's reader.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use super::flags::LogFormat;

/// What `RUST_LOG` defaults to. hyper's per-connection errors (a client that sent
/// garbage) are not the operator's problem, so warp's server logs are off.
const DEFAULT_FILTER: &str = "info,warp::server=off";

/// The bytes of log lines that may wait for stderr. A full pipe (a slow or stuck log
/// collector) would otherwise block whichever thread logs, the watchdog's monitor
/// included: its hang report would stop its scans, and the `watchdog` check would
/// fail liveness for the logs' sake. Past this, lines are dropped and counted.
const BUFFERED_BYTES: usize = 4 * 1024 * 1024;

/// Installs the global subscriber. Logs go to stderr; stdout is for what a user asked
/// for (the probe URL of `demo`, the YAML of `crd`). Keep the returned guard until the
/// process exits: dropping it writes out the lines still waiting.
#[must_use = "dropping the guard stops the log writer"]
pub fn init(format: LogFormat) -> LogWriter {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let writer = LogWriter::start(format, std::io::stderr(), BUFFERED_BYTES);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer.lines())
        .with_ansi(ansi);
    // A second init (tests that run the CLI twice) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.with_target(true).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
    writer
}

/// The thread that writes log lines to stderr, and what the loggers share with it.
pub struct LogWriter {
    lines: Lines,
    thread: Option<JoinHandle<()>>,
}

/// The loggers' side: each formatted event is one line, queued without waiting.
#[derive(Clone)]
struct Lines {
    queue: Option<SyncSender<Vec<u8>>>,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// The most bytes that may be queued.
    budget: usize,
    /// Bytes queued and not yet written.
    queued: AtomicUsize,
    /// Lines dropped since the last count was logged.
    dropped: AtomicU64,
}

impl LogWriter {
    /// Starts the thread that writes to `sink` the lines queued, `budget` bytes at most.
    fn start(format: LogFormat, sink: impl Write + Send + 'static, budget: usize) -> Self {
        let shared = Arc::new(Shared {
            budget,
            ..Shared::default()
        });
        // The byte budget bounds the queue; the line count only sizes the channel.
        let (queue, queued) = sync_channel(16 * 1024);
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("log-writer".into())
                .spawn(move || write_lines(&queued, &shared, format, sink))
        };
        match thread {
            Ok(thread) => Self {
                lines: Lines {
                    queue: Some(queue),
                    shared,
                },
                thread: Some(thread),
            },
            // No thread, no queue: lines are written where they are logged.
            Err(_) => Self {
                lines: Lines {
                    queue: None,
                    shared,
                },
                thread: None,
            },
        }
    }

    fn lines(&self) -> Lines {
        self.lines.clone()
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        // The lines still queued are written before the process exits, unless stderr's
        // reader is stuck: then the process exits after a while without them.
        let until = Instant::now() + FLUSH_PATIENCE;
        // The subscriber keeps a sender of its own: an empty line, after what is
        // queued, tells the thread to finish.
        if let Some(queue) = self.lines.queue.take() {
            while let Err(TrySendError::Full(_)) = queue.try_send(Vec::new()) {
                if Instant::now() >= until {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if let Some(thread) = self.thread.take() {
            while !thread.is_finished() {
                if Instant::now() >= until {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = thread.join();
        }
    }
}

/// How long the process waits, as it exits, for its queued log lines to be written.
const FLUSH_PATIENCE: Duration = Duration::from_secs(2);

/// Writes queued lines until an empty one (the end); after a stretch of drops, a line
/// that counts them, written here: queued, it would be dropped as the others were.
fn write_lines(
    queued: &Receiver<Vec<u8>>,
    shared: &Shared,
    format: LogFormat,
    mut sink: impl Write,
) {
    while let Ok(line) = queued.recv() {
        if line.is_empty() {
            return;
        }
        shared.queued.fetch_sub(line.len(), Ordering::Relaxed);
        let _ = sink.write_all(&line);
        let dropped = shared.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = sink.write_all(dropped_line(format, dropped).as_bytes());
        }
    }
}

/// The line that counts `dropped` lines, in the format of the others.
fn dropped_line(format: LogFormat, dropped: u64) -> String {
    const TARGET: &str = "reconcile_watchdog_operator::logs";
    let timestamp = humantime::format_rfc3339_micros(std::time::SystemTime::now());
    let message = format!(
        "{dropped} log lines were dropped: stderr's reader did not keep up, and no thread waits for it"
    );
    match format {
        LogFormat::Text => format!("{timestamp}  WARN {TARGET}: {message} dropped={dropped}\n"),
        LogFormat::Json => {
            let line = serde_json::json!({
                "timestamp": timestamp.to_string(),
                "level": "WARN",
                "message": message,
                "dropped": dropped,
                "target": TARGET,
            });
            format!("{line}\n")
        }
    }
}

impl Lines {
    fn send(&self, line: &[u8]) {
        let Some(queue) = &self.queue else {
            let _ = std::io::stderr().write_all(line);
            return;
        };
        let shared = &self.shared;
        if shared.queued.fetch_add(line.len(), Ordering::Relaxed) + line.len() > shared.budget {
            shared.queued.fetch_sub(line.len(), Ordering::Relaxed);
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match queue.try_send(line.to_vec()) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                shared.queued.fetch_sub(line.len(), Ordering::Relaxed);
                shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One event's writer: tracing-subscriber formats an event, then writes it whole.
pub struct LineWriter<'a>(&'a Lines);

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !buf.is_empty() {
            self.0.send(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A sink that waits for `gate` before each write, as a full pipe would, and keeps
    /// what it was given.
    struct GatedSink {
        gate: Arc<Mutex<()>>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for GatedSink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            drop(self.gate.lock().unwrap());
            self.written.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_reader_blocks_no_logger_and_the_dropped_lines_are_counted() {
        let gate = Arc::new(Mutex::new(()));
        let written = Arc::new(Mutex::new(Vec::new()));
        let sink = GatedSink {
            gate: Arc::clone(&gate),
            written: Arc::clone(&written),
        };
        let held = gate.lock().unwrap();
        let writer = LogWriter::start(LogFormat::Json, sink, 1000);
        let lines = writer.lines();
        // 100 lines of 100 bytes while the reader is stuck: the logger never waits.
        let line = [b"x".repeat(99), b"\n".to_vec()].concat();
        let logger = std::thread::spawn(move || {
            for _ in 0..100 {
                lines.make_writer().write_all(&line).unwrap();
            }
        });
        let started = Instant::now();
        while !logger.is_finished() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "a logger waits for the stuck reader"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
        drop(writer); // writes out what is queued
        let written = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        let kept = written.lines().filter(|l| l.starts_with('x')).count();
        // At most the budget's worth queued, plus the one the writer had taken.
        assert!((1..=11).contains(&kept), "{kept} lines kept:\n{written}");
        let count: serde_json::Value = written
            .lines()
            .find(|l| l.contains("log lines were dropped"))
            .map(|l| serde_json::from_str(l).unwrap())
            .unwrap_or_else(|| panic!("no count of the dropped lines:\n{written}"));
        assert_eq!(count["level"], "WARN");
        assert_eq!(
            count["dropped"].as_u64(),
            Some(100 - kept as u64),
            "{written}"
        );
    }

    #[test]
    fn the_count_of_dropped_lines_reads_as_the_others_do() {
        let text = dropped_line(LogFormat::Text, 7);
        assert!(text.ends_with(" dropped=7\n"), "{text}");
        assert!(
            text.contains("  WARN reconcile_watchdog_operator::logs: 7 log lines were dropped"),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&dropped_line(LogFormat::Json, 7)).unwrap();
        assert_eq!(json["dropped"], 7);
        assert_eq!(json["target"], "reconcile_watchdog_operator::logs");
    }
}
