//! The HTTPS client of a function instance's SDK client: the SDK's own
//! (hyper 1, rustls with aws-lc, certificates verified), trusting the
//! system's CA bundle file alone.
//!
//! The SDK's default client trusts what `rustls-native-certs` loads. With
//! neither `SSL_CERT_FILE` nor `SSL_CERT_DIR` set, as on Lambda, that is the
//! first CA bundle file found *and* every certificate directory that exists,
//! each file in them read and parsed. The directories hold no CA that the
//! bundle lacks: Debian's `/etc/ssl/certs` is the bundle's CAs again, one
//! file each (and the ssl-cert package's self-signed snakeoil certificate,
//! no CA), and Amazon Linux 2023's `/etc/pki/tls/certs` (Lambda's
//! `provided.al2023`) holds the bundle itself and its OpenSSL "trusted
//! certificate" form, which rustls skips. Reading them was most of the
//! functions' init beyond a hello-world's (issue 20).
//!
//! So where neither is set, [`https_client`] trusts the bundle alone: the
//! one the default reads first (the same `openssl-probe` list). Where
//! either is set, the SDK's default client is kept: it reads those, and
//! only those, as asked, the file once for all its connectors. So it is
//! where the bundle cannot be read, holds no certificate, or holds one that
//! rustls cannot take as a trust anchor: the SDK would panic on that
//! certificate, where its default skips it.
//!
//! The bundle is read and checked once, at cold start. The SDK parses it
//! again when it builds its connector, for the first request; not also when
//! the client is built, as its default client does to warm its cache of
//! the platform's certificates (a connector built and dropped, here a
//! second parse of the bundle for nothing).

use aws_sdk_dynamodb::config::{HttpClient, RuntimeComponents, SharedHttpClient};
use aws_smithy_http_client::Connector;
use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
use aws_smithy_http_client::tls::{Provider, TlsContext, TrustStore};
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{HttpConnectorSettings, SharedHttpConnector};
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::Duration;

/// The SDK's HTTPS client over the system's CA bundle (see the module
/// documentation), or `None` for the SDK's default client: `SSL_CERT_FILE`
/// or `SSL_CERT_DIR` is set, or no bundle was found or it is not usable
/// (logged).
pub(super) fn https_client() -> Option<SharedHttpClient> {
    https_client_with(|name| std::env::var_os(name))
}

/// [`https_client`] with the environment read through `lookup`.
fn https_client_with(lookup: impl Fn(&str) -> Option<OsString>) -> Option<SharedHttpClient> {
    let Some(path) = bundle_path(lookup) else {
        tracing::debug!(
            "trust store: the SDK's default (SSL_CERT_FILE or SSL_CERT_DIR set, or no CA bundle)"
        );
        return None;
    };
    bundle_client(&path)
}

/// The HTTPS client trusting the bundle at `path` alone, or `None` where it
/// is not usable (logged).
fn bundle_client(path: &Path) -> Option<SharedHttpClient> {
    match CaBundle::read(path) {
        Ok(bundle) => {
            tracing::debug!(
                bundle = %path.display(),
                certificates = bundle.certificates,
                "trust store: the CA bundle"
            );
            Some(SharedHttpClient::new(BundleClient::new(bundle)))
        }
        Err(e) => {
            tracing::warn!(
                bundle = %path.display(),
                error = %e,
                "CA bundle not usable: the SDK's default trust store instead"
            );
            None
        }
    }
}

/// The CA bundle to trust alone: with `SSL_CERT_FILE` and `SSL_CERT_DIR`,
/// as `lookup` reads them, unset or empty, the bundle that the SDK's
/// default would read first, if any; `None` where either is set.
fn bundle_path(lookup: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |name: &str| lookup(name).is_some_and(|v| !v.is_empty());
    if set("SSL_CERT_FILE") || set("SSL_CERT_DIR") {
        return None;
    }
    openssl_probe::probe().cert_file
}

/// Why a CA bundle is not used.
#[derive(Debug, thiserror::Error)]
enum BundleError {
    #[error("cannot read it: {0}")]
    Read(#[from] std::io::Error),
    #[error("certificate {index}: bad PEM: {error}")]
    Pem {
        index: usize,
        error: rustls::pki_types::pem::Error,
    },
    #[error("certificate {index}: not a trust anchor rustls can use: {error}")]
    Anchor { index: usize, error: rustls::Error },
    #[error("no certificate in it")]
    Empty,
}

/// A CA bundle in PEM whose every certificate is a usable trust anchor:
/// the SDK, which parses it again with the same calls, cannot fail on it.
#[derive(Debug)]
struct CaBundle {
    pem: Vec<u8>,
    certificates: usize,
}

impl CaBundle {
    /// Reads and checks the bundle at `path`.
    fn read(path: &Path) -> Result<CaBundle, BundleError> {
        CaBundle::from_pem(std::fs::read(path)?)
    }

