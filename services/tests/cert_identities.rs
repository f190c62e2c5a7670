//! Client-certificate identities, differentially: the same certificate (signed by the CA
//! both trust) and the same request to the API server and to kcache, for every subject
//! shape Go reads in its own way — several common names (the last one is the user), an
//! empty one (no identity: anonymous), several organizations, a UID attribute (one: the
//! user's UID; two: authentication fails, a token may still succeed), T.61 and BMP
//! strings, and a string type Go refuses (the handshake fails on both). A node's
//! certificate with two names acts as the node the API server names, and only as it.
//!
//! Then the class: seeded, generated subjects (attribute types, orders, repeats, values
//! and string types drawn at random, with or without a token) to both servers, which
//! must answer alike. `KCACHE_CERT_SEED` replays a run, `KCACHE_CERT_CASES` sets its size.

mod support;

use std::path::Path;

use rcgen::{CertificateParams, DnType, DnValue, ExtendedKeyUsagePurpose, Issuer, KeyPair};
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::rng::Rng;
use support::{create_as_admin, TestCluster, ADMIN_TOKEN};

const CN: &[u64] = &[2, 5, 4, 3];
const O: &[u64] = &[2, 5, 4, 10];
const UID: &[u64] = &[1, 3, 6, 1, 4, 1, 57683, 2];
const OU: &[u64] = &[2, 5, 4, 11];
const L: &[u64] = &[2, 5, 4, 7];

/// Generated cases per run (`KCACHE_CERT_CASES`).
const DEFAULT_CASES: u64 = 48;

/// Values a subject attribute takes: the users and groups the cluster binds, node names,
/// privileged groups, and near misses (case, spaces, non-ASCII, control characters).
const VALUES: &[&str] = &[
    "bob",
    "alice",
    "carol",
    "dave",
    "",
    "system:node:node1",
    "system:node:node2",
    "system:nodes",
    "g2",
    "system:masters",
    "system:authenticated",
    "system:anonymous",
    "system:unauthenticated",
    "Bob",
    "bob ",
    " bob",
    "b\u{f8}b",
    "b\u{0}b",
    "bob\n",
    "\u{263a}",
];

