//! Where the ledger survives a restart: a small trait, with optimistic concurrency.

use std::fmt;

/// What a [`Store`] holds: the ledger's bytes, and the version a write must name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// The ledger as stored; `None` when nothing is stored yet.
    pub bytes: Option<Vec<u8>>,
    /// The version of what is stored (a Kubernetes `resourceVersion`, say); `None` when
    /// nothing is stored yet.
    pub version: Option<String>,
}

/// Why a [`Store`] could not read or write.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another writer wrote since the version named: read again, and retry.
    #[error("the ledger changed since it was read")]
    Conflict,
    /// The store refuses this process (RBAC, say).
    #[error("the store refused access")]
    Forbidden(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Anything else: unreachable, timed out, refused the content.
    #[error("the store failed")]
    Failed(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Keeps the quarantine's ledger across restarts and leader changes. The kube
/// integration's is a ConfigMap (`kube::quarantine::ConfigMapStore`).
///
/// Called from the quarantine's own thread only, one call at a time: it may block, but
/// each call should end within a few seconds (a timeout of its own), as the ledger is
/// written in the little time between a failing probe and the kubelet's kill.
pub trait Store: Send + fmt::Debug + 'static {
    /// What is stored now.
    fn read(&mut self) -> Result<Stored, StoreError>;

    /// Stores `bytes` if what is stored is still of `version` (`None`: nothing is stored
    /// yet); else [`StoreError::Conflict`].
    fn write(&mut self, bytes: &[u8], version: Option<&str>) -> Result<(), StoreError>;
}

/// A store in memory, with versions: the quarantine within one process only (where no
/// store that survives a restart is at hand), and tests.
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub(crate) stored: std::sync::Arc<std::sync::Mutex<Stored>>,
}

impl Store for MemoryStore {
    fn read(&mut self) -> Result<Stored, StoreError> {
        Ok(self
            .stored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone())
    }

    fn write(&mut self, bytes: &[u8], version: Option<&str>) -> Result<(), StoreError> {
        let mut stored = self.stored.lock().unwrap_or_else(|p| p.into_inner());
        if stored.version.as_deref() != version {
            return Err(StoreError::Conflict);
        }
        let next = stored
            .version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            + 1;
        *stored = Stored {
            bytes: Some(bytes.to_vec()),
            version: Some(next.to_string()),
        };
        Ok(())
    }
}
