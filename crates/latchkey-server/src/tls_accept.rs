//! TLS on a replica's listeners, accepted here rather than inside tonic, so
//! that a refused handshake is logged with the caller's address.
//!
//! tonic's own TLS server drops a failed handshake with a debug line and no
//! address, so an operator cannot see a client with the wrong CA, an
//! expired certificate or a plaintext client on a TLS port, nor a stranger
//! probing the port. Here each connection that passed the connection caps
//! (`crate::conn_limit`) is handed to rustls; a handshake that fails, or
//! does not finish within the handshake timeout, closes the connection,
//! counts in [`tls_handshake_failures`] and is logged at warn level with
//! the caller's address and rustls's reason; after one such line, further
//! refusals are logged only once 10 seconds have passed (a flood of bad
//! handshakes must not become a flood of log lines). A connection closed
//! before or during its handshake without a word (a TCP health check, a
//! client giving up) is not a refusal: it is logged at debug level only
//! and not counted. Each handshake runs in its own task (up to the
//! connection cap at once, each holding its connection's permit), so
//! neither a slow peer nor the crypto of many handshakes holds up the
//! others or the accept loop.
//!
//! The configuration is what tonic's would be: rustls with the ring
//! provider, TLS 1.2 and 1.3, HTTP/2 by ALPN, client certificates checked
//! against the cluster's CA (optional unless required). The connection
//! keeps its client certificates for `Request::peer_certs`, which the peer
//! check and certificate users read (`crate::peer_auth`, `crate::auth`).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

use crate::conn_limit::Limited;
use crate::log_limit::LogLimit;
use crate::{NodeError, ServerTls};

/// TLS handshakes refused or timed out since the process started.
static FAILURES: AtomicU64 = AtomicU64::new(0);

/// Failed handshakes are logged at most every 10 s.
static LAST_LOGGED: LogLimit = LogLimit::new();

/// How many TLS handshakes this process's replicas have refused (or that
/// timed out) since it started, on every listener.
pub fn tls_handshake_failures() -> u64 {
    FAILURES.load(Ordering::Relaxed)
}

fn config_error(what: &str, e: impl std::fmt::Display) -> NodeError {
    NodeError::Config(format!("TLS: {what}: {e}"))
}

