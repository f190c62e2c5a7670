//! The TokenReview and SubjectAccessReview caches against the real API server: a flood of
//! one-off keys (random object names, bogus tokens) evicts single entries, never the other
//! users' decisions; tokens of one user that differ only in `extra` (service-account tokens
//! bound to different pods) get their own authorization decisions. Observed through
//! kcache's `/metrics`.

mod support;

use serde_json::json;
use support::kcache::Kcache;
use support::{insecure_http, TestCluster, ADMIN_TOKEN};

/// Small caches so a few hundred requests fill them; TTLs long enough that nothing expires
/// during a test (an expiry would be a miss for the wrong reason).
const SMALL_CACHES: &str = "[auth]\n\
    token_cache_size = 100\n\
    token_cache_ttl_secs = 3600\n\
    authz_cache_size = 100\n\
    authz_allow_ttl_secs = 3600\n\
    authz_deny_ttl_secs = 3600\n";

/// Three times the caches' capacity.
const FLOOD: usize = 300;

/// The status code of a GET through kcache.
async fn get(k: &Kcache, path: &str, token: &str) -> u16 {
    insecure_http()
        .get(format!("{}{}", k.url, path))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET through kcache")
        .status()
        .as_u16()
}

/// kcache's counters that matter here. Reading `/metrics` is itself a (cached) token and
/// authorization lookup for admin; it is counted before the text is rendered.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    token_hits: f64,
    token_misses: f64,
    token_reviews: f64,
    authz_hits: f64,
    authz_misses: f64,
    authz_reviews: f64,
    authz_evictions: f64,
    token_evictions: f64,
}

/// The sum of `name`'s samples carrying every `key="value"` of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

async fn counts(k: &Kcache) -> Counts {
    let text = k.metrics_text().await;
    let lookups = "kcache_auth_cache_requests_total";
    let reviews = "kcache_auth_reviews_total";
    let evictions = "kcache_auth_cache_evictions_total";
    Counts {
        token_hits: sample(&text, lookups, &[("cache", "token"), ("result", "hit")]),
        token_misses: sample(&text, lookups, &[("cache", "token"), ("result", "miss")]),
        token_reviews: sample(&text, reviews, &[("review", "TokenReview")]),
        authz_hits: sample(&text, lookups, &[("cache", "authz"), ("result", "hit")]),
        authz_misses: sample(&text, lookups, &[("cache", "authz"), ("result", "miss")]),
        authz_reviews: sample(&text, reviews, &[("review", "SubjectAccessReview")]),
        authz_evictions: sample(&text, evictions, &[("cache", "authz")]),
        token_evictions: sample(&text, evictions, &[("cache", "token")]),
    }
}

const ADMIN_LIST: &str = "/api/v1/namespaces/default/configmaps?resourceVersion=0";
const VIEWER_GET: &str = "/api/v1/namespaces/default/secrets/viewers-secret?resourceVersion=0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_one_off_keys_does_not_evict_other_users_entries() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, SMALL_CACHES).await;

    // Authorization: admin and viewer each use a decision (and admin the /metrics one);
    // nobody's token is looked up once.
    let warmup = "/api/v1/namespaces/default/configmaps/warmup";
    assert_eq!(get(&k, warmup, "nobodytoken").await, 403);
    for _ in 0..3 {
        assert_eq!(get(&k, ADMIN_LIST, ADMIN_TOKEN).await, 200);
        assert_eq!(get(&k, VIEWER_GET, "viewertoken").await, 403);
        counts(&k).await;
    }
    let before = counts(&k).await;
    assert_eq!(before.authz_misses, 4.0, "{before:?}");

    // nobody asks for FLOOD distinct names, each a new decision, while admin and viewer
    // go on using theirs. (That an entry idle through a flood survives too is a unit test
    // in ttl_cache.rs: moka counts uses only once a cache is half full, and applies them
    // in batches, which an end-to-end test cannot line up.)
    for i in 0..FLOOD {
        let path = format!("/api/v1/namespaces/default/configmaps/flood-{i}");
        assert_eq!(get(&k, &path, "nobodytoken").await, 403);
        if i % 10 == 9 {
            assert_eq!(get(&k, ADMIN_LIST, ADMIN_TOKEN).await, 200);
            assert_eq!(get(&k, VIEWER_GET, "viewertoken").await, 403);
            counts(&k).await;
        }
    }
    let after = counts(&k).await;
    assert!(
        after.authz_evictions > before.authz_evictions,
        "the cache was full and evicted: {after:?}"
    );
    // One miss and one SubjectAccessReview per flooded name, none for admin's or
    // viewer's decisions (a cache that clears itself when full has to ask again).
    assert_eq!(
        after.authz_misses - before.authz_misses,
        FLOOD as f64,
        "before {before:?}\nafter {after:?}"
    );
    assert_eq!(
        after.authz_reviews - before.authz_reviews,
        FLOOD as f64,
        "before {before:?}\nafter {after:?}"
    );
    // Admin's list, viewer's read and admin's /metrics read, 30 times, and the last
    // /metrics read.
    assert_eq!(
        after.authz_hits - before.authz_hits,
        (3 * FLOOD / 10 + 1) as f64,
        "before {before:?}\nafter {after:?}"
    );
    // Only the three users' tokens, already cached: the token cache never missed.
    assert_eq!(after.token_misses, before.token_misses);

    // Authentication: FLOOD bogus tokens, each one review, while viewer keeps using its
    // token. Admin's token is used by every /metrics read.
    let before = counts(&k).await;
    for i in 0..FLOOD {
        let bogus = format!("bogus-{i}-{}", rand::random::<u64>());
        assert_eq!(get(&k, ADMIN_LIST, &bogus).await, 401);
        if i % 10 == 9 {
            assert_eq!(get(&k, VIEWER_GET, "viewertoken").await, 403);
            counts(&k).await;
        }
    }
    let after = counts(&k).await;
    assert!(
        after.token_evictions > before.token_evictions,
        "the token cache was full and evicted: {after:?}"
    );
    assert_eq!(
        after.token_misses - before.token_misses,
        FLOOD as f64,
        "before {before:?}\nafter {after:?}"
    );
    assert_eq!(
        after.token_reviews - before.token_reviews,
        FLOOD as f64,
        "before {before:?}\nafter {after:?}"
    );
    // Every viewer request and every /metrics read found its token.
    assert_eq!(
        after.token_hits - before.token_hits,
        (2 * FLOOD / 10 + 1) as f64,
        "before {before:?}\nafter {after:?}"
    );
}

