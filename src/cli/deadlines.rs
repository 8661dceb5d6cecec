//! `reconcile-watchdog deadlines --from URL`: reads a running operator's
//! `/debug/deadlines` and prints a table a person can read, and the flag lines to paste.
//!
//! The debug address is plain HTTP on loopback (reached with `kubectl port-forward`), so
//! one HTTP/1.1 GET over a std `TcpStream` is all the client this needs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use http::Uri;

use super::flags;
use reconcile_watchdog::internals::deadlines::Report;

/// Errors of `deadlines`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host name did not resolve.
    #[error("cannot resolve {host}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No connection could be made.
    #[error(
        "cannot connect to {url}; is the operator running with a --debug-bind-address, and `kubectl port-forward` running to it?"
    )]
    Connect {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The request or the answer broke off, or timed out.
    #[error("no complete answer from {url}")]
    Exchange {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The answer is not HTTP.
    #[error("the answer from {url} is not an HTTP response")]
    NotHttp {
        /// The URL.
        url: String,
    },
    /// The server answered with another status than 200.
    #[error("{url} answered {status}: {body}")]
    Status {
        /// The URL.
        url: String,
        /// The status line's code and reason.
        status: String,
        /// The start of the body.
        body: String,
    },
    /// The body is not the JSON of `/debug/deadlines`.
    #[error("the answer from {url} is not the JSON of /debug/deadlines (it begins {start:?})")]
    NotJson {
        /// The URL.
        url: String,
        /// The start of the body.
        start: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// `deadlines`'s flags.
#[derive(clap::Args, Debug, Clone)]
#[command(next_line_help = true)]
pub struct DeadlinesArgs {
    /// The operator's debug address, e.g. http://127.0.0.1:8082 after `kubectl port-forward deploy/NAME 8082`, or the full /debug/deadlines URL
    #[arg(long, env = "RECONCILE_WATCHDOG_DEADLINES_FROM", value_name = "URL", value_parser = target)]
    pub from: Target,

    /// How long to wait for the connection, and then for the answer
    #[arg(long, env = "RECONCILE_WATCHDOG_DEADLINES_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = flags::positive_duration)]
    pub timeout: Duration,
}

/// Where to read the view: a plain HTTP URL taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as it will be shown in messages.
    pub url: String,
    /// The host, without brackets for IPv6.
    pub host: String,
    /// The port (80 when the URL has none).
    pub port: u16,
    /// Path and query; `/debug/deadlines` when the URL has no path.
    pub path: String,
}

/// The view's path, used when the URL gives none.
pub const PATH: &str = "/debug/deadlines";

/// The largest answer read (the view grows with controllers, which are few).
const MAX_ANSWER: u64 = 16 << 20;

/// Parses `--from`: `http://HOST[:PORT][/PATH]`.
fn target(s: &str) -> Result<Target, String> {
    const FORM: &str = "expected a URL such as http://127.0.0.1:8082";
    let uri: Uri = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a URL ({e}); {FORM}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "{s:?}: https is not supported: the debug address serves plain HTTP, on loopback; {FORM} (through kubectl port-forward)"
            ));
        }
        Some(other) => return Err(format!("{s:?}: unsupported scheme {other:?}; {FORM}")),
        None => return Err(format!("{s:?} has no scheme; {FORM}")),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("{s:?} has no host; {FORM}"))?;
    if authority.as_str().contains('@') {
        return Err(format!("{s:?}: user names are not supported; {FORM}"));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{s:?} has no host; {FORM}"));
    }
    let path = match uri.path_and_query().map(|p| p.as_str()) {
        None | Some("" | "/") => PATH.to_owned(),
        Some(path) => path.to_owned(),
    };
    let port = authority.port_u16().unwrap_or(80);
    Ok(Target {
        url: format!("http://{}{path}", authority.as_str()),
        host: host.to_owned(),
        port,
        path,
    })
}

