//! The guarded storage of the lock workload: one [`FileFenceGate`] in the
//! controller, reached by the lock workers over a Unix socket.
//!
//! A `FileFenceGate` must be opened by one process only, and the workers
//! are several processes (so that one can be paused while the others go
//! on), hence a tiny server. The protocol is one line each way:
//!
//! ```text
//! -> admit <resource> <token>
//! <- ok | stale <highest> | error <message>
//! ```
//!
//! Resource names are the workload's own (`res0`, `res1`, `res2`: no spaces).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use latchkey_fence::{FenceError, FenceGate, FileFenceGate};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::error::{Error, Result};

/// What the gate said of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted: the write happened.
    Accepted,
    /// Refused: a higher token had been seen.
    Stale,
}

/// Starts serving the gate stored at `state` on the socket `socket`; runs
/// until the runtime ends.
pub fn serve(state: &Path, socket: &Path) -> Result<()> {
    let gate = Arc::new(FileFenceGate::open(state).map_err(|e| Error::Setup(e.to_string()))?);
    let _ = std::fs::remove_file(socket);
    let listener =
        UnixListener::bind(socket).map_err(Error::io(format!("listen on {}", socket.display())))?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(connection(gate.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!(%e, "gate: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    });
    Ok(())
}

async fn connection(gate: Arc<FileFenceGate>, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = answer(gate.as_ref(), &line);
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// The reply line (with its newline) to one request line.
fn answer(gate: &dyn FenceGate, line: &str) -> String {
    let mut words = line.split_whitespace();
    let (Some("admit"), Some(resource), Some(token), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return format!("error malformed request {line:?}\n");
    };
    let Ok(token) = token.parse::<u64>() else {
        return format!("error bad token {token:?}\n");
    };
    match gate.admit(resource, token) {
        Ok(_) => "ok\n".to_owned(),
        Err(FenceError::Stale { highest, .. }) => format!("stale {highest}\n"),
        Err(e) => format!("error {}\n", e.to_string().replace('\n', " ")),
    }
}

/// A worker's connection to the gate; reconnects after any error.
#[derive(Debug)]
pub struct GateClient {
    socket: PathBuf,
    conn: Option<(
        BufReader<tokio::net::unix::OwnedReadHalf>,
        tokio::net::unix::OwnedWriteHalf,
    )>,
}

impl GateClient {
    /// A client of the gate at `socket` (connects on first use).
    pub fn new(socket: PathBuf) -> GateClient {
        GateClient { socket, conn: None }
    }

    /// Asks the gate to admit a write to `resource` with `token`. An error
    /// means the outcome is unknown (the request may have been admitted).
    pub async fn admit(
        &mut self,
        resource: &str,
        token: u64,
    ) -> std::result::Result<Verdict, String> {
        // A gate that does not answer in time: outcome unknown.
        let result = match tokio::time::timeout(
            std::time::Duration::from_secs(2),
            self.try_admit(resource, token),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err("the gate did not answer within 2 s".to_owned()),
        };
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    async fn try_admit(
        &mut self,
        resource: &str,
        token: u64,
    ) -> std::result::Result<Verdict, String> {
        if self.conn.is_none() {
            let stream = UnixStream::connect(&self.socket)
                .await
                .map_err(|e| format!("connect to the gate {}: {e}", self.socket.display()))?;
            let (r, w) = stream.into_split();
            self.conn = Some((BufReader::new(r), w));
        }
        let Some((reader, writer)) = self.conn.as_mut() else {
            return Err("no gate connection".into());
        };
        writer
            .write_all(format!("admit {resource} {token}\n").as_bytes())
            .await
            .map_err(|e| format!("send to the gate: {e}"))?;
        let mut reply = String::new();
        let n = reader
            .read_line(&mut reply)
            .await
            .map_err(|e| format!("read from the gate: {e}"))?;
        if n == 0 {
            return Err("the gate closed the connection".into());
        }
        match reply.trim_end() {
            "ok" => Ok(Verdict::Accepted),
            r if r.starts_with("stale ") => Ok(Verdict::Stale),
            r => Err(format!("gate: {r}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_fence::MemoryFenceGate;

    #[test]
    fn answers() {
        let gate = MemoryFenceGate::new();
        assert_eq!(answer(&gate, "admit r 5"), "ok\n");
        assert_eq!(answer(&gate, "admit r 5"), "ok\n");
        assert_eq!(answer(&gate, "admit r 4"), "stale 5\n");
        assert_eq!(answer(&gate, "admit r 6"), "ok\n");
        assert!(answer(&gate, "admit r 0").starts_with("error "));
        assert!(answer(&gate, "admit r x").starts_with("error bad token"));
        assert!(answer(&gate, "hello").starts_with("error malformed"));
        assert!(answer(&gate, "admit r 1 2").starts_with("error malformed"));
    }

    #[tokio::test]
    async fn over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("gate.sock");
        serve(&dir.path().join("gate.state"), &sock).unwrap();
        let mut c = GateClient::new(sock);
        assert_eq!(c.admit("res0", 3).await.unwrap(), Verdict::Accepted);
        assert_eq!(c.admit("res0", 2).await.unwrap(), Verdict::Stale);
        assert_eq!(c.admit("res1", 1).await.unwrap(), Verdict::Accepted);
    }
}
