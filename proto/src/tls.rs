//! Mutual TLS between the hub and its spokes (rustls on ring).
//!
//! Files follow the layout cert-manager writes into a Secret's volume: one directory holding
//! `tls.crt` (the certificate chain), `tls.key` (its private key) and `ca.crt` (the CA that
//! signs the other side). A cluster's certificate names the cluster with one URI SAN,
//! `spiffe://switchyard/cluster/<name>`; the hub's names the host the spokes dial.
//!
//! Invariants:
//! - the hub accepts only handshakes whose client certificate chains to its `ca.crt`; the
//!   cluster a stream speaks for is [`cluster_of`] that certificate, nothing else;
//! - [`ReloadingServerConfig`] serves the configuration built from the files as they were at
//!   the last successful load: a half-written or broken set of files is logged and ignored,
//!   so a rotation never takes the hub's listener down; new handshakes use a new set as soon
//!   as it loads, established streams keep theirs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

/// The URI SAN prefix that names a cluster in its client certificate.
pub const CLUSTER_URI_PREFIX: &str = "spiffe://switchyard/cluster/";

/// The URI SAN a cluster's certificate carries.
pub fn cluster_uri(cluster: &str) -> String {
    format!("{CLUSTER_URI_PREFIX}{cluster}")
}

/// Why certificate material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM object.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// rustls refused the material (a key that does not match its certificate, say).
    #[error("TLS configuration: {0}")]
    Config(String),
    /// A certificate carries no cluster identity, or more than one.
    #[error("client certificate: {0}")]
    Identity(String),
}

/// The three files of one side of the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, PEM.
    pub cert: PathBuf,
    /// Private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA certificate(s) the peer's certificate must chain to, PEM.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// `tls.crt`, `tls.key` and `ca.crt` in `dir` (a mounted cert-manager Secret).
    pub fn in_dir(dir: impl AsRef<Path>) -> TlsFiles {
        let dir = dir.as_ref();
        TlsFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key"), ca: dir.join("ca.crt") }
    }

    /// The latest modification time among the three files (`None` if one is missing): what
    /// the reloaders compare to notice a rotation.
    pub fn stamp(&self) -> Option<SystemTime> {
        [&self.cert, &self.key, &self.ca]
            .iter()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .try_fold(SystemTime::UNIX_EPOCH, |latest, t| t.map(|t| latest.max(t)))
    }

    /// Reads the three files as PEM text (the form tonic's client configuration takes).
    pub fn read_pem(&self) -> Result<PemFiles, TlsError> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| TlsError::File { path: path.clone(), reason: e.to_string() })
        };
        Ok(PemFiles { cert: read(&self.cert)?, key: read(&self.key)?, ca: read(&self.ca)? })
    }

    fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let file_err = |reason: String| TlsError::File { path: path.to_path_buf(), reason };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| file_err(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file_err(e.to_string()))?;
        if certs.is_empty() {
            return Err(file_err("no CERTIFICATE in the file".into()));
        }
        Ok(certs)
    }

    fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| TlsError::File { path: self.key.clone(), reason: e.to_string() })
    }

    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        for ca in Self::certs(&self.ca)? {
            roots.add(ca).map_err(|e| TlsError::File { path: self.ca.clone(), reason: e.to_string() })?;
        }
        Ok(roots)
    }
}

/// The three files' contents.
#[derive(Debug, Clone)]
pub struct PemFiles {
    /// Certificate chain.
    pub cert: Vec<u8>,
    /// Private key.
    pub key: Vec<u8>,
    /// CA certificate(s).
    pub ca: Vec<u8>,
}

/// The crypto provider every Switchyard TLS endpoint uses (ring; no aws-lc in the build).
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The hub's server configuration: its own certificate, client certificates required and
/// verified against `ca.crt`, HTTP/2 only (gRPC).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = crypto_provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(files.roots()?), provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(TlsFiles::certs(&files.cert)?, files.private_key()?)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The cluster a (verified) client certificate speaks for: its one
/// `spiffe://switchyard/cluster/<name>` URI SAN.
pub fn cluster_of(cert: &CertificateDer<'_>) -> Result<String, TlsError> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, parsed) = X509Certificate::from_der(cert.as_ref()).map_err(|e| TlsError::Identity(e.to_string()))?;
    let names = parsed
        .subject_alternative_name()
        .map_err(|e| TlsError::Identity(e.to_string()))?
        .map(|ext| ext.value.general_names.clone())
        .unwrap_or_default();
    let clusters: Vec<&str> = names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(uri) => uri.strip_prefix(CLUSTER_URI_PREFIX),
            _ => None,
        })
        .collect();
    match clusters.as_slice() {
        [one] if is_dns_label(one) => Ok((*one).to_string()),
        [one] => Err(TlsError::Identity(format!("{CLUSTER_URI_PREFIX}{one} is not a valid cluster name"))),
        [] => Err(TlsError::Identity(format!("no {CLUSTER_URI_PREFIX}<name> URI SAN"))),
        _ => Err(TlsError::Identity(format!("more than one {CLUSTER_URI_PREFIX}<name> URI SAN"))),
    }
}

/// A DNS label (cluster and region names): lowercase letters, digits and `-`, 1 to 63 characters,
/// starting and ending with a letter or digit.
pub fn is_dns_label(name: &str) -> bool {
    let ok_edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (1..=63).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && ok_edge(name.chars().next())
        && ok_edge(name.chars().last())
}

/// The hub's server configuration, rebuilt when its files change.
#[derive(Debug)]
pub struct ReloadingServerConfig {
    files: TlsFiles,
    current: RwLock<(Option<SystemTime>, Arc<rustls::ServerConfig>)>,
}

impl ReloadingServerConfig {
    /// Loads the files once; fails if they are unusable now.
    pub fn load(files: TlsFiles) -> Result<ReloadingServerConfig, TlsError> {
        let stamp = files.stamp();
        let config = server_config(&files)?;
        Ok(ReloadingServerConfig { files, current: RwLock::new((stamp, config)) })
    }

    /// The configuration new handshakes use.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        match self.current.read() {
            Ok(c) => c.1.clone(),
            Err(poisoned) => poisoned.into_inner().1.clone(),
        }
    }

    /// Reloads if the files changed since the last successful load. `Ok(true)` when a new
    /// configuration is in use; an error leaves the previous one in place.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let stamp = self.files.stamp();
        let seen = self.current.read().map(|c| c.0).unwrap_or(None);
        if stamp.is_none() || stamp == seen {
            return Ok(false);
        }
        let config = server_config(&self.files)?;
        if let Ok(mut slot) = self.current.write() {
            *slot = (stamp, config);
        }
        Ok(true)
    }

    /// Checks the files every `interval` until `stop` fires.
    pub async fn watch(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = stop.cancelled() => return,
            }
            match self.reload_if_changed() {
                Ok(true) => tracing::info!(cert = %self.files.cert.display(), "hub certificate reloaded"),
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, "hub certificate files changed but cannot be used; keeping the previous ones")
                }
            }
        }
    }
}

/// The spoke's client configuration for tonic: its own certificate as the client identity,
/// `ca.crt` to verify the hub, and the name the hub's certificate must carry.
pub fn client_tls(pem: &PemFiles, hub_name: &str) -> tonic::transport::ClientTlsConfig {
    tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&pem.ca))
        .identity(tonic::transport::Identity::from_pem(&pem.cert, &pem.key))
        .domain_name(hub_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names_are_dns_labels() {
        for ok in ["east", "us-east-1", "a", "0a9"] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "East", "-east", "east-", "ea st", "ea/st", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }
}