/// Runs `deadlines`: exit status 0 with the table on stdout, 1 with the error on stderr.
pub fn main(args: &DeadlinesArgs) -> ExitCode {
    match fetch(&args.from, args.timeout) {
        Ok(report) => {
            print!("{}", render(&report, &args.from.url));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {}", super::error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// GETs the view at `target` and parses it.
pub fn fetch(target: &Target, timeout: Duration) -> Result<Report, Error> {
    let body = get(target, timeout)?;
    serde_json::from_str(&body).map_err(|source| Error::NotJson {
        url: target.url.clone(),
        start: body.chars().take(80).collect(),
        source,
    })
}

/// One HTTP/1.1 GET with `Connection: close`; the body of a 200 answer.
fn get(target: &Target, timeout: Duration) -> Result<String, Error> {
    let url = &target.url;
    let addrs: Vec<SocketAddr> = (target.host.as_str(), target.port)
        .to_socket_addrs()
        .map_err(|source| Error::Resolve {
            host: target.host.clone(),
            source,
        })?
        .collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut stream = stream.ok_or_else(|| Error::Connect {
        url: url.clone(),
        source: last,
    })?;
    let exchange = |source| Error::Exchange {
        url: url.clone(),
        source,
    };
    stream.set_read_timeout(Some(timeout)).map_err(exchange)?;
    stream.set_write_timeout(Some(timeout)).map_err(exchange)?;
    let host = if target.host.contains(':') {
        format!("[{}]:{}", target.host, target.port)
    } else {
        format!("{}:{}", target.host, target.port)
    };
    write!(
        stream,
        "GET {} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        target.path
    )
    .map_err(exchange)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut raw)
        .map_err(exchange)?;
    let (status, body) = split_response(&raw).ok_or_else(|| Error::NotHttp { url: url.clone() })?;
    if !status.starts_with("200") {
        return Err(Error::Status {
            url: url.clone(),
            status,
            body: body.trim().chars().take(200).collect(),
        });
    }
    Ok(body)
}

/// The status (`200 OK`) and the body of an HTTP/1.1 response, de-chunked.
fn split_response(raw: &[u8]) -> Option<(String, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines
        .next()?
        .strip_prefix("HTTP/1.")?
        .get(2..)?
        .trim()
        .to_owned();
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size + 2..)?;
    }
}

