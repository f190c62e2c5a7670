//! kcache's keys start with streaming lists where the upstream serves them: the API
//! server's watch cache sends the state as events instead of building a list, and the
//! stream goes on as the key's watch. Judged by the API server's own request counts: no
//! LIST, one WATCH; with `cache.upstream_streaming_lists = false`, a LIST as before.

mod support;

use support::http::{next_events, put_configmap, Http};
use support::kcache::Kcache;
use support::prom::sum_samples;
use support::{api_requests_in, create_namespace, TestCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_start_with_streaming_lists_where_the_upstream_serves_them() {
    let cluster = TestCluster::start().await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "streamed").await;
    for i in 0..30 {
        put_configmap(&admin, "streamed", &format!("cm{i:02}"), "0").await;
    }
    // The API server's own informers watch ConfigMaps too.
    let baseline = cluster.upstream_watches("configmaps").await;
    for (toml, streaming) in [
        ("", true),
        ("[cache]\nupstream_streaming_lists = false\n", false),
    ] {
        // The previous kcache's watch is gone.
        support::eventually(
            "no upstream watch of configmaps but the API server's own",
            std::time::Duration::from_secs(20),
            || async { cluster.upstream_watches("configmaps").await == baseline },
        )
        .await;
        let k = Kcache::start(&cluster, toml).await;
        let kc = Http::new(&k.url);
        // Discovery done (its read probes list each resource once): a cached read answers.
        let (code, _) = kc.get_admin("/api/v1/secrets?resourceVersion=0").await;
        assert_eq!(code, 200);
        let before = cluster.metrics_text().await;
        let watches_before = support::upstream_watches_in(&before, "configmaps");
        // A watch through kcache starts the namespace's key: the state, then events.
        let mut rx = kc
            .watch_ok("/api/v1/namespaces/streamed/configmaps?watch=1&resourceVersion=0")
            .await;
        let added = next_events(&mut rx, 30).await;
        assert!(
            added.iter().all(|e| e.starts_with("ADDED streamed/cm")),
            "{added:?}"
        );
        put_configmap(&admin, "streamed", "cm00", &format!("{streaming}")).await;
        let modified = next_events(&mut rx, 1).await;
        assert!(
            modified[0].starts_with("MODIFIED streamed/cm00@"),
            "{modified:?}"
        );
        let after = cluster.metrics_text().await;
        let lists = api_requests_in(&after, "LIST", "configmaps")
            - api_requests_in(&before, "LIST", "configmaps");
        let kcache_streaming = sum_samples(
            &k.metrics_text().await,
            "kcache_upstream_streaming_lists_total",
            Some("resource=\"configmaps\""),
        );
        if streaming {
            assert_eq!(lists, 0, "the key's start listed upstream");
            assert_eq!(kcache_streaming, 1.0);
        } else {
            assert_eq!(lists, 1, "the key's start without streaming lists");
            assert_eq!(kcache_streaming, 0.0);
        }
        // Either way one upstream watch: a streaming list's stream is the key's watch.
        assert_eq!(
            support::upstream_watches_in(&after, "configmaps"),
            watches_before + 1,
            "upstream watches of configmaps (streaming={streaming})"
        );
    }
}