/// Creates Pod `name` run by service account `bot`, and a token for `bot` bound to it.
async fn token_bound_to_pod(cluster: &TestCluster, name: &str) -> String {
    let pod = support::create_as_admin(
        cluster,
        "/api/v1/namespaces/default/pods",
        json!({
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": "bot",
                "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "busybox"}],
            },
        }),
    )
    .await;
    let uid = pod["metadata"]["uid"].as_str().expect("pod uid");
    let tr = support::create_as_admin(
        cluster,
        "/api/v1/namespaces/default/serviceaccounts/bot/token",
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
            },
        }),
    )
    .await;
    tr["status"]["token"]
        .as_str()
        .expect("a bound token")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_differing_only_in_extra_do_not_share_decisions() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, SMALL_CACHES).await;
    support::create_as_admin(
        &cluster,
        "/api/v1/namespaces/default/serviceaccounts",
        json!({"metadata": {"name": "bot"}}),
    )
    .await;
    let t1 = token_bound_to_pod(&cluster, "p1").await;
    let t2 = token_bound_to_pod(&cluster, "p2").await;

    // What the API server says of them: the same user, name, uid and groups alike; only
    // `extra` (the pod each is bound to) tells them apart.
    let mut users = Vec::new();
    for t in [&t1, &t2] {
        let review = support::create_as_admin(
            &cluster,
            "/apis/authentication.k8s.io/v1/tokenreviews",
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": t}}),
        )
        .await;
        assert_eq!(review["status"]["authenticated"], true, "{review}");
        users.push(review["status"]["user"].clone());
    }
    let (u1, u2) = (&users[0], &users[1]);
    assert_eq!(u1["username"], "system:serviceaccount:default:bot");
    for field in ["username", "uid", "groups"] {
        assert_eq!(u1[field], u2[field], "{field}");
    }
    assert_eq!(
        u1["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["p1"])
    );
    assert_eq!(
        u2["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["p2"])
    );

    // The service account may not read Secrets: a denial, cached.
    let path = "/api/v1/namespaces/default/secrets?resourceVersion=0";
    assert_eq!(get(&k, path, &t1).await, 403);
    assert_eq!(get(&k, path, &t1).await, 403);
    let before = counts(&k).await;
    assert_eq!(get(&k, path, &t2).await, 403);
    let after = counts(&k).await;
    // t2's user is not t1's: its own review, not t1's cached decision.
    assert_eq!(
        after.authz_misses - before.authz_misses,
        1.0,
        "before {before:?}\nafter {after:?}"
    );
    assert_eq!(after.authz_reviews - before.authz_reviews, 1.0);
    // And then cached under its own key.
    assert_eq!(get(&k, path, &t2).await, 403);
    assert_eq!(get(&k, path, &t1).await, 403);
    let last = counts(&k).await;
    assert_eq!(last.authz_misses, after.authz_misses, "{last:?}");
    assert_eq!(last.authz_reviews, after.authz_reviews, "{last:?}");
}
