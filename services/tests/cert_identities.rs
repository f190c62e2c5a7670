//! Client-certificate identities, differentially: the same certificate (signed by the CA
//! both trust) and the same request to the API server and to kcache, for every subject
//! shape Go reads in its own way — several common names (the last one is the user), an
//! empty one (no identity: anonymous), several organizations, a UID attribute (one: the
//! user's UID; two: authentication fails, a token may still succeed), T.61 and BMP
//! strings, and a string type Go refuses (the handshake fails on both). A node's
//! certificate with two names acts as the node the API server names, and only as it.

mod support;

use std::path::Path;

use rcgen::{CertificateParams, DnType, DnValue, ExtendedKeyUsagePurpose, Issuer, KeyPair};
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::{create_as_admin, TestCluster, ADMIN_TOKEN};

const CN: &[u64] = &[2, 5, 4, 3];
const O: &[u64] = &[2, 5, 4, 10];
const UID: &[u64] = &[1, 3, 6, 1, 4, 1, 57683, 2];

/// A client certificate signed by the cluster's client CA with `subject` in order; the
/// certificate and key as one PEM, for reqwest.
fn client_cert(ca_dir: &Path, subject: &[(&[u64], DnValue)]) -> String {
    let ca_pem = std::fs::read_to_string(ca_dir.join("ca.crt")).expect("CA certificate");
    let ca_key =
        KeyPair::from_pem(&std::fs::read_to_string(ca_dir.join("ca.key")).expect("CA key"))
            .expect("the CA key");
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).expect("the CA");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.distinguished_name = rcgen::DistinguishedName::new();
    // rcgen keeps one value per type: a second CN (or O) is the same OID written as a
    // custom type, which it keeps apart and encodes the same.
    let mut seen = std::collections::BTreeSet::new();
    for (oid, value) in subject {
        let ty = match (*oid, seen.insert(oid.to_vec())) {
            (o, true) if o == CN => DnType::CommonName,
            (o, true) if o == O => DnType::OrganizationName,
            (o, _) => DnType::CustomDnType(o.to_vec()),
        };
        params.distinguished_name.push(ty, value.clone());
    }
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &issuer).expect("sign");
    format!("{}{}", cert.pem(), key.serialize_pem())
}

