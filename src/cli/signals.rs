//! SIGINT and SIGTERM, delivered on a thread of their own so that they arrive even when
//! the operator's runtime is wedged.

use std::sync::mpsc;

/// A termination request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (the kubelet stopping the pod).
    Terminate,
}

/// Starts listening; every signal received is sent to the returned channel.
pub fn listen() -> std::io::Result<mpsc::Receiver<Signal>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, rx) = mpsc::channel();
    // Register the handlers before returning, so no early signal kills the process.
    #[cfg(unix)]
    let (mut int, mut term) = {
        use tokio::signal::unix::{SignalKind, signal};
        let _guard = runtime.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        )
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            runtime.block_on(async move {
                loop {
                    #[cfg(unix)]
                    let received = tokio::select! {
                        _ = int.recv() => Signal::Interrupt,
                        _ = term.recv() => Signal::Terminate,
                    };
                    #[cfg(not(unix))]
                    let received = match tokio::signal::ctrl_c().await {
                        Ok(()) => Signal::Interrupt,
                        Err(_) => return,
                    };
                    if tx.send(received).is_err() {
                        return;
                    }
                }
            });
        })?;
    Ok(rx)
}
