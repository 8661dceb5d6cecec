//! Sets up the process's logs: text or JSON lines, level from `RUST_LOG`.

use tracing_subscriber::EnvFilter;

use super::flags::LogFormat;

/// What `RUST_LOG` defaults to. hyper's per-connection errors (a client that sent
/// garbage) are not the operator's problem, so warp's server logs are off.
const DEFAULT_FILTER: &str = "info,warp::server=off";

/// Installs the global subscriber. Logs go to stderr; stdout is for what a user asked
/// for (the probe URL of `demo`, the YAML of `crd`).
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
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
}
