//! The restart scenario's API server side: killing and starting it again (the
//! `--apiserver-restart-cmd`), waiting for its `/readyz`, the writes that must reach every
//! client, and the counters read from it and from kcache that say what each upstream side
//! did.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::super::Ctx;
use crate::probe::{self, sum_where};
use crate::record::SEQ_ANNOTATION;

/// Longest wait for the API server to be ready after the restart.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// The restarted API server's LISTs of the watched kinds (in all, and by code) and the
/// watches of them it holds open (`apiserver_request_total` counts a watch only when it
/// ends).
pub(super) fn apiserver_requests(text: &str) -> Value {
    let per = |metric: &str, verb: &str| {
        ["secrets", "configmaps"]
            .iter()
            .map(|r| sum_where(text, metric, &[("verb", verb), ("resource", r)]))
            .fold(0.0, |a, b| a + b)
    };
    let mut by_code: BTreeMap<String, f64> = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let labels: Vec<&str> = labels.split(',').collect();
        let kind = ["secrets", "configmaps"]
            .iter()
            .any(|r| labels.contains(&format!("resource=\"{r}\"").as_str()));
        let code = labels.iter().find_map(|kv| kv.strip_prefix("code="));
        if let (true, true, Some(code), Ok(v)) = (
            kind,
            labels.contains(&"verb=\"LIST\""),
            code,
            value.trim().parse::<f64>(),
        ) {
            *by_code
                .entry(code.trim_matches('"').to_string())
                .or_default() += v;
        }
    }
    json!({
        "lists": per("apiserver_request_total", "LIST"),
        "lists_by_code": by_code,
        "watches_open": per("apiserver_longrunning_gauge", "WATCH"),
    })
}

/// kcache's counters that say what its upstream side did.
pub(super) const KCACHE_COUNTERS: [&str; 7] = [
    "kcache_upstream_lists_total",
    "kcache_upstream_probes_total",
    "kcache_upstream_errors_total",
    "kcache_relist_synthetic_events_total",
    "kcache_watch_expired_total",
    "kcache_terminated_watchers_total",
    "kcache_keys_refused_total",
];

/// The current values of `names` at `base`'s `/metrics` (0 for an absent metric);
/// `None` if it could not be read.
pub(super) async fn read_metrics(ctx: &Ctx, base: &str, names: &[&str]) -> Option<Vec<f64>> {
    let text = probe::scrape(&ctx.api.http, base, &ctx.args.token).await?;
    Some(
        names
            .iter()
            .map(|n| probe::sum_samples(&text, n).unwrap_or(0.0))
            .collect(),
    )
}

/// Polls the API server's `/readyz` every 100 ms; the instant it answered 200.
pub(super) async fn wait_ready(ctx: &Ctx) -> Option<Instant> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let url = format!("{}/readyz", ctx.args.apiserver.trim_end_matches('/'));
    while Instant::now() < deadline {
        let r = ctx
            .api
            .http
            .get(&url)
            .bearer_auth(&ctx.args.token)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if r.is_ok_and(|r| r.status().is_success()) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Runs the restart command; the new API server's pid (its last line of output) and what
/// the command said on stderr (e.g. that it had to start the server more than once; the
/// script start-test-cluster.sh writes retries for up to 6 minutes).
pub(super) async fn restart_apiserver(cmd: &str) -> Result<(u32, String), String> {
    let run = tokio::process::Command::new(cmd)
        .stdin(std::process::Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(400), run)
        .await
        .map_err(|_| format!("{cmd}: no exit in 400 s"))?
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let pid = String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| format!("{cmd}: no pid on its last line of output"))?;
    Ok((pid, String::from_utf8_lossy(&out.stderr).trim().to_string()))
}

/// One write to `path`, retried (every 200 ms, 60 times at most): the API server has just
/// come back and sheds load, and a client's "first post-restart write" must exist.
pub(super) async fn write_once(ctx: &Ctx, path: &str, key: &str) -> bool {
    let patch = json!({"metadata": {"annotations": {SEQ_ANNOTATION: key}}});
    for _ in 0..60 {
        if ctx.api.merge_patch(path, &patch).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_are_summed_by_label() {
        let text = "# HELP apiserver_request_total x\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",resource=\"secrets\",scope=\"namespace\",verb=\"LIST\",version=\"v1\"} 7\n\
            apiserver_request_total{code=\"429\",component=\"apiserver\",resource=\"secrets\",scope=\"namespace\",verb=\"LIST\",version=\"v1\"} 2\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",resource=\"configmaps\",scope=\"namespace\",verb=\"LIST\",version=\"v1\"} 3\n\
            apiserver_longrunning_gauge{component=\"apiserver\",resource=\"secrets\",scope=\"namespace\",verb=\"WATCH\",version=\"v1\"} 5\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",resource=\"pods\",scope=\"namespace\",verb=\"LIST\",version=\"v1\"} 100\n";
        let r = apiserver_requests(text);
        assert_eq!(r["lists"], json!(12.0));
        assert_eq!(r["watches_open"], json!(5.0));
        assert_eq!(sum_where(text, "nothing", &[]).to_string(), "0");
        assert_eq!(r["lists_by_code"]["429"], json!(2.0));
        assert_eq!(
            sum_where(text, "apiserver_request_total", &[("verb", "LIST")]),
            112.0
        );
    }
}