    /// Checks `pem` as the SDK will use it (`aws-smithy-http-client`'s
    /// `rustls_root_certs`, which `expect`s both steps): every certificate
    /// section decoded, each added to a rustls root store. Other sections
    /// (keys, OpenSSL's `TRUSTED CERTIFICATE`) and text between sections
    /// are skipped, there as here.
    fn from_pem(pem: Vec<u8>) -> Result<CaBundle, BundleError> {
        let mut roots = RootCertStore::empty();
        for (i, cert) in CertificateDer::pem_slice_iter(&pem).enumerate() {
            let index = i + 1;
            let cert = cert.map_err(|error| BundleError::Pem { index, error })?;
            roots
                .add(cert)
                .map_err(|error| BundleError::Anchor { index, error })?;
        }
        if roots.is_empty() {
            return Err(BundleError::Empty);
        }
        Ok(CaBundle {
            certificates: roots.len(),
            pem,
        })
    }
}

/// The SDK's default HTTPS client (`aws-smithy-runtime`'s
/// `default_https_client`: rustls with aws-lc, the proxy of the
/// environment, one connector per timeout settings) with a trust store of
/// its own, whose connectors are built for requests only (see the module
/// documentation): `validate_base_client_config` is left at the trait's
/// default, which builds nothing.
#[derive(Debug)]
struct BundleClient {
    tls: TlsContext,
    connectors: RwLock<HashMap<Timeouts, SharedHttpConnector>>,
}

/// The connect and read timeouts of a connector's settings, by which the
/// SDK's client keys its connectors too.
type Timeouts = (Option<Duration>, Option<Duration>);

impl BundleClient {
    fn new(bundle: CaBundle) -> Self {
        let store = TrustStore::empty().with_pem_certificate(bundle.pem);
        BundleClient {
            tls: TlsContext::builder()
                .with_trust_store(store)
                .build()
                .expect("a TLS context of a trust store alone"),
            connectors: RwLock::default(),
        }
    }

    fn connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        let mut builder = Connector::builder()
            .connector_settings(settings.clone())
            .proxy_config(ProxyConfig::from_env());
        builder.set_sleep_impl(components.sleep_impl());
        SharedHttpConnector::new(
            builder
                .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
                .tls_context(self.tls.clone())
                .build(),
        )
    }
}