/// The rustls server configuration for `tls` (see the module docs).
pub(crate) fn server_config(tls: &ServerTls) -> Result<Arc<ServerConfig>, NodeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(tls.trust().ca_pem()) {
        let cert = cert.map_err(|e| config_error("the CA certificate", e))?;
        roots
            .add(cert)
            .map_err(|e| config_error("the CA certificate", e))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let verifier = if tls.requires_client_certificate() {
        verifier
    } else {
        verifier.allow_unauthenticated()
    }
    .build()
    .map_err(|e| config_error("the client certificate verifier", e))?;
    let chain = CertificateDer::pem_slice_iter(tls.identity().cert_pem())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| config_error("the replica's certificate", e))?;
    let key = PrivateKeyDer::from_pem_slice(tls.identity().key_pem())
        .map_err(|e| config_error("the replica's key", e))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error("protocol versions", e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| config_error("the replica's certificate and key", e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// `incoming` with each connection's TLS handshake done: up to
/// `concurrent` at once, each within `timeout`; failures are dropped,
/// counted and logged (see the module docs). Accept errors pass through.
pub(crate) fn accept<S>(
    incoming: S,
    config: Arc<ServerConfig>,
    timeout: Duration,
    concurrent: usize,
) -> impl Stream<Item = io::Result<TlsStream<Limited>>>
where
    S: Stream<Item = io::Result<Limited>>,
{
    let acceptor = TlsAcceptor::from(config);
    incoming
        .map(move |accepted| {
            let acceptor = acceptor.clone();
            async move {
                let connection = match accepted {
                    Ok(c) => c,
                    Err(e) => return Some(Err(e)),
                };
                let from = connection.connect_info().remote_addr();
                let handshake = tokio::spawn(async move {
                    tokio::time::timeout(timeout, acceptor.accept(connection)).await
                });
                match handshake.await {
                    Ok(Ok(Ok(mut tls))) => {
                        // The preface must follow within the same time.
                        tls.get_mut().0.expect_bytes_within(timeout);
                        Some(Ok(tls))
                    }
                    Ok(Ok(Err(e))) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        tracing::debug!(?from, "a connection closed before its TLS handshake");
                        None
                    }
                    Ok(Ok(Err(e))) => {
                        refused(from, &reason(&e));
                        None
                    }
                    Ok(Err(_)) => {
                        refused(from, &format!("no handshake within {timeout:?}"));
                        None
                    }
                    // The handshake task panicked (rustls): that
                    // connection is gone, the listener goes on.
                    Err(e) => {
                        tracing::error!(?from, error = %e, "a TLS handshake task failed");
                        None
                    }
                }
            }
        })
        .buffer_unordered(concurrent.max(1))
        .filter_map(futures::future::ready)
}

/// rustls's reason, with a hint for the common mistakes.
fn reason(e: &io::Error) -> String {
    let hint = match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidMessage(_)) => " (not TLS: a plaintext client on a TLS port?)",
        Some(rustls::Error::NoCertificatesPresented) => {
            " (the client presented no certificate; this listener requires one)"
        }
        Some(rustls::Error::InvalidCertificate(_)) => {
            " (the client's certificate is not one the cluster's CA signed, or has expired)"
        }
        Some(rustls::Error::AlertReceived(_)) => {
            " (the client refused this replica's certificate: does it trust the cluster's CA \
             and dial a name the certificate holds?)"
        }
        _ => "",
    };
    format!("{e}{hint}")
}

