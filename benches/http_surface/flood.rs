//! `/healthz` latency, one new connection per request as the kubelet does, while the
//! probe port is held at 3,000 half-open connections (request heads never finished)
//! and the flood keeps opening more.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reconcile_watchdog::Watchdog;

use crate::summary;

pub struct Plan {
    half_open: usize,
    /// New half-open connections per second once the flood is up.
    flood_per_sec: u32,
    probes_per_sec: u32,
    duration: Duration,
}

impl Plan {
    pub fn full() -> Self {
        Self {
            half_open: 3_000,
            flood_per_sec: 500,
            probes_per_sec: 20,
            duration: Duration::from_secs(30),
        }
    }

    pub fn quick() -> Self {
        Self {
            half_open: 300,
            flood_per_sec: 100,
            probes_per_sec: 20,
            duration: Duration::from_millis(500),
        }
    }
}

pub struct Flood {
    half_open: usize,
    latencies: Vec<Duration>,
    failed: usize,
    flood_opened: u64,
}

impl Flood {
    pub fn render(mut self) -> String {
        format!(
            "/healthz on a new connection each, under a flood of {} half-open connections ({} opened in all): {}; failed: {}",
            self.half_open,
            self.flood_opened,
            summary(&mut self.latencies),
            self.failed
        )
    }
}

fn half_open(addr: SocketAddr) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).ok()?;
    let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: flood\r\nX-Never-Ends: ");
    Some(stream)
}

/// One probe as the kubelet sends it: connect, GET, read to the end.
fn probe(addr: SocketAddr) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: kubelet\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    std::str::from_utf8(response.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))
}

pub fn run(plan: &Plan) -> Flood {
    let watchdog = Watchdog::builder()
        .probe_address(([127, 0, 0, 1], 0).into())
        .start()
        .expect("the watchdog starts");
    let addr = watchdog.probe_address().expect("a probe server");
    let stop = AtomicBool::new(false);
    let opened = AtomicU64::new(0);
    let mut latencies = Vec::new();
    let mut failed = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut held: VecDeque<TcpStream> = (0..plan.half_open)
                .filter_map(|_| half_open(addr))
                .collect();
            opened.fetch_add(held.len() as u64, Ordering::Relaxed);
            let period = Duration::from_secs(1) / plan.flood_per_sec;
            while !stop.load(Ordering::Relaxed) {
                if let Some(stream) = half_open(addr) {
                    held.push_back(stream);
                    opened.fetch_add(1, Ordering::Relaxed);
                }
                if held.len() > plan.half_open {
                    held.pop_front();
                }
                std::thread::sleep(period);
            }
        });
        // Let the flood build up before measuring.
        while opened.load(Ordering::Relaxed) < plan.half_open as u64 {
            std::thread::sleep(Duration::from_millis(10));
        }
        let period = Duration::from_secs(1) / plan.probes_per_sec;
        let end = Instant::now() + plan.duration;
        while Instant::now() < end {
            let sent = Instant::now();
            match probe(addr) {
                Ok(200) => latencies.push(sent.elapsed()),
                _ => failed += 1,
            }
            std::thread::sleep(period.saturating_sub(sent.elapsed()));
        }
        stop.store(true, Ordering::Relaxed);
    });
    Flood {
        half_open: plan.half_open,
        latencies,
        failed,
        flood_opened: opened.load(Ordering::Relaxed),
    }
}
