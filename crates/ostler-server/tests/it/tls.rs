//! TLS (rustls) with a certificate generated at test time.
#![allow(clippy::unwrap_used)] // test code

use ostler_engine::{Engine, EngineOptions};
use ostler_proto::v1 as pb;
use ostler_proto::v1::daemon_service_client::DaemonServiceClient;
use ostler_server::{DaemonInfo, Listener, Server, ServerOptions, TlsOptions};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

#[tokio::test]
async fn serves_tls_and_refuses_plaintext() {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_pem = cert.pem();
    let dir = tempfile::tempdir().unwrap();
    let store = ostler_store::Store::open(dir.path().join("o.db"), Default::default()).unwrap();
    let inst = ostler_supervisor::Installation::assume(
        "/nonexistent/claude".into(),
        semver::Version::new(2, 1, 330),
        None,
    );
    let engine = Engine::start(EngineOptions::default(), store, inst)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let opts = ServerOptions {
        tls: Some(TlsOptions {
            cert_pem: cert_pem.clone().into_bytes(),
            key_pem: signing_key.serialize_pem().into_bytes(),
            client_ca_pem: None,
        }),
        ..Default::default()
    };
    let server = tokio::spawn(Server::run(
        opts,
        engine,
        DaemonInfo::new("1", "o.db", Default::default()),
        vec![Listener::Tcp(listener)],
        shutdown.clone(),
    ));

    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&cert_pem))
        .domain_name("localhost");
    let ch = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let d = DaemonServiceClient::new(ch)
        .get_health_details(pb::GetHealthDetailsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.daemon_version, "1");

    // A plaintext HTTP/2 client gets nowhere.
    let plain = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(ostler_testkit::timeouts::secs(5))
        .connect()
        .await;
    if let Ok(ch) = plain {
        let r = DaemonServiceClient::new(ch)
            .get_health_details(pb::GetHealthDetailsRequest {})
            .await;
        assert!(
            r.is_err(),
            "plaintext call must fail against the TLS listener"
        );
    }
    shutdown.cancel();
    tokio::time::timeout(ostler_testkit::timeouts::secs(10), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// With a client CA configured, only clients presenting a certificate signed by it get in.
#[tokio::test]
async fn client_certificates_are_required_when_configured() {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa,
        KeyPair,
    };
    use tonic::transport::Identity;

    let server = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut client_params = CertificateParams::new(vec!["client-1".to_owned()]).unwrap();
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client_cert = client_params.signed_by(&client_key, &ca).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let store = ostler_store::Store::open(dir.path().join("o.db"), Default::default()).unwrap();
    let inst = ostler_supervisor::Installation::assume(
        "/nonexistent/claude".into(),
        semver::Version::new(2, 1, 330),
        None,
    );
    let engine = Engine::start(EngineOptions::default(), store, inst)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let opts = ServerOptions {
        tls: Some(TlsOptions {
            cert_pem: server.cert.pem().into_bytes(),
            key_pem: server.signing_key.serialize_pem().into_bytes(),
            client_ca_pem: Some(ca.pem().into_bytes()),
        }),
        ..Default::default()
    };
    let task = tokio::spawn(Server::run(
        opts,
        engine,
        DaemonInfo::new("1", "o.db", Default::default()),
        vec![Listener::Tcp(listener)],
        shutdown.clone(),
    ));

    let call = |identity: Option<Identity>| {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(server.cert.pem()))
            .domain_name("localhost");
        if let Some(id) = identity {
            tls = tls.identity(id);
        }
        async move {
            let ch = Channel::from_shared(format!("https://{addr}"))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            DaemonServiceClient::new(ch)
                .get_health_details(pb::GetHealthDetailsRequest {})
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    assert!(call(None).await.is_err(), "no client certificate: refused");
    let stranger = rcgen::generate_simple_self_signed(vec!["client-2".to_owned()]).unwrap();
    assert!(
        call(Some(Identity::from_pem(
            stranger.cert.pem(),
            stranger.signing_key.serialize_pem()
        )))
        .await
        .is_err(),
        "a certificate from another issuer: refused"
    );
    call(Some(Identity::from_pem(
        client_cert.pem(),
        client_key.serialize_pem(),
    )))
    .await
    .unwrap();

    shutdown.cancel();
    tokio::time::timeout(ostler_testkit::timeouts::secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
