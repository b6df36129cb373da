//! The federation listener over real TLS on loopback: who gets in, who is refused, and how a
//! cluster's liveness follows its stream. The "spoke" here is a bare tonic client speaking the
//! protocol, so each refusal can be provoked exactly; the real spoke is exercised end to end
//! in `e2e/tests/test_federation.py`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use switchyard_hub::{Hub, HubConfig};
use switchyard_proto::dev_certs;
use switchyard_proto::tls::{TlsFiles, client_tls};
use switchyard_proto::v1::federation_client::FederationClient;
use switchyard_proto::v1::{
    Hello, HubMessage, LoadReport, SpokeMessage, WorkerSetInfo, WorkerSetLoad, hub_message, spoke_message,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn tempdir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("switchyard-hub-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn certs(dir: &Path, clusters: &[&str]) -> dev_certs::Issued {
    let clusters: Vec<String> = clusters.iter().map(|c| c.to_string()).collect();
    dev_certs::generate(dir, &["localhost".into(), "127.0.0.1".into()], &clusters).expect("certificates")
}

fn files_of<'a>(issued: &'a dev_certs::Issued, cluster: &str) -> &'a TlsFiles {
    &issued.clusters.iter().find(|(c, _)| c == cluster).expect("cluster issued").1
}

async fn start_hub(tls: TlsFiles) -> Hub {
    Hub::start(HubConfig {
        load_interval: Duration::from_millis(100),
        lost_after: Duration::from_millis(600),
        cert_reload_interval: Duration::from_millis(100),
        ..HubConfig::loopback(tls)
    })
    .await
    .expect("hub starts")
}

fn hello(cluster: &str) -> Hello {
    Hello {
        cluster: cluster.into(),
        region: "eu-west".into(),
        worker_sets: vec![WorkerSetInfo {
            name: format!("{cluster}-llama"),
            served_model: "llama".into(),
            kv_block_size: 16,
            workers: 3,
            coarse_block_factor: 16,
        }],
        agent_version: "test".into(),
        front_door_url: "http://127.0.0.1:1".into(),
    }
}

fn report(cluster: &str, sequence: u64, kv: f64) -> SpokeMessage {
    SpokeMessage {
        kind: Some(spoke_message::Kind::Load(LoadReport {
            sequence,
            worker_sets: vec![WorkerSetLoad {
                worker_set: format!("{cluster}-llama"),
                healthy_workers: 3,
                kv_usage_percent_mean: kv,
                kv_capacity_blocks: 3000,
                ..Default::default()
            }],
        })),
    }
}

/// An open session: the sender of the spoke's messages and the hub's replies.
struct Session {
    tx: mpsc::Sender<SpokeMessage>,
    /// Held open: dropping the hub's side of the stream ends the session.
    _inbound: tonic::Streaming<HubMessage>,
}

