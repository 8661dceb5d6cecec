//! The watchdog's reports as the tests read them: one global capture of the events of
//! the hang and runtime targets, shared by every test of the binary that installs it.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use reconcile_watchdog::internals::report;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// One report, as written.
#[derive(Clone, Debug)]
pub struct Report {
    pub target: &'static str,
    pub level: tracing::Level,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

impl Report {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    pub fn is(&self, level: tracing::Level, message_start: &str) -> bool {
        self.level == level && self.message.starts_with(message_start)
    }
}

static REPORTS: Mutex<Vec<Report>> = Mutex::new(Vec::new());

struct Capture;

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let target = event.metadata().target();
        let target = if target == report::TARGET {
            report::TARGET
        } else if target == report::RUNTIME_TARGET {
            report::RUNTIME_TARGET
        } else {
            return;
        };
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        REPORTS.lock().unwrap().push(Report {
            target,
            level: *event.metadata().level(),
            message,
            fields,
        });
    }
}

/// Installs the capture as the global subscriber, once per process (the monitor logs
/// from its own thread, so a thread-local default would not see it).
pub fn capture() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("the only global subscriber of this test binary");
    });
}

/// The reports captured so far that `matches` selects.
pub fn reports(matches: impl Fn(&Report) -> bool) -> Vec<Report> {
    REPORTS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| matches(r))
        .cloned()
        .collect()
}