/// The table, the flag lines and the reasoning, for a person.
#[must_use]
pub fn render(report: &Report, url: &str) -> String {
    let header = [
        "CONTROLLER",
        "DEADLINE",
        "FROM",
        "RECONCILES",
        "P50",
        "P99",
        "P99.9",
        "MAX",
        "NEAR MISSES",
        "HANGS",
        "SUGGESTED",
    ];
    let rows: Vec<[String; 11]> = report
        .controllers
        .iter()
        .map(|c| {
            [
                c.controller.clone(),
                c.deadline.clone(),
                match c.deadline_source {
                    reconcile_watchdog::internals::deadlines::DeadlineSource::Default => {
                        "default".into()
                    }
                    reconcile_watchdog::internals::deadlines::DeadlineSource::Flag => "flag".into(),
                },
                c.reconciles.to_string(),
                cell(c.p50_seconds),
                cell(c.p99_seconds),
                cell(c.p999_seconds),
                cell(c.max_seconds),
                c.near_misses.to_string(),
                c.hangs.to_string(),
                c.suggested_deadline
                    .clone()
                    .unwrap_or_else(|| "too few".into()),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };

    let mut out = format!(
        "deadlines from {url} (near-miss threshold {}; a suggestion needs {} reconciles)\n\n",
        report.near_miss_threshold, report.min_reconciles
    );
    out.push_str(&line(&header));
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push_str(&line(&cells));
    }
    if report.controllers.is_empty() {
        out.push_str("(no controller has reconciled yet)\n");
    }
    if report.untracked_reconciles > 0 {
        out.push_str(&format!(
            "({} reconciles of controllers past the advisor's cap are in no row)\n",
            report.untracked_reconciles
        ));
    }
    let quarantined = &report.quarantined;
    if quarantined.count > 0 {
        // Not reconciled, so not in the durations: the first few named, the rest counted.
        let rest = quarantined
            .count
            .saturating_sub(quarantined.first.len() as u64);
        let more = if rest > 0 {
            format!(" and {rest} more")
        } else {
            String::new()
        };
        out.push_str(&format!(
            "(quarantined, not reconciled: {}{more})\n",
            quarantined.first.join(", ")
        ));
    }
    let flags: Vec<&str> = report
        .controllers
        .iter()
        .filter_map(|c| c.flag.as_deref())
        .collect();
    out.push('\n');
    if flags.is_empty() {
        out.push_str("No flag to suggest yet: too few reconciles have ended.\n");
    } else {
        out.push_str("Flags to paste:\n");
        for flag in flags {
            out.push_str(&format!("  {flag}\n"));
        }
    }
    out.push_str("\nWhy:\n");
    for c in &report.controllers {
        out.push_str(&format!("  {}: {}\n", c.controller, c.reasoning));
    }
    out
}

/// Seconds for a table cell, to the millisecond (`1s 250ms`), or to the microsecond
/// below one; `-` when unknown.
fn cell(seconds: Option<f64>) -> String {
    seconds.filter(|s| s.is_finite() && *s >= 0.0).map_or_else(
        || "-".to_owned(),
        |s| {
            let d = Duration::from_secs_f64(s);
            let rounded = if d < Duration::from_millis(1) {
                Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            } else {
                Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            };
            humantime::format_duration(rounded).to_string()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use reconcile_watchdog::internals::deadlines::{
        ControllerReport, DeadlineSource, QuarantinedReport,
    };

    #[test]
    fn urls() {
        let t = target("http://127.0.0.1:8082").unwrap();
        assert_eq!(
            t,
            Target {
                url: "http://127.0.0.1:8082/debug/deadlines".into(),
                host: "127.0.0.1".into(),
                port: 8082,
                path: PATH.into(),
            }
        );
        let t = target("http://[::1]:9/debug/deadlines?x=1").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9));
        assert_eq!(t.path, "/debug/deadlines?x=1");
        assert_eq!(target("http://localhost/").unwrap().port, 80);
        for (bad, says) in [
            ("127.0.0.1:8082", "no scheme"),
            ("https://127.0.0.1:8082", "https is not supported"),
            ("ftp://x", "unsupported scheme"),
            ("http://", "not a URL"),
            ("not a url", "not a URL"),
            ("http://user@host:1", "user names"),
        ] {
            let error = target(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn responses() {
        let (status, body) =
            split_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!((status.as_str(), body.as_str()), ("200 OK", "{}"));
        let (_, body) = split_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(body, "{}");
        assert_eq!(split_response(b"SSH-2.0-OpenSSH\r\n\r\n"), None);
        assert_eq!(split_response(b""), None);
    }

    #[test]
    fn the_table_lines_up_and_lists_the_flags() {
        let row = |name: &str, flag: Option<&str>| ControllerReport {
            controller: name.into(),
            deadline: "3s".into(),
            deadline_seconds: 3.0,
            deadline_source: DeadlineSource::Default,
            reconciles: if flag.is_some() { 1500 } else { 3 },
            p50_seconds: Some(0.027),
            p99_seconds: Some(0.049),
            p999_seconds: Some(0.05),
            max_seconds: Some(2.55),
            near_misses: 1,
            hangs: 0,
            suggested_deadline: flag.map(|_| "4s".into()),
            suggested_deadline_seconds: flag.map(|_| 4.0),
            flag: flag.map(str::to_owned),
            reasoning: "because".into(),
        };
        let report = Report {
            near_miss_threshold: "80%".into(),
            min_reconciles: 100,
            controllers: vec![
                row(
                    "cert-renewer",
                    Some("--reconcile-deadline-for cert-renewer=4s"),
                ),
                row("x", None),
            ],
            untracked_reconciles: 0,
            quarantined: QuarantinedReport::default(),
        };
        let text = render(&report, "http://127.0.0.1:8082/debug/deadlines");
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[2].starts_with("CONTROLLER    DEADLINE  FROM     RECONCILES"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("cert-renewer  3s        default  1500"),
            "{text}"
        );
        assert!(lines[3].contains("2s 550ms"), "{text}");
        assert!(lines[3].ends_with("4s"), "{text}");
        assert!(lines[4].ends_with("too few"), "{text}");
        assert!(
            text.contains("Flags to paste:\n  --reconcile-deadline-for cert-renewer=4s\n"),
            "{text}"
        );
        assert!(text.contains("  x: because\n"), "{text}");
        assert!(!text.contains("quarantined"), "{text}");
        let quarantined = Report {
            quarantined: QuarantinedReport {
                count: 12,
                first: vec!["cert-renewer demo/cert-7".into(), "x a".into()],
            },
            ..report
        };
        let text = render(&quarantined, "http://127.0.0.1:8082/debug/deadlines");
        assert!(
            text.contains(
                "(quarantined, not reconciled: cert-renewer demo/cert-7, x a and 10 more)\n"
            ),
            "{text}"
        );
    }
}
