//! A development CA and the certificates a federation needs (`switchyard certs`).
//!
//! Layout under the output directory, one cert-manager-style directory per party:
//!
//! ```text
//! ca/ca.crt ca/ca.key                       the CA (kept to issue more later)
//! hub/tls.crt hub/tls.key hub/ca.crt        the hub's server certificate
//! clusters/<name>/tls.crt tls.key ca.crt    one client certificate per cluster
//! ```
//!
//! An existing `ca/` is reused, so clusters can be added later and keep trusting the same hub.
//! Keys are ECDSA P-256, written with mode 0600. For production, issue the same shapes from
//! cert-manager (see the hub's README); nothing here is needed at run time.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::tls::{TlsFiles, cluster_uri, is_dns_label};

/// Why certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Writing or reading a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Generation or signing failed, or the existing CA could not be read.
    #[error("certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// A cluster name is not a DNS label.
    #[error("cluster name {0:?}: lowercase letters, digits and '-', at most 63, not starting or ending with '-'")]
    ClusterName(String),
}

/// What [`generate`] wrote.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The CA certificate.
    pub ca_cert: PathBuf,
    /// Whether the CA was created now (not reused).
    pub ca_created: bool,
    /// The hub's files.
    pub hub: TlsFiles,
    /// Each cluster's files.
    pub clusters: Vec<(String, TlsFiles)>,
}

/// Creates (or reuses) the CA in `out/ca`, then the hub's certificate for `hub_hosts` (DNS
/// names or IP addresses) and one client certificate per cluster.
pub fn generate(out: &Path, hub_hosts: &[String], clusters: &[String]) -> Result<Issued, CertError> {
    for c in clusters {
        if !is_dns_label(c) {
            return Err(CertError::ClusterName(c.clone()));
        }
    }
    let ca_dir = out.join("ca");
    let (ca_cert_path, ca_key_path) = (ca_dir.join("ca.crt"), ca_dir.join("ca.key"));
    let ca_created = !(ca_cert_path.exists() && ca_key_path.exists());
    let (issuer, ca_pem) = if ca_created {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name("Switchyard development CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key)?;
        write(&ca_cert_path, cert.pem().as_bytes(), false)?;
        write(&ca_key_path, key.serialize_pem().as_bytes(), true)?;
        (Issuer::new(params, key), cert.pem())
    } else {
        let ca_pem = read(&ca_cert_path)?;
        let key = KeyPair::from_pem(&read(&ca_key_path)?)?;
        (Issuer::from_ca_cert_pem(&ca_pem, key)?, ca_pem)
    };

    let hub_sans = hub_hosts
        .iter()
        .map(|h| match h.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(h.as_str().try_into()?)),
        })
        .collect::<Result<Vec<_>, rcgen::Error>>()?;
    let hub =
        leaf(&out.join("hub"), "switchyard hub", hub_sans, ExtendedKeyUsagePurpose::ServerAuth, &issuer, &ca_pem)?;
    let mut issued = Vec::new();
    for c in clusters {
        let san = SanType::URI(cluster_uri(c).as_str().try_into()?);
        let files = leaf(
            &out.join("clusters").join(c),
            &format!("switchyard spoke {c}"),
            vec![san],
            ExtendedKeyUsagePurpose::ClientAuth,
            &issuer,
            &ca_pem,
        )?;
        issued.push((c.clone(), files));
    }
    Ok(Issued { ca_cert: ca_cert_path, ca_created, hub, clusters: issued })
}

fn name(common: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Switchyard");
    dn.push(DnType::CommonName, common);
    dn
}

/// One end-entity certificate, its key and the CA, in `dir`.
fn leaf(
    dir: &Path,
    common: &str,
    sans: Vec<SanType>,
    usage: ExtendedKeyUsagePurpose,
    issuer: &Issuer<'_, KeyPair>,
    ca_pem: &str,
) -> Result<TlsFiles, CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name(common);
    params.subject_alt_names = sans;
    params.extended_key_usages = vec![usage];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, issuer)?;
    let files = TlsFiles::in_dir(dir);
    write(&files.cert, cert.pem().as_bytes(), false)?;
    write(&files.key, key.serialize_pem().as_bytes(), true)?;
    write(&files.ca, ca_pem.as_bytes(), false)?;
    Ok(files)
}

fn read(path: &Path) -> Result<String, CertError> {
    std::fs::read_to_string(path).map_err(|source| CertError::Io { path: path.to_path_buf(), source })
}

/// Writes `path` whole (a temporary file renamed into place, so a reloader never reads half
/// a file), keys readable by the owner only.
fn write(path: &Path, contents: &[u8], secret: bool) -> Result<(), CertError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| CertError::Io { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io)?;
    file.write_all(contents).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{cluster_of, server_config};
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("switchyard-certs-{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string()).expect("temp dir");
        dir
    }

    fn rand_suffix() -> u128 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
    }

    #[test]
    fn issued_certificates_name_their_cluster_and_load_as_a_server() {
        let dir = tempdir();
        let issued = generate(&dir, &["localhost".into(), "127.0.0.1".into()], &["east".into(), "west".into()])
            .expect("certificates");
        assert!(issued.ca_created);
        for (cluster, files) in &issued.clusters {
            let cert = CertificateDer::from_pem_file(&files.cert).expect("pem");
            assert_eq!(&cluster_of(&cert).expect("identity"), cluster);
        }
        server_config(&issued.hub).expect("hub config");
        // The hub's own certificate names no cluster.
        let hub_cert = CertificateDer::from_pem_file(&issued.hub.cert).expect("pem");
        assert!(cluster_of(&hub_cert).is_err());

        // A second run reuses the CA: the first run's clusters still chain to it.
        let again = generate(&dir, &["localhost".into()], &["north".into()]).expect("again");
        assert!(!again.ca_created);
        assert_eq!(std::fs::read(&again.clusters[0].1.ca).ok(), std::fs::read(&issued.clusters[0].1.ca).ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_cluster_names_are_refused_before_anything_is_written() {
        let dir = tempdir();
        let err = generate(&dir, &["localhost".into()], &["East".into()]).err();
        assert!(matches!(err, Some(CertError::ClusterName(_))), "{err:?}");
        assert!(!dir.join("ca").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