fn refused(from: Option<SocketAddr>, why: &str) {
    FAILURES.fetch_add(1, Ordering::Relaxed);
    if LAST_LOGGED.allow() {
        let from = from.map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
        tracing::warn!(
            %from,
            "refused a TLS handshake: {why} (further refusals are logged at most every 10 s; \
             see tls_handshake_failures)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_proto::{Identity, TlsOptions};
    use tokio::io::AsyncWriteExt;

    fn issued(
        ca: Option<(&rcgen::Certificate, &rcgen::KeyPair)>,
        name: &str,
    ) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().expect("a key");
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).expect("params");
        let cert = match ca {
            Some((ca, ca_key)) => params.signed_by(&key, ca, ca_key),
            None => {
                params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
                params.self_signed(&key)
            }
        }
        .expect("a certificate");
        (cert, key)
    }

    /// A server configuration with a fresh CA, and a client configuration
    /// that trusts it.
    fn configs() -> io::Result<(Arc<ServerConfig>, tokio_rustls::TlsConnector)> {
        let (ca, ca_key) = issued(None, "test CA");
        let (cert, key) = issued(Some((&ca, &ca_key)), "localhost");
        let tls = ServerTls::new(
            Identity::from_pem(cert.pem().into_bytes(), key.serialize_pem().into_bytes())
                .map_err(io::Error::other)?,
            TlsOptions::new(ca.pem().into_bytes()).map_err(io::Error::other)?,
        );
        let config = server_config(&tls).map_err(io::Error::other)?;
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca.der().to_vec()))
            .map_err(io::Error::other)?;
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok((
            config,
            tokio_rustls::TlsConnector::from(Arc::new(client_config)),
        ))
    }

    /// A client that completes its handshake and then sends nothing (no
    /// HTTP/2 preface) is closed at the handshake timeout, like a silent
    /// TCP connection; one that speaks is read.
    #[tokio::test]
    async fn a_connection_silent_after_its_handshake_is_closed() -> io::Result<()> {
        use tokio::io::AsyncReadExt;
        let (config, connector) = configs()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let incoming = futures::stream::unfold(listener, |l| async move {
            Some((l.accept().await.map(|(s, _)| s), l))
        });
        let timeout = Duration::from_millis(500);
        let limited = crate::conn_limit::limit(incoming, 16, 16, timeout);
        let mut accepted = Box::pin(accept(limited, config, timeout, 16));
        let name = rustls_pki_types::ServerName::try_from("localhost").map_err(io::Error::other)?;

        // The server side's handshake runs only while `accepted` is polled.
        let connecting = {
            let (connector, name) = (connector.clone(), name.clone());
            tokio::spawn(async move {
                connector
                    .connect(name, tokio::net::TcpStream::connect(addr).await?)
                    .await
            })
        };
        let mut on_server = accepted.next().await.ok_or(io::ErrorKind::Other)??;
        let silent = connecting.await.map_err(io::Error::other)??;
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(20), on_server.read(&mut buf))
            .await
            .map_err(|_| io::Error::other("a silent connection was held for 20 s"))?;
        let err = read.expect_err("nothing was sent, so nothing can be read");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        drop(silent);

        let speaking = tokio::spawn(async move {
            let mut tls = connector
                .connect(name, tokio::net::TcpStream::connect(addr).await?)
                .await?;
            tls.write_all(b"PRI * HTTP/2.0").await?;
            tls.flush().await?;
            Ok::<_, io::Error>(tls)
        });
        let mut on_server = accepted.next().await.ok_or(io::ErrorKind::Other)??;
        let _speaking = speaking.await.map_err(io::Error::other)??;
        let n = tokio::time::timeout(Duration::from_secs(20), on_server.read(&mut buf))
            .await
            .map_err(io::Error::other)??;
        assert_eq!(&buf[..n], b"PRI * HTTP/2.0");
        Ok(())
    }

    #[tokio::test]
    async fn a_failed_handshake_is_counted_and_others_are_served() -> io::Result<()> {
        let (config, connector) = configs()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let incoming = futures::stream::unfold(listener, |l| async move {
            Some((l.accept().await.map(|(s, _)| s), l))
        });
        // Long timeouts: a connection that never completes its handshake
        // must not hold up the next one, whose handshake completes at once.
        let limited = crate::conn_limit::limit(incoming, 16, 16, Duration::from_secs(60));
        let mut accepted = Box::pin(accept(limited, config, Duration::from_secs(60), 16));
        let (served_tx, mut served) = tokio::sync::mpsc::channel(4);
        let server = tokio::spawn(async move {
            while let Some(connection) = accepted.next().await {
                if served_tx.send(connection.is_ok()).await.is_err() {
                    break;
                }
            }
        });
        let before = tls_handshake_failures();

        // A client that starts a handshake and never finishes it (a partial
        // ClientHello record header), and a plaintext client, whose bytes
        // are not TLS.
        let mut stalled = tokio::net::TcpStream::connect(addr).await?;
        stalled.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await?;
        let mut plain = tokio::net::TcpStream::connect(addr).await?;
        plain.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
        // A client trusting the CA completes its handshake, and is the
        // next connection served.
        let name = rustls_pki_types::ServerName::try_from("localhost").map_err(io::Error::other)?;
        let client = tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            connector.connect(name, tcp).await
        });
        // Served long before the stalled handshake's 60 s are up.
        let first = tokio::time::timeout(Duration::from_secs(20), served.recv())
            .await
            .map_err(io::Error::other)?;
        assert_eq!(first, Some(true), "the TLS client is served");
        let _client = client.await.map_err(io::Error::other)??;
        // The plaintext one never is; it is counted once refused.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tls_handshake_failures() == before && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            tls_handshake_failures() > before,
            "the plaintext client's handshake was counted"
        );
        assert!(served.try_recv().is_err(), "nothing else was served");
        drop((plain, stalled));
        server.abort();
        Ok(())
    }
}