/// A GET with `identity` (and `token`, if any): status and Status message, or `None`
/// when the TLS handshake failed.
async fn get(base: &str, path: &str, identity: &str, token: Option<&str>) -> Option<(u16, String)> {
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .identity(reqwest::Identity::from_pem(identity.as_bytes()).expect("identity"))
        .build()
        .expect("client");
    let mut req = client.get(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.ok()?;
    let code = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    Some((code, body["message"].as_str().unwrap_or("").to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_identities_are_the_api_servers() {
    let cluster = TestCluster::start().await;
    let ca = cluster.client_ca.display().to_string();
    let ca_dir = cluster.client_ca.parent().expect("pki dir").to_path_buf();
    let k = Kcache::start_with_args(
        &cluster,
        "[auth]\nimpersonate_cert_users = true\n",
        &["--client-ca-file", &ca],
    )
    .await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "ids").await;
    create_as_admin(
        &cluster,
        "/api/v1/namespaces/ids/configmaps",
        json!({"metadata": {"name": "cm1"}, "data": {"v": "1"}}),
    )
    .await;
    create_as_admin(
        &cluster,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/ids/roles",
        json!({"metadata": {"name": "read"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}),
    )
    .await;
    create_as_admin(
        &cluster,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/ids/rolebindings",
        json!({
            "metadata": {"name": "read"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"},
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "dave"},
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "g2"},
            ],
        }),
    )
    .await;

    let utf8 = |s: &str| DnValue::Utf8String(s.into());
    let cms = "/api/v1/namespaces/ids/configmaps?resourceVersion=0";
    let node2_pods = "/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode2";
    // rcgen keeps one value per custom type: two UIDs come from openssl.
    let two_uids = {
        let (crt, key) =
            cluster.issue_client_cert_with_subject("two-uids", "/CN=dave/k8sUID=u-1/k8sUID=u-2");
        let read = |p: &Path| std::fs::read_to_string(p).expect("PEM");
        format!("{}{}", read(&crt), read(&key))
    };
    // (shape, subject, path, token, what the API server answers)
    type Case<'a> = (
        &'a str,
        Vec<(&'a [u64], DnValue)>,
        &'a str,
        Option<&'a str>,
        Option<u16>,
    );
    let cases: Vec<Case> = vec![
        ("one CN", vec![(CN, utf8("bob"))], cms, None, Some(200)),
        (
            "two CNs: the last is the user",
            vec![(CN, utf8("alice")), (CN, utf8("bob"))],
            cms,
            None,
            Some(200),
        ),
        (
            "two CNs, the other order",
            vec![(CN, utf8("bob")), (CN, utf8("alice"))],
            cms,
            None,
            Some(403),
        ),
        (
            "an empty last CN: anonymous",
            vec![(CN, utf8("bob")), (CN, utf8(""))],
            cms,
            None,
            Some(403),
        ),
        (
            "no CN: anonymous, its groups unused",
            vec![(O, utf8("g2"))],
            cms,
            None,
            Some(403),
        ),
        (
            "several organizations",
            vec![(CN, utf8("carol")), (O, utf8("g1")), (O, utf8("g2"))],
            cms,
            None,
            Some(200),
        ),
        (
            "a UID",
            vec![(CN, utf8("dave")), (UID, utf8("u-1"))],
            cms,
            None,
            Some(200),
        ),
        (
            "two UIDs: authentication fails",
            vec![],
            cms,
            None,
            Some(401),
        ),
        (
            "two UIDs and a token: the token decides",
            vec![],
            cms,
            Some(ADMIN_TOKEN),
            Some(200),
        ),
        (
            "a CN and a token: the certificate decides",
            vec![(CN, utf8("alice"))],
            cms,
            Some(ADMIN_TOKEN),
            Some(403),
        ),
        (
            "a T.61 CN",
            vec![(
                CN,
                DnValue::TeletexString(rcgen::string::TeletexString::try_from("bob").expect("T61")),
            )],
            cms,
            None,
            Some(200),
        ),
        (
            "a BMP CN",
            vec![(
                CN,
                DnValue::BmpString(rcgen::string::BmpString::try_from("bob").expect("BMP")),
            )],
            cms,
            None,
            Some(200),
        ),
        (
            "a UniversalString CN: Go refuses the certificate",
            vec![(
                CN,
                DnValue::UniversalString(
                    rcgen::string::UniversalString::try_from("bob").expect("UCS-4"),
                ),
            )],
            cms,
            None,
            None,
        ),
        (
            "node2 by its own certificate",
            vec![(O, utf8("system:nodes")), (CN, utf8("system:node:node2"))],
            node2_pods,
            None,
            Some(200),
        ),
        (
            "node1 asking for node2's pods",
            vec![(O, utf8("system:nodes")), (CN, utf8("system:node:node1"))],
            node2_pods,
            None,
            Some(403),
        ),
        (
            "two node names: the last one",
            vec![
                (O, utf8("system:nodes")),
                (CN, utf8("system:node:node1")),
                (CN, utf8("system:node:node2")),
            ],
            node2_pods,
            None,
            Some(200),
        ),
        (
            "two node names, the other order",
            vec![
                (O, utf8("system:nodes")),
                (CN, utf8("system:node:node2")),
                (CN, utf8("system:node:node1")),
            ],
            node2_pods,
            None,
            Some(403),
        ),
    ];
    for (what, subject, path, token, want) in cases {
        let identity = if subject.is_empty() {
            two_uids.clone()
        } else {
            client_cert(&ca_dir, &subject)
        };
        let direct = get(&cluster.url, path, &identity, token).await;
        let through = get(&k.url, path, &identity, token).await;
        assert_eq!(
            direct.as_ref().map(|d| d.0),
            want,
            "{what}: the API server's answer {direct:?}"
        );
        assert_eq!(through, direct, "{what}: kcache against the API server");
    }
    // The shapes were read from kcache's cache (the differences would be there), not
    // forwarded: configmaps and pods keys exist.
    let keys = k.debug_keys().await.to_string();
    assert!(keys.contains("/api/v1/namespaces/ids/configmaps"), "{keys}");
}