/// Dials `hub` with `files` and says `hello`; the error is whatever refused it (the
/// handshake, the call, or the hub's first message).
async fn open(hub: &Hub, files: &TlsFiles, hello: Hello) -> Result<(Session, u32), String> {
    let pem = files.read_pem().map_err(|e| e.to_string())?;
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", hub.addr))
        .and_then(|e| e.tls_config(client_tls(&pem, "localhost")))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let (tx, rx) = mpsc::channel(8);
    tx.send(SpokeMessage { kind: Some(spoke_message::Kind::Hello(hello)) }).await.map_err(|e| e.to_string())?;
    let mut inbound = FederationClient::new(channel)
        .link(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    match inbound.message().await {
        Ok(Some(HubMessage { kind: Some(hub_message::Kind::Welcome(w)) })) => {
            Ok((Session { tx, _inbound: inbound }, w.load_interval_ms))
        }
        Ok(other) => Err(format!("unexpected first message {other:?}")),
        Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
    }
}

async fn metrics(hub: &Hub) -> String {
    reqwest::get(format!("http://{}/metrics", hub.admin_addr)).await.expect("metrics").text().await.expect("body")
}

async fn wait_until(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < deadline, "{what}: not within {deadline:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t0.elapsed()
}

#[tokio::test]
async fn a_spoke_with_its_clusters_certificate_reports_and_is_live() {
    let dir = tempdir("ok");
    let issued = certs(&dir, &["east", "west"]);
    let hub = start_hub(issued.hub.clone()).await;
    let (east, interval) = open(&hub, files_of(&issued, "east"), hello("east")).await.expect("east admitted");
    assert_eq!(interval, 100, "the welcome carries the hub's report interval");
    assert!(hub.fleet.live(Instant::now()).is_empty(), "a hello alone says nothing of load");
    east.tx.send(report("east", 1, 42.5)).await.expect("report");
    wait_until("east live", Duration::from_secs(5), || !hub.fleet.live(Instant::now()).is_empty()).await;
    let live = hub.fleet.live(Instant::now());
    assert_eq!(live[0].cluster, "east");
    assert_eq!(live[0].region, "eu-west");
    assert_eq!(live[0].worker_sets[0].workers, 3);
    assert_eq!(live[0].load[0].kv_capacity_blocks, 3000);
    assert_eq!(live[0].load[0].kv_usage_percent_mean, 42.5);

    let status: serde_json::Value =
        reqwest::get(format!("http://{}/status", hub.admin_addr)).await.expect("status").json().await.expect("json");
    assert_eq!(status["liveClusters"], serde_json::json!(["east"]));
    assert_eq!(status["clusters"][0]["workerSets"][0]["load"]["kvUsagePercentMean"], 42.5);
    let text = metrics(&hub).await;
    assert!(text.contains(r#"switchyard_hub_spoke_sessions_total{cluster="east"} 1"#), "{text}");
    assert!(text.contains(r#"switchyard_hub_clusters{state="live"} 1"#), "{text}");
    drop(east);
    hub.shutdown().await;
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_at_the_handshake() {
    let dir = tempdir("ca");
    let issued = certs(&dir, &["east"]);
    let rogue = certs(&tempdir("rogue"), &["east"]);
    let hub = start_hub(issued.hub.clone()).await;
    // The rogue spoke trusts the real hub (its ca.crt is the hub's CA), but its own
    // certificate, though it names "east", was signed by another CA.
    let forged = TlsFiles { ca: issued.hub.ca.clone(), ..files_of(&rogue, "east").clone() };
    let refused = open(&hub, &forged, hello("east")).await;
    assert!(refused.is_err(), "a certificate from another CA was admitted");
    assert!(hub.fleet.live(Instant::now()).is_empty());
    assert_eq!(hub.fleet.connected(), 0);
    let text = metrics(&hub).await;
    assert!(text.contains(r#"switchyard_hub_spoke_refused_total{reason="tls"} 1"#), "{text}");
    // The real east is still admitted afterwards.
    open(&hub, files_of(&issued, "east"), hello("east")).await.expect("east admitted");
    hub.shutdown().await;
}

#[tokio::test]
async fn a_spoke_claiming_another_cluster_is_permission_denied() {
    let dir = tempdir("claim");
    let issued = certs(&dir, &["east", "west"]);
    let hub = start_hub(issued.hub.clone()).await;
    let refused = open(&hub, files_of(&issued, "east"), hello("west")).await.err().expect("refused");
    assert!(refused.starts_with("PermissionDenied"), "{refused}");
    assert!(refused.contains("\"east\"") && refused.contains("\"west\""), "the error names both: {refused}");
    assert_eq!(hub.fleet.connected(), 0);
    let text = metrics(&hub).await;
    assert!(text.contains(r#"switchyard_hub_spoke_refused_total{reason="cluster_mismatch"} 1"#), "{text}");
    // A malformed hello is refused too.
    let mut bad = hello("east");
    bad.worker_sets[0].kv_block_size = 0;
    let refused = open(&hub, files_of(&issued, "east"), bad).await.err().expect("refused");
    assert!(refused.starts_with("InvalidArgument") && refused.contains("kv_block_size"), "{refused}");
    hub.shutdown().await;
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let dir = tempdir("anon");
    let issued = certs(&dir, &["east"]);
    let hub = start_hub(issued.hub.clone()).await;
    let ca = std::fs::read(&issued.hub.ca).expect("ca");
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .domain_name("localhost");
    let outcome = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", hub.addr))
            .map_err(|e| e.to_string())?
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel(1);
        tx.send(SpokeMessage { kind: Some(spoke_message::Kind::Hello(hello("east"))) })
            .await
            .map_err(|e| e.to_string())?;
        let mut inbound =
            FederationClient::new(channel).link(ReceiverStream::new(rx)).await.map_err(|s| s.to_string())?.into_inner();
        inbound.message().await.map_err(|s| s.to_string())
    }
    .await;
    assert!(outcome.is_err(), "admitted without a client certificate: {outcome:?}");
    assert_eq!(hub.fleet.connected(), 0);
    hub.shutdown().await;
}

#[tokio::test]
async fn a_silent_spoke_stops_being_chosen_and_a_closed_one_at_once() {
    let dir = tempdir("loss");
    let issued = certs(&dir, &["east", "west"]);
    let hub = start_hub(issued.hub.clone()).await;
    let (east, _) = open(&hub, files_of(&issued, "east"), hello("east")).await.expect("east");
    let (west, _) = open(&hub, files_of(&issued, "west"), hello("west")).await.expect("west");
    east.tx.send(report("east", 1, 10.0)).await.expect("report");
    west.tx.send(report("west", 1, 10.0)).await.expect("report");
    wait_until("both live", Duration::from_secs(5), || hub.fleet.live(Instant::now()).len() == 2).await;

    // East keeps its stream open but stops reporting: out of choice after lost_after (600 ms).
    let t0 = Instant::now();
    let mut seq = 1;
    while hub.fleet.live(Instant::now()).iter().any(|c| c.cluster == "east") {
        seq += 1;
        west.tx.send(report("west", seq, 10.0)).await.expect("report");
        assert!(t0.elapsed() < Duration::from_secs(3), "a silent cluster stayed choosable");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(t0.elapsed() >= Duration::from_millis(500), "dropped before lost_after: {:?}", t0.elapsed());
    assert_eq!(hub.fleet.connected(), 2, "silent, still connected");
    // A report brings it back.
    east.tx.send(report("east", 2, 10.0)).await.expect("report");
    wait_until("east back", Duration::from_secs(2), || hub.fleet.live(Instant::now()).len() == 2).await;

    // West closes its stream: gone from choice at once, not after lost_after.
    drop(west);
    let took = wait_until("west gone", Duration::from_secs(2), || hub.fleet.connected() == 1).await;
    assert!(hub.fleet.live(Instant::now()).iter().all(|c| c.cluster != "west"));
    assert!(took < Duration::from_millis(600), "{took:?}");
    drop(east);
    hub.shutdown().await;
}

#[tokio::test]
async fn the_hub_picks_up_rotated_certificates_for_new_handshakes() {
    let dir = tempdir("rotate");
    let issued = certs(&dir, &["east"]);
    let hub = start_hub(issued.hub.clone()).await;
    let (old_session, _) = open(&hub, files_of(&issued, "east"), hello("east")).await.expect("east");

    // A new CA is rolled out: the hub's files are replaced by ones from it.
    let next = certs(&tempdir("rotate-next"), &["east"]);
    for (from, to) in
        [(&next.hub.cert, &issued.hub.cert), (&next.hub.key, &issued.hub.key), (&next.hub.ca, &issued.hub.ca)]
    {
        let tmp = to.with_extension("new");
        std::fs::copy(from, &tmp).expect("copy");
        std::fs::rename(&tmp, to).expect("rename");
    }
    // Spokes with the new CA's certificates get in once the hub has reloaded; the old ones
    // are refused from then on.
    let t0 = Instant::now();
    loop {
        if open(&hub, files_of(&next, "east"), hello("east")).await.is_ok() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "the rotated certificates were not picked up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(open(&hub, files_of(&issued, "east"), hello("east")).await.is_err(), "the old CA still admitted");
    drop(old_session);
    hub.shutdown().await;
}