impl HttpClient for BundleClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        let key = (settings.connect_timeout(), settings.read_timeout());
        let cached = self
            .connectors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(connector) = cached {
            return connector;
        }
        self.connectors
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_insert_with(|| self.connector(settings, components))
            .clone()
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        Some(ConnectorMetadata::new("hyper", Some(Cow::Borrowed("1.x"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::config::retry::RetryConfig;
    use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::Arc;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/tls")
            .join(name)
    }

    fn pem(name: &str) -> Vec<u8> {
        std::fs::read(testdata(name)).unwrap()
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_bundle_is_the_one_the_default_reads_first_unless_a_variable_names_one() {
        let probed = openssl_probe::probe().cert_file;
        assert_eq!(bundle_path(env(&[])), probed);
        assert_eq!(
            bundle_path(env(&[("SSL_CERT_FILE", ""), ("SSL_CERT_DIR", "")])),
            probed,
            "empty is unset"
        );
        let file = testdata("ca.pem");
        let file = file.to_str().unwrap();
        assert_eq!(bundle_path(env(&[("SSL_CERT_FILE", file)])), None);
        assert_eq!(
            bundle_path(env(&[("SSL_CERT_DIR", "/etc/ssl/certs")])),
            None
        );
    }

    #[test]
    fn a_bundle_keeps_all_its_certificates_and_skips_what_is_not_one() {
        let mut bundle = b"# a comment before the first certificate\n".to_vec();
        bundle.extend(pem("ca.pem"));
        bundle.extend(
            b"-----BEGIN TRUSTED CERTIFICATE-----\nAAAA\n-----END TRUSTED CERTIFICATE-----\n",
        );
        bundle.extend(pem("localhost.key"));
        bundle.extend(pem("other-ca.pem"));
        let read = CaBundle::from_pem(bundle.clone()).unwrap();
        assert_eq!(read.certificates, 2);
        assert_eq!(read.pem, bundle, "handed to the SDK as read");
        assert_eq!(CaBundle::read(&testdata("ca.pem")).unwrap().certificates, 1);
    }

    #[test]
    fn a_bundle_the_sdk_would_panic_on_or_find_empty_is_not_used() {
        let missing = CaBundle::read(&testdata("no-such-bundle.pem"));
        assert!(matches!(missing, Err(BundleError::Read(_))), "{missing:?}");

        let mut no_anchor = pem("ca.pem");
        // Well-formed PEM of bytes that are no certificate.
        no_anchor.extend(
            b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        );
        let no_anchor = CaBundle::from_pem(no_anchor);
        assert!(
            matches!(no_anchor, Err(BundleError::Anchor { index: 2, .. })),
            "{no_anchor:?}"
        );

        let mut truncated = pem("ca.pem");
        truncated.extend(b"-----BEGIN CERTIFICATE-----\nMIIB\n");
        let truncated = CaBundle::from_pem(truncated);
        assert!(
            matches!(truncated, Err(BundleError::Pem { index: 2, .. })),
            "{truncated:?}"
        );

        let empty = CaBundle::from_pem(pem("localhost.key"));
        assert!(matches!(empty, Err(BundleError::Empty)), "{empty:?}");
    }

    #[test]
    fn an_unusable_bundle_leaves_the_sdk_default() {
        assert!(bundle_client(&testdata("ca.pem")).is_some());
        assert!(bundle_client(&testdata("no-such-bundle.pem")).is_none());
        assert!(bundle_client(&testdata("localhost.key")).is_none());
    }

    /// A TLS server on 127.0.0.1 with the certificate `ca.pem` signed for
    /// it, answering every request with an empty DynamoDB `ListTables`.
    fn server() -> u16 {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let chain = vec![CertificateDer::from_pem_slice(&pem("localhost.pem")).unwrap()];
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&pem("localhost.key")).unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let conn = rustls::ServerConnection::new(config.clone()).unwrap();
                // A client that does not trust the certificate ends the
                // handshake: that connection's I/O fails, the next is served.
                let _ = answer(rustls::StreamOwned::new(conn, tcp));
            }
        });
        port
    }

    fn answer(
        tls: rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>,
    ) -> std::io::Result<()> {
        let mut reader = BufReader::new(tls);
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let line = line.trim_end().to_ascii_lowercase();
            if line.is_empty() {
                break;
            }
            if let Some(v) = line.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        reader.read_exact(&mut vec![0; length])?;
        let body = r#"{"TableNames":[]}"#;
        let mut tls = reader.into_inner();
        write!(
            tls,
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )?;
        tls.flush()?;
        tls.conn.send_close_notify();
        tls.flush()
    }

    /// `ListTables` on the server over HTTPS with the client of the bundle
    /// `bundle`.
    async fn list_tables(port: u16, bundle: &Path) -> Result<(), String> {
        let http = bundle_client(bundle).expect("the bundle is used");
        let conf = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("AKIDTEST", "test", None, None, "test"))
            .endpoint_url(format!("https://127.0.0.1:{port}"))
            .http_client(http)
            .retry_config(RetryConfig::standard().with_max_attempts(1))
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(20))
                    .build(),
            )
            .build();
        match aws_sdk_dynamodb::Client::from_conf(conf)
            .list_tables()
            .send()
            .await
        {
            Ok(out) => {
                assert_eq!(out.table_names(), &[] as &[String]);
                Ok(())
            }
            Err(e @ SdkError::DispatchFailure(_)) => Err(DisplayErrorContext(e).to_string()),
            Err(e) => panic!("not a connection failure: {}", DisplayErrorContext(e)),
        }
    }

    #[tokio::test]
    async fn the_client_trusts_the_bundle_and_verifies_the_server_against_it() {
        let port = server();
        list_tables(port, &testdata("ca.pem"))
            .await
            .expect("a server whose CA is in the bundle is trusted");
        let refused = list_tables(port, &testdata("other-ca.pem"))
            .await
            .expect_err("a server whose CA is not in the bundle is refused");
        assert!(refused.contains("UnknownIssuer"), "{refused}");
    }
}
