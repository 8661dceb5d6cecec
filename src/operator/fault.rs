//! Fault injection: the `watchdog.example.com/fault` annotation makes a reconcile hang,
//! block, panic or sleep on purpose, to fire-drill the probes.

use std::str::FromStr;
use std::time::Duration;

/// The annotation that asks for a fault.
pub const ANNOTATION: &str = "watchdog.example.com/fault";

/// A fault a reconcile can be asked to commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Await a future that is never woken (a lost API request looks like this).
    Hang,
    /// Block the worker thread inside the poll, forever (a deadlock looks like this).
    Block,
    /// Panic.
    Panic,
    /// Sleep this long, then carry on.
    Sleep(Duration),
}

/// A fault annotation that could not be read.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("unknown fault {value:?}; expected hang, block, panic or sleep=DURATION")]
pub struct Error {
    /// The annotation's value.
    pub value: String,
}

impl FromStr for Fault {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let value = s.trim();
        let unknown = || Error {
            value: value.to_owned(),
        };
        match value {
            "hang" => Ok(Self::Hang),
            "block" => Ok(Self::Block),
            "panic" => Ok(Self::Panic),
            _ => {
                let duration = value.strip_prefix("sleep=").ok_or_else(unknown)?;
                humantime::parse_duration(duration.trim())
                    .map(Self::Sleep)
                    .map_err(|_| unknown())
            }
        }
    }
}

impl Fault {
    /// Commits the fault: for all but `Sleep`, this never returns.
    pub async fn commit(self) {
        match self {
            Self::Hang => std::future::pending::<()>().await,
            Self::Block => block_forever(),
            Self::Panic => {
                panic!("fault injection: panic asked for by the {ANNOTATION} annotation")
            }
            Self::Sleep(duration) => tokio::time::sleep(duration).await,
        }
    }
}

/// Parks the worker thread for good, as a reconcile stuck on a lock never released would.
#[inline(never)]
fn block_forever() {
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_fault() {
        assert_eq!("hang".parse(), Ok(Fault::Hang));
        assert_eq!(" block ".parse(), Ok(Fault::Block));
        assert_eq!("panic".parse(), Ok(Fault::Panic));
        assert_eq!(
            "sleep=1m30s".parse(),
            Ok(Fault::Sleep(Duration::from_secs(90)))
        );
        assert!(
            "sleep=soon"
                .parse::<Fault>()
                .unwrap_err()
                .to_string()
                .contains("sleep=DURATION")
        );
        assert!("explode".parse::<Fault>().is_err());
    }
}