/// One generated subject: attributes in order, each with a string type Go may or may not
/// read. rcgen keeps one value per attribute type, two for CN and O (the second written
/// as a custom type), so repeats past that are skipped.
#[allow(clippy::type_complexity)]
fn generated_subject(
    rng: &mut Rng,
) -> (
    String,
    Vec<(&'static [u64], DnValue)>,
    Vec<(&'static [u64], &'static str)>,
) {
    let mut subject = Vec::new();
    let mut plain = Vec::new();
    let mut described = Vec::new();
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..rng.below(5) {
        let (oid, name, most): (&'static [u64], &str, usize) = match rng.below(10) {
            0..=3 => (CN, "CN", 2),
            4..=6 => (O, "O", 2),
            7 => (UID, "UID", 1),
            8 => (OU, "OU", 1),
            _ => (L, "L", 1),
        };
        let seen = counts.entry(name).or_insert(0usize);
        if *seen == most {
            continue;
        }
        *seen += 1;
        let value = rng.pick(VALUES);
        let (kind, dn) = match rng.below(20) {
            0..=2 => (
                "printable",
                rcgen::string::PrintableString::try_from(value).map(DnValue::PrintableString),
            ),
            3..=4 => (
                "t61",
                rcgen::string::TeletexString::try_from(value).map(DnValue::TeletexString),
            ),
            5..=6 => (
                "bmp",
                rcgen::string::BmpString::try_from(value).map(DnValue::BmpString),
            ),
            7 => (
                "ia5",
                rcgen::string::Ia5String::try_from(value).map(DnValue::Ia5String),
            ),
            8 => (
                "universal",
                rcgen::string::UniversalString::try_from(value).map(DnValue::UniversalString),
            ),
            _ => ("utf8", Ok(DnValue::Utf8String(value.into()))),
        };
        // A value the type cannot carry is written as UTF-8.
        let (kind, dn) = match dn {
            Ok(dn) => (kind, dn),
            Err(_) => ("utf8", DnValue::Utf8String(value.into())),
        };
        described.push(format!("{name}={value:?}/{kind}"));
        subject.push((oid, dn));
        plain.push((oid, value));
    }
    (format!("[{}]", described.join(", ")), subject, plain)
}

/// Whether kcache may refuse to forward this subject's identity (its documented
/// difference): the user Go names (the last CN, when not empty) or one of its groups (the
/// O values) cannot ride in an HTTP header unchanged, or the user is `system:anonymous`
/// without `system:unauthenticated` (which the API server adds to it when impersonated).
fn header_cannot_carry(subject: &[(&'static [u64], &'static str)]) -> bool {
    let unsafe_value = |s: &str| {
        s.starts_with([' ', '\t'])
            || s.ends_with([' ', '\t'])
            || s.chars().any(|c| (c < ' ' && c != '\t') || c == '\u{7f}')
    };
    let user = subject.iter().rev().find(|(oid, _)| *oid == CN);
    match user {
        Some((_, u)) if !u.is_empty() => {
            let groups: Vec<&str> = subject
                .iter()
                .filter(|(oid, _)| *oid == O)
                .map(|(_, v)| *v)
                .collect();
            unsafe_value(u)
                || groups.iter().any(|g| unsafe_value(g))
                || (*u == "system:anonymous" && !groups.contains(&"system:unauthenticated"))
        }
        _ => false,
    }
}

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
    // Every authenticated user may get cm1: a certificate whose groups lack
    // system:authenticated (a user named system:anonymous, a group system:unauthenticated)
    // may not.
    create_as_admin(
        &cluster,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/ids/roles",
        json!({"metadata": {"name": "get-cm1"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cm1"], "verbs": ["get"]}]}),
    )
    .await;
    create_as_admin(
        &cluster,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/ids/rolebindings",
        json!({
            "metadata": {"name": "get-cm1"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "get-cm1"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}],
        }),
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
                // A service account's group: a certificate naming the account has none.
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:serviceaccounts:ids"},
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
            "a node's name without the nodes group is no node",
            vec![(CN, utf8("system:node:node2"))],
            "/api/v1/nodes/node2",
            None,
            Some(403),
        ),
        (
            "a service account's name without its groups",
            vec![(CN, utf8("system:serviceaccount:ids:default"))],
            cms,
            None,
            Some(403),
        ),
        (
            "a user named system:anonymous is not authenticated",
            vec![(CN, utf8("system:anonymous"))],
            "/api/v1/namespaces/ids/configmaps/cm1",
            None,
            Some(403),
        ),
        (
            "a group system:unauthenticated: no system:authenticated",
            vec![(CN, utf8("carol")), (O, utf8("system:unauthenticated"))],
            "/api/v1/namespaces/ids/configmaps/cm1",
            None,
            Some(403),
        ),
        (
            "an ordinary user is authenticated",
            vec![(CN, utf8("carol"))],
            "/api/v1/namespaces/ids/configmaps/cm1",
            None,
            Some(200),
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
    // A node name with a trailing space is another user to the API server; sent as a
    // header it would arrive trimmed, as node2. kcache refuses to forward it.
    let spaced = client_cert(
        &ca_dir,
        &[(O, utf8("system:nodes")), (CN, utf8("system:node:node2 "))],
    );
    let node2 = "/api/v1/nodes/node2";
    let direct = get(&cluster.url, node2, &spaced, None).await;
    let through = get(&k.url, node2, &spaced, None).await;
    assert_eq!(direct.as_ref().map(|d| d.0), Some(403), "{direct:?}");
    assert!(
        through.as_ref().is_some_and(|(code, msg)| *code == 403
            && msg.starts_with("kcache cannot forward user \"system:node:node2 \"")),
        "a trailing space: {through:?}"
    );

    // The class: generated subjects, each to both servers.
    let seed = Rng::seed_from_env("KCACHE_CERT_SEED", "certificate subjects");
    let cases = std::env::var("KCACHE_CERT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let paths = [
        cms,
        node2_pods,
        "/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode1",
        "/api/v1/namespaces/ids/configmaps/cm1",
        "/api/v1/nodes/node1",
    ];
    let mut differences = Vec::new();
    let mut answers = std::collections::BTreeMap::new();
    let mut not_carried = 0;
    for index in 0..cases {
        let mut rng = Rng::for_case(seed, index);
        let (what, subject, plain) = generated_subject(&mut rng);
        let path = rng.pick(&paths);
        let token = match rng.below(10) {
            0 => Some(ADMIN_TOKEN),
            1 => Some("viewertoken"),
            _ => None,
        };
        let identity = client_cert(&ca_dir, &subject);
        let direct = get(&cluster.url, path, &identity, token).await;
        let through = get(&k.url, path, &identity, token).await;
        *answers.entry(direct.as_ref().map(|d| d.0)).or_insert(0) += 1;
        let refused = through
            .as_ref()
            .is_some_and(|(code, msg)| *code == 403 && msg.starts_with("kcache cannot forward"));
        if refused && header_cannot_carry(&plain) {
            // Proxied as kcache impersonating: fails closed (docs/security.md).
            not_carried += 1;
        } else if through != direct {
            differences.push(format!(
                "case {index}: {what} GET {path} token {token:?}\n    API server {direct:?}\n    kcache     {through:?}\n    replay: KCACHE_CERT_SEED={seed} KCACHE_CERT_CASES={}",
                index + 1
            ));
        }
    }
    eprintln!(
        "certificate subjects: {cases} cases, the API server's answers {answers:?}, {not_carried} refused by kcache as not forwardable"
    );
    assert!(
        differences.is_empty(),
        "seed {seed}: {} of {cases} generated subjects answered differently:\n{}",
        differences.len(),
        differences.join("\n")
    );
    // Not vacuous: both allowed and refused answers were compared.
    if cases >= DEFAULT_CASES {
        assert!(
            answers.contains_key(&Some(200)) && answers.contains_key(&Some(403)),
            "seed {seed}: the generator reached only {answers:?}"
        );
    }

    // The shapes were read from kcache's cache (the differences would be there), not
    // forwarded: configmaps and pods keys exist.
    let keys = k.debug_keys().await.to_string();
    assert!(keys.contains("/api/v1/namespaces/ids/configmaps"), "{keys}");
}
