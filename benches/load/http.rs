//! A raw HTTP/1.1 keep-alive client and a constant-rate load generator over it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// One keep-alive connection that sends `GET` requests one at a time.
pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// Sends `GET path` and reads the whole response; returns its status.
    pub fn get(&mut self, path: &str) -> io::Result<u16> {
        write!(
            self.stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )?;
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        let mut wanted = None;
        loop {
            if wanted.is_none() {
                wanted = head_and_body_len(&self.buf)?;
            }
            if wanted.is_some_and(|(_, total)| self.buf.len() >= total) {
                break;
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-response",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let status = std::str::from_utf8(&self.buf[9..12])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no status code"))?;
        Ok(status)
    }
}

/// Once the head is complete: its length and the whole response's length.
fn head_and_body_len(buf: &[u8]) -> io::Result<Option<(usize, usize)>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end])
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "head is not UTF-8"))?;
    let body = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no content-length"))?;
    Ok(Some((end + 4, end + 4 + body)))
}

/// Latencies of one load run.
#[derive(Debug, Default)]
pub struct Samples {
    /// Request sent to response read, one per request.
    pub latencies: Vec<Duration>,
    /// Responses whose status was not 200.
    pub not_ok: usize,
    /// Requests sent more than one period after their slot (the client fell behind).
    pub late: usize,
}

impl Samples {
    /// Adds `other`'s samples to these.
    pub fn merge(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        self.not_ok += other.not_ok;
        self.late += other.late;
    }
}

/// Sends `GET path` to `addr` at `rate` requests per second in all, spread over
/// `connections` keep-alive connections each on its own thread, for `duration`.
/// Requests leave on a fixed schedule, not when the previous answer came, so a slow
/// server cannot slow the offered load down (late sends are counted).
pub fn constant_rate(
    addr: SocketAddr,
    path: &str,
    rate: u32,
    connections: u32,
    duration: Duration,
) -> io::Result<Samples> {
    let period = Duration::from_secs(1) * connections / rate;
    let start = Instant::now() + Duration::from_millis(10);
    let end = start + duration;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..connections)
            .map(|c| {
                s.spawn(move || -> io::Result<Samples> {
                    let mut client = Client::connect(addr)?;
                    let mut samples = Samples::default();
                    // Stagger the connections evenly across one period.
                    let mut next = start + period * c / connections;
                    while next < end {
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        } else if now - next > period {
                            samples.late += 1;
                        }
                        let sent = Instant::now();
                        let status = client.get(path)?;
                        samples.latencies.push(sent.elapsed());
                        if status != 200 {
                            samples.not_ok += 1;
                        }
                        next += period;
                    }
                    Ok(samples)
                })
            })
            .collect();
        let mut all = Samples::default();
        for worker in workers {
            all.merge(worker.join().expect("a load thread panicked")?);
        }
        Ok(all)
    })
}

/// The `p`-quantile (0..=1) of `samples`, by nearest rank.
pub fn quantile(samples: &mut [Duration], p: f64) -> Duration {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}
