//! Pages and exact versions from the cache (`limit`/`continue`, `resourceVersionMatch=Exact`),
//! judged by the API server: a page chain through kcache holds exactly what the API server
//! holds at the chain's resourceVersion, however the store changes between pages; an exact
//! list through kcache is the API server's exact list; kcache's tokens are its own (the
//! API server's are forwarded, never read), work on another replica of a fleet, and past
//! the key's history continue upstream, in the API server's version.

mod support;

use serde_json::Value;
use support::http::{delete_configmap, next_events, object_ref, put_configmap, Http};
use support::kcache::Kcache;
use support::nats::{fleet_toml, Nats};
use support::prom::sum_samples;
use support::{create_namespace, TestCluster};

/// A list's items as `namespace/name@resourceVersion`, in the order given.
fn items(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(object_ref)
        .collect()
}

fn list_rv(list: &Value) -> String {
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("no resourceVersion: {list}"))
        .to_string()
}

fn token(list: &Value) -> Option<String> {
    list["metadata"]["continue"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

fn join(path: &str, query: &str) -> String {
    if path.contains('?') {
        format!("{path}&{query}")
    } else {
        format!("{path}?{query}")
    }
}

/// One page chain of `path` by `limit` through `via` (each page from the next server in
/// turn), with `between` run after every page: the items, the chain's resourceVersion and
/// each page's `(items, remainingItemCount)`.
async fn chain<F, Fut>(
    via: &[&Http],
    path: &str,
    limit: u64,
    mut between: F,
) -> (Vec<String>, String, Vec<(usize, Option<u64>)>)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut all = Vec::new();
    let mut pages = Vec::new();
    let mut cont: Option<String> = None;
    let mut rv = None;
    for i in 0.. {
        let q = match &cont {
            None => format!("limit={limit}"),
            Some(t) => format!("limit={limit}&continue={t}"),
        };
        let (code, list) = via[i % via.len()].get_admin(&join(path, &q)).await;
        assert_eq!(code, 200, "page {i} of {path}: {list}");
        let page = items(&list);
        assert!(page.len() as u64 <= limit, "page {i}: {page:?}");
        pages.push((page.len(), list["metadata"]["remainingItemCount"].as_u64()));
        all.extend(page);
        let this_rv = list_rv(&list);
        assert_eq!(
            rv.get_or_insert_with(|| this_rv.clone()),
            &this_rv,
            "page {i}: every page is read at the chain's resourceVersion"
        );
        between(i).await;
        cont = token(&list);
        if cont.is_none() {
            break;
        }
    }
    (all, rv.unwrap_or_default(), pages)
}

async fn exact(api: &Http, path: &str, rv: &str) -> Vec<String> {
    let (code, list) = api
        .get_admin(&join(
            path,
            &format!("resourceVersion={rv}&resourceVersionMatch=Exact"),
        ))
        .await;
    assert_eq!(code, 200, "the API server's exact list at {rv}: {list}");
    items(&list)
}

fn bypassed(text: &str, reason: &str) -> f64 {
    sum_samples(
        text,
        "kcache_cache_bypassed_total",
        Some(&format!("reason=\"{reason}\"")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_chains_hold_the_state_at_their_resource_version() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let admin = cluster.kube_client().await;
    // `pages-b` sorts before `pages` in the API server's keys ('-' < '/').
    for ns in ["pages", "pages-b"] {
        create_namespace(&admin, ns).await;
        for i in 0..12 {
            put_configmap(&admin, ns, &format!("cm{i:02}"), "0").await;
        }
    }
    let kc = Http::new(&k.url);
    let api = Http::new(&cluster.url);
    let before = k.metrics_text().await;

    // A namespace's chain while the store changes under it: an object already paged is
    // modified, one not yet paged deleted, one created; the chain keeps the first page's
    // state, exactly the API server's at that resourceVersion.
    const NS: &str = "/api/v1/namespaces/pages/configmaps";
    let admin2 = admin.clone();
    let (got, rv, pages) = chain(&[&kc], NS, 5, |i| {
        let admin = admin2.clone();
        async move {
            put_configmap(&admin, "pages", &format!("cm{:02}", i * 5), "changed").await;
            if i == 0 {
                delete_configmap(&admin, "pages", "cm11").await;
                put_configmap(&admin, "pages", "cm05a", "new").await;
            }
        }
    })
    .await;
    assert_eq!(got, exact(&api, NS, &rv).await, "the chain at {rv}");
    assert_eq!(got.len(), 12);
    assert_eq!(pages, [(5, Some(7)), (5, Some(2)), (2, None)]);
    // An exact list through kcache at that resourceVersion is the API server's.
    let (code, list) = kc
        .get_admin(&format!(
            "{NS}?resourceVersion={rv}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(items(&list), got);
    assert_eq!(list_rv(&list), rv);
    // And so is the legacy exact list (a limit with the resourceVersion).
    let (code, list) = kc
        .get_admin(&format!("{NS}?resourceVersion={rv}&limit=100"))
        .await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(items(&list), got);

    // A list pinned to one name is one key's read for the API server: never a token,
    // though the namespace's key (serving it here) holds more after it.
    let one = format!("{NS}?fieldSelector=metadata.name%3Dcm01&limit=1");
    let (code, through) = kc.get_admin(&one).await;
    let (direct_code, direct) = api.get_admin(&one).await;
    assert_eq!((code, direct_code), (200, 200), "{through} {direct}");
    assert_eq!(items(&through).len(), 1);
    assert_eq!(token(&through), token(&direct), "{through}");

    // Cluster-wide, across namespaces, with nothing written in between: kcache's pages
    // are the API server's own, page for page, in its key order.
    const ALL: &str = "/api/v1/configmaps?labelSelector=round%3Dany";
    let (through, _, kc_pages) = chain(&[&kc], ALL, 7, |_| async {}).await;
    let (direct, _, api_pages) = chain(&[&api], ALL, 7, |_| async {}).await;
    assert_eq!(through, direct, "cluster-wide with a label selector");
    assert_eq!(kc_pages, api_pages);
    let (through, rv, kc_pages) = chain(&[&kc], "/api/v1/configmaps", 7, |_| async {}).await;
    assert_eq!(through, exact(&api, "/api/v1/configmaps", &rv).await);
    assert_eq!(
        kc_pages.iter().map(|p| p.1.is_some()).collect::<Vec<_>>(),
        kc_pages
            .iter()
            .enumerate()
            .map(|(i, _)| i + 1 < kc_pages.len())
            .collect::<Vec<_>>(),
        "remainingItemCount on every page but the last: {kc_pages:?}"
    );

    // Served by kcache: no list went upstream for its resourceVersion or paging.
    let after = k.metrics_text().await;
    for reason in ["rv", "history", "not_fresh", "not_ready"] {
        assert_eq!(
            bypassed(&after, reason),
            bypassed(&before, reason),
            "lists forwarded ({reason})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_kcaches_own_and_continue_upstream_past_its_history() {
    let cluster = TestCluster::start().await;
    // A short history: 4 events per key.
    let k = Kcache::start(&cluster, "[cache]\nwindow_capacity = 4\n").await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "tokens").await;
    for i in 0..6 {
        put_configmap(&admin, "tokens", &format!("cm{i}"), "0").await;
    }
    let kc = Http::new(&k.url);
    let api = Http::new(&cluster.url);
    const NS: &str = "/api/v1/namespaces/tokens/configmaps";

    // The API server's token, sent to kcache, is the API server's to read: the chain
    // continues as it would directly.
    let (code, first) = api.get_admin(&format!("{NS}?limit=2")).await;
    assert_eq!(code, 200);
    let upstream = token(&first).expect("the API server's token");
    let (code, via_kcache) = kc
        .get_admin(&format!("{NS}?limit=2&continue={upstream}"))
        .await;
    let (_, direct) = api
        .get_admin(&format!("{NS}?limit=2&continue={upstream}"))
        .await;
    assert_eq!(code, 200, "{via_kcache}");
    assert_eq!(items(&via_kcache), items(&direct));
    assert_eq!(list_rv(&via_kcache), list_rv(&direct));

    // kcache's token: the API server's checks, the API server's words.
    let (code, page) = kc.get_admin(&format!("{NS}?limit=2")).await;
    assert_eq!(code, 200, "{page}");
    let ours = token(&page).expect("kcache's token");
    assert_ne!(ours, upstream);
    for (query, direct_query) in [
        (
            format!("limit=2&resourceVersion=5&continue={ours}"),
            format!("limit=2&resourceVersion=5&continue={upstream}"),
        ),
        (
            format!("limit=2&resourceVersionMatch=NotOlderThan&resourceVersion=5&continue={ours}"),
            format!(
                "limit=2&resourceVersionMatch=NotOlderThan&resourceVersion=5&continue={upstream}"
            ),
        ),
    ] {
        let (code, status) = kc.get_admin(&format!("{NS}?{query}")).await;
        let (direct_code, direct_status) = api.get_admin(&format!("{NS}?{direct_query}")).await;
        assert_eq!(code, direct_code, "{query}: {status}");
        assert_eq!(status["message"], direct_status["message"], "{query}");
        assert_eq!(status["reason"], direct_status["reason"], "{query}");
    }

    // Past the key's history: writes push the chain's resourceVersion out of the
    // window. The chain goes on upstream, the token in the API server's version: the
    // page is the one the API server gives for its own token at that resourceVersion.
    let chain_rv = list_rv(&page);
    let as_upstream = {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let json = String::from_utf8(b64.decode(&ours).expect("base64url")).expect("utf-8");
        assert!(json.contains(r#""v":"kcache.io/v1""#), "{json}");
        b64.encode(json.replace(r#""v":"kcache.io/v1""#, r#""v":"meta.k8s.io/v1""#))
    };
    for i in 0..6 {
        put_configmap(&admin, "tokens", &format!("cm{i}"), "moved").await;
    }
    let before = k.metrics_text().await;
    let continued = std::sync::Mutex::new(Value::Null);
    support::eventually(
        "the window moves past the chain and the page goes upstream",
        std::time::Duration::from_secs(20),
        || async {
            let (code, list) = kc.get_admin(&format!("{NS}?limit=2&continue={ours}")).await;
            assert_eq!(code, 200, "{list}");
            *continued.lock().unwrap() = list;
            bypassed(&k.metrics_text().await, "history") > bypassed(&before, "history")
        },
    )
    .await;
    let continued = continued.into_inner().unwrap();
    let (code, direct) = api
        .get_admin(&format!("{NS}?limit=2&continue={as_upstream}"))
        .await;
    assert_eq!(code, 200, "{direct}");
    assert_eq!(items(&continued), items(&direct));
    assert_eq!(list_rv(&continued), chain_rv);
    assert_eq!(list_rv(&direct), chain_rv);
    assert_eq!(token(&continued), token(&direct));
    // An exact list that old is the API server's to answer (its snapshots reach further).
    let before = k.metrics_text().await;
    let (code, list) = kc
        .get_admin(&format!(
            "{NS}?resourceVersion={chain_rv}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(items(&list), exact(&api, NS, &chain_rv).await);
    let after = k.metrics_text().await;
    assert_eq!(
        bypassed(&after, "history"),
        bypassed(&before, "history") + 1.0
    );
}

/// A fleet behind a Service: each page of a chain may reach another replica. A replica
/// whose key holds the chain's resourceVersion in its window continues any replica's
/// token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_one_replica_continues_on_another() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let toml = fleet_toml(cluster.dir_path(), &nats, "");
    let a = Kcache::start_with_admin_port(&cluster, &toml, &["--replica-id", "a"]).await;
    let b = Kcache::start_with_admin_port(&cluster, &toml, &["--replica-id", "b"]).await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "fleet-pages").await;
    for i in 0..9 {
        put_configmap(&admin, "fleet-pages", &format!("cm{i}"), "0").await;
    }
    let (ka, kb) = (Http::new(&a.url), Http::new(&b.url));
    let api = Http::new(&cluster.url);
    const NS: &str = "/api/v1/namespaces/fleet-pages/configmaps";
    // Both replicas serve the key (clients of each watch it), synced — their windows
    // begin before the chain does. (A replica whose key starts after a chain's
    // resourceVersion sends it on to the API server.)
    let mut wa = ka
        .watch_ok(&format!("{NS}?watch=1&resourceVersion=0"))
        .await;
    let mut wb = kb
        .watch_ok(&format!("{NS}?watch=1&resourceVersion=0"))
        .await;
    next_events(&mut wa, 9).await;
    next_events(&mut wb, 9).await;
    let admin2 = admin.clone();
    let (got, rv, pages) = chain(&[&ka, &kb], NS, 2, |i| {
        let admin = admin2.clone();
        async move {
            put_configmap(&admin, "fleet-pages", &format!("cm{}", 8 - i), "changed").await;
        }
    })
    .await;
    assert_eq!(pages.len(), 5, "{pages:?}");
    assert_eq!(
        got,
        exact(&api, NS, &rv).await,
        "the chain at {rv} across replicas"
    );
}
