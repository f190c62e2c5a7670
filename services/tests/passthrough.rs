//! What kcache does not answer itself reaches the API server unchanged, and its answer
//! reaches the client unchanged — judged against the same request sent to the API server:
//! - a WebSocket upgrade (how kubectl ≥ 1.31 runs exec, attach and port-forward) is relayed
//!   byte for byte once the API server switches protocols, and an upgrade it refuses gets
//!   its own answer;
//! - aggregated discovery (v2: the body depends on Accept, with an ETag and 304s);
//! - CBOR in Accept headers: whatever the API server makes of the q-values, kcache makes
//!   the same (never a 406 of its own).

mod support;

use std::net::{IpAddr, SocketAddr};

use base64::Engine;
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::{TestCluster, ADMIN_TOKEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// RFC 6455's `Sec-WebSocket-Accept` for `key`.
fn accept_of(key: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// This machine's address on its default route: the API server proxies only to
/// addresses that are not loopback (`IsProxyableIP`), so the WebSocket backend listens
/// there. No packet is sent: connecting a UDP socket only picks the route.
fn routable_ip() -> IpAddr {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind UDP");
    sock.connect("192.0.2.1:9")
        .expect("this machine has a route off loopback (the node-proxy test needs one)");
    let ip = sock.local_addr().expect("local address").ip();
    assert!(!ip.is_loopback(), "no address off loopback: {ip}");
    ip
}

/// A WebSocket backend: answers each handshake with 101 and its proper
/// `Sec-WebSocket-Accept`, then echoes every byte. Sends each request's head (path and
/// headers, lowercased names) on `heads`.
async fn websocket_echo(ip: IpAddr) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .expect("bind the WebSocket backend");
    let addr = listener.local_addr().expect("address");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if conn.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_lowercase();
                let key = head
                    .lines()
                    .find_map(|l| l.strip_prefix("sec-websocket-key:"))
                    .map(str::trim)
                    .unwrap_or("")
                    .to_string();
                let _ = tx.send(head);
                // The key was lowercased with the head: the accept is computed on the
                // original, which the client sends in base64 of its own case — so the
                // test uses a key that is all lowercase.
                let answer = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n",
                    accept_of(&key)
                );
                if conn.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, rx)
}

/// A Node whose InternalIP is `ip`: the API server's node proxy dials it.
async fn node_at(admin: &kube::Client, name: &str, ip: IpAddr) {
    use k8s_openapi::api::core::v1::Node;
    let nodes: kube::Api<Node> = kube::Api::all(admin.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).expect("a Node");
    nodes
        .create(&Default::default(), &node)
        .await
        .expect("create the Node");
    let status =
        json!({"status": {"addresses": [{"type": "InternalIP", "address": ip.to_string()}]}});
    nodes
        .patch_status(name, &Default::default(), &kube::api::Patch::Merge(&status))
        .await
        .expect("set the Node's address");
}

/// The handshake's answer: status, the headers a WebSocket client reads, and — when it
/// switched — what came back of `payload` written on the switched connection.
async fn handshake(
    base: &str,
    path: &str,
    key: &str,
    payload: &[u8],
) -> (u16, Vec<(String, String)>, Option<Vec<u8>>, Value) {
    let resp = support::insecure_http1()
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN_TOKEN)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", key)
        .header(
            "Sec-WebSocket-Protocol",
            "v5.channel.k8s.io, v4.channel.k8s.io",
        )
        .send()
        .await
        .expect("send the handshake");
    let code = resp.status().as_u16();
    let headers = [
        "upgrade",
        "sec-websocket-accept",
        "sec-websocket-protocol",
        "content-type",
    ]
    .iter()
    .filter_map(|h| {
        resp.headers().get(*h).map(|v| {
            (
                h.to_string(),
                String::from_utf8_lossy(v.as_bytes()).to_string(),
            )
        })
    })
    .collect();
    if code != 101 {
        let body = resp.bytes().await.expect("body");
        return (
            code,
            headers,
            None,
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        );
    }
    let mut conn = resp.upgrade().await.expect("the switched connection");
    conn.write_all(payload)
        .await
        .expect("write on the switched connection");
    let mut echoed = vec![0u8; payload.len()];
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        conn.read_exact(&mut echoed),
    )
    .await
    .expect("the echo within 10 s")
    .expect("read the echo");
    (code, headers, Some(echoed), Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_are_relayed_as_the_api_server_relays_them() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let admin = cluster.kube_client().await;
    let ip = routable_ip();
    let (backend, mut heads) = websocket_echo(ip).await;
    node_at(&admin, "ws-node", ip).await;
    let path = format!("/api/v1/nodes/http:ws-node:{}/proxy/echo", backend.port());
    // Every byte value, twice: nothing on the switched connection is interpreted.
    let payload: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
    // All lowercase (see `websocket_echo`), 16 bytes in base64 as RFC 6455 asks.
    let key = "dghlihnhbxbszsbub25jzq==";

    let direct = handshake(&cluster.url, &path, key, &payload).await;
    let direct_head = heads
        .recv()
        .await
        .expect("the API server reached the backend");
    let through = handshake(&k.url, &path, key, &payload).await;
    let through_head = heads
        .recv()
        .await
        .expect("kcache's request reached the backend");

    assert_eq!(
        direct.0, 101,
        "the API server switched protocols: {direct:?}"
    );
    assert_eq!(through, direct, "kcache's answer against the API server's");
    assert!(
        through
            .1
            .contains(&("sec-websocket-accept".into(), accept_of(key))),
        "the backend's accept reached the client: {:?}",
        through.1
    );
    assert_eq!(through.2.as_deref(), Some(&payload[..]), "the echo");
    // The backend saw the same handshake both times (kcache added or dropped nothing the
    // API server passes on).
    let handshake_lines = |head: &str| -> Vec<String> {
        let mut lines: Vec<String> = head
            .lines()
            .filter(|l| {
                l.starts_with("get ")
                    || l.starts_with("sec-websocket-")
                    || l.starts_with("upgrade:")
            })
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    };
    assert_eq!(
        handshake_lines(&through_head),
        handshake_lines(&direct_head)
    );
    assert!(
        handshake_lines(&direct_head).len() >= 4,
        "the handshake's lines: {direct_head}"
    );

    // An upgrade the API server refuses (exec into a pod that does not exist): its answer.
    let exec = "/api/v1/namespaces/default/pods/nope/exec?command=true&stdout=true";
    let direct = handshake(&cluster.url, exec, key, b"").await;
    let through = handshake(&k.url, exec, key, b"").await;
    assert_eq!(direct.0, 404, "{direct:?}");
    assert_eq!(through, direct, "a refused upgrade through kcache");

    // Another protocol kcache cannot relay (SPDY/3.1, kubectl's fallback): a clear 400.
    let resp = support::insecure_http1()
        .get(format!("{}{exec}", k.url))
        .bearer_auth(ADMIN_TOKEN)
        .header("Connection", "Upgrade")
        .header("Upgrade", "SPDY/3.1")
        .send()
        .await
        .expect("SPDY request");
    assert_eq!(resp.status().as_u16(), 400);
    let status: Value = resp.json().await.expect("a Status");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("WebSocket")),
        "{status}"
    );
}

