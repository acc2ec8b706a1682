//! Raw references measured in the same run, so Braid's figures read as ratios of what
//! this machine can do at all: a sequential file write, and one TCP stream over
//! loopback. Both are plain blocking loops with 1 MiB buffers, nothing Braid-specific.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Instant;

use crate::report::References;

/// The buffer every reference writes and reads with.
const CHUNK: usize = 1 << 20;

/// Loopback transfers per measurement; the median is reported. One transfer moves by
/// a third from run to run on a shared virtual machine.
const LOOPBACK_RUNS: usize = 3;

/// Measures both references, writing `bytes` each: the file write once (a second
/// would find the page cache in another state), loopback TCP as the median of
/// [`LOOPBACK_RUNS`] transfers.
///
/// # Errors
/// The IO error of either measurement.
pub fn measure(dir: &Path, bytes: u64) -> std::io::Result<References> {
    let file_write_mb_per_sec = file_write(dir, bytes)?;
    let mut loopback = (0..LOOPBACK_RUNS)
        .map(|_| loopback_tcp(bytes))
        .collect::<std::io::Result<Vec<f64>>>()?;
    loopback.sort_by(f64::total_cmp);
    Ok(References {
        file_write_mb_per_sec,
        loopback_tcp_mb_per_sec: loopback[LOOPBACK_RUNS / 2],
    })
}

/// MB/s of writing `bytes` to a new file in `dir` in 1 MiB writes, left to write-back
/// as a node with `fsync = never` leaves it. The file is removed afterwards (which also
/// drops its dirty pages, so the run that follows does not pay for their write-back).
///
/// # Errors
/// The IO error.
pub fn file_write(dir: &Path, bytes: u64) -> std::io::Result<f64> {
    let mut file = tempfile::tempfile_in(dir)?;
    let chunk = vec![0x5au8; CHUNK];
    let start = Instant::now();
    let mut written = 0u64;
    while written < bytes {
        let n = chunk.len().min((bytes - written) as usize);
        file.write_all(&chunk[..n])?;
        written += n as u64;
    }
    Ok(mb_per_sec(written, start))
}

/// MB/s of sending `bytes` through one loopback TCP connection, sender and receiver on
/// their own threads.
///
/// # Errors
/// The IO error.
pub fn loopback_tcp(bytes: u64) -> std::io::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut socket, _) = listener.accept()?;
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0u64;
        loop {
            let n = socket.read(&mut buf)?;
            if n == 0 {
                return Ok(got);
            }
            got += n as u64;
        }
    });
    let chunk = vec![0x5au8; CHUNK];
    let start = Instant::now();
    let mut socket = TcpStream::connect(addr)?;
    socket.set_nodelay(true)?;
    let mut sent = 0u64;
    while sent < bytes {
        let n = chunk.len().min((bytes - sent) as usize);
        socket.write_all(&chunk[..n])?;
        sent += n as u64;
    }
    drop(socket);
    let got = receiver
        .join()
        .map_err(|_| std::io::Error::other("the loopback receiver panicked"))??;
    Ok(mb_per_sec(got, start))
}

fn mb_per_sec(bytes: u64, start: Instant) -> f64 {
    bytes as f64 / start.elapsed().as_secs_f64() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_references_move_the_bytes_and_report_a_rate() {
        let dir = tempfile::tempdir().unwrap();
        let refs = measure(dir.path(), 8 << 20).unwrap();
        assert!(refs.file_write_mb_per_sec > 0.0, "{refs:?}");
        assert!(refs.loopback_tcp_mb_per_sec > 0.0, "{refs:?}");
        // The scratch file is gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