/// One GET's status, the headers that matter to discovery clients, and the body.
async fn get(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, Option<String>, Vec<u8>) {
    let mut req = support::insecure_http()
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN_TOKEN);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = req.send().await.expect("GET");
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).to_string())
    };
    let (ct, etag) = (header("content-type"), header("etag"));
    let code = resp.status().as_u16();
    (code, ct, etag, resp.bytes().await.expect("body").to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_discovery_is_the_api_servers_own() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    const V2: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    for path in ["/api", "/apis"] {
        for accept in [V2, "application/json", "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"] {
            let direct = get(&cluster.url, path, &[("Accept", accept)]).await;
            let through = get(&k.url, path, &[("Accept", accept)]).await;
            assert_eq!(direct.0, 200, "{path} {accept}");
            assert_eq!(
                (&through.0, &through.1, &through.2),
                (&direct.0, &direct.1, &direct.2),
                "{path} Accept {accept}: status, content type and ETag"
            );
            let body = |b: &[u8]| serde_json::from_slice::<Value>(b).expect("JSON");
            assert_eq!(body(&through.3), body(&direct.3), "{path} Accept {accept}");
            // A client that has the document gets the API server's 304.
            if let Some(etag) = &direct.2 {
                let direct = get(&cluster.url, path, &[("Accept", accept), ("If-None-Match", etag)]).await;
                let through = get(&k.url, path, &[("Accept", accept), ("If-None-Match", etag)]).await;
                assert_eq!(direct.0, 304, "{path} {accept}");
                assert_eq!(through.0, direct.0, "{path} {accept} If-None-Match");
            }
        }
    }
    // The v2 document is what aggregated-discovery clients get, and it names the groups.
    let v2 = get(&k.url, "/apis", &[("Accept", V2)]).await;
    assert!(
        v2.1.as_deref()
            .is_some_and(|ct| ct.contains("apidiscovery.k8s.io")),
        "{:?}",
        v2.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cbor_in_accept_gets_the_api_servers_choice() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "cbor").await;
    support::http::put_secret(&admin, "cbor", "s1", "v").await;
    // Reads kcache serves from its cache (resourceVersion 0), a get and a list, under every
    // way a client may mention CBOR.
    let paths = [
        "/api/v1/namespaces/cbor/secrets/s1?resourceVersion=0",
        "/api/v1/namespaces/cbor/secrets?resourceVersion=0",
    ];
    let accepts = [
        "application/cbor",
        "application/cbor, application/json;q=0.9",
        "application/json, application/cbor;q=0.9",
        "application/cbor;q=0.5, application/json",
        "application/cbor;q=0, application/json",
        "application/cbor, application/vnd.kubernetes.protobuf;q=0.8, application/json;q=0.5",
        "application/cbor-seq, application/json;q=0.1",
    ];
    for path in paths {
        for accept in accepts {
            let direct = get(&cluster.url, path, &[("Accept", accept)]).await;
            let through = get(&k.url, path, &[("Accept", accept)]).await;
            assert_eq!(
                (through.0, &through.1),
                (direct.0, &direct.1),
                "{path} Accept {accept}: status and content type"
            );
            if direct
                .1
                .as_deref()
                .is_some_and(|ct| ct.starts_with("application/json"))
            {
                let body = |b: &[u8]| {
                    let mut v: Value = serde_json::from_slice(b).expect("JSON");
                    // A list's RV is the newest in the store: another write may land between.
                    if let Some(m) = v["metadata"].as_object_mut() {
                        m.remove("resourceVersion");
                    }
                    // kcache's list items keep the kind and apiVersion their watch events
                    // carried, where the API server's omit them (docs/security.md, a known
                    // difference of bytes, not of objects).
                    for item in v["items"].as_array_mut().into_iter().flatten() {
                        if let Some(o) = item.as_object_mut() {
                            o.remove("kind");
                            o.remove("apiVersion");
                        }
                    }
                    v
                };
                assert_eq!(body(&through.3), body(&direct.3), "{path} Accept {accept}");
            }
        }
    }
}
