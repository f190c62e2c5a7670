//! Starting a cache-served watch: admission, the key's reference, the freshness proof a
//! streaming list needs, and the watcher that is the response body.

use std::sync::Arc;
use std::time::Duration;

use actix_web::HttpResponse;
use bytes::Bytes;
use kcache_actors::core::cover;
use kcache_actors::core::event::encode_value_line;
use kcache_actors::core::filter::Filter;
use kcache_actors::core::object::{EventType, Object};
use kcache_actors::core::proto;
use kcache_actors::registry::{Acquire, Release};
use kcache_actors::watcher::{
    deadline_after, Encoder, Keepalive, KeepalivePhase, Watcher, WatcherSpec,
};
use serde_json::{json, Value};

use super::{now_secs, parks, snapshot, Served};
use crate::auth::UserInfo;
use crate::fairness::SeatSlot;
use crate::plan::{Admitted, Format, Reason, WatchOp};
use crate::state::ApiState;
use crate::status::ApiError;
use crate::table;

/// Starts the watch `op` for `user`; the response streams the watcher's events.
pub async fn watch(
    state: &ApiState,
    (user, seat): (&UserInfo, &mut SeatSlot<'_>),
    (op, conn): (WatchOp, Option<KeepalivePhase>),
    (format, columns): (Format, Option<Value>),
) -> Result<Served, ApiError> {
    let WatchOp {
        key,
        label,
        field,
        include,
        timeout_seconds,
        checked,
    } = op;
    let permit = state.watch_limits.admit(&user.username)?;
    let start = match checked? {
        Admitted::Start(start) => start,
        Admitted::Forward(reason) => return Ok(Served::Forward(reason)),
    };
    let plan = start.plan;
    let timeout = timeout(
        timeout_seconds,
        state.server.min_request_timeout_secs,
        rand::random::<f64>(),
    );
    let content_type = match format {
        Format::Protobuf(_) => proto::codec::WATCH_CONTENT_TYPE,
        _ => "application/json",
    };
    let encoder = match format {
        Format::Json => Encoder::Json,
        Format::Protobuf(codec) => Encoder::Protobuf(codec),
        Format::Table(version) => {
            // Set for every Table `serve` lets through (`table::columns_for`).
            let Some(columns) = columns else {
                return Ok(Served::Forward(Reason::Table));
            };
            let resource = key.resource.clone();
            Encoder::Custom(Arc::new(move |kind: EventType, obj: &Object| -> Bytes {
                let t = table::to_table(
                    version,
                    &columns,
                    &resource.group,
                    &resource.resource,
                    &[&obj.to_value()],
                    json!({ "resourceVersion": obj.rv().to_string() }),
                    include,
                    now_secs(),
                );
                encode_value_line(kind.as_str(), &t)
            }))
        }
    };
    let registry = state.registry.clone();
    let mailbox = state.cache.watcher_buffer.max(16);
    // The phase of the client's connection, shared by all its watches; a connection
    // without one (none is made without) gets its own.
    let keepalive = Keepalive {
        every: Duration::from_secs(state.cache.watch_keepalive_secs),
        phase: conn.unwrap_or_else(KeepalivePhase::random).0,
    };
    // Take the reference first: a key the user may not start is a 429 (the watch was not
    // accepted), as a watch past the watch caps. The watcher releases it when it stops.
    super::gather(state, seat, &key).await?;
    let held = registry
        .send(Acquire {
            key: key.clone(),
            from_rv: if plan.initial_events { 0 } else { plan.from_rv },
            user: Some(user.username.clone()),
        })
        .await
        .map_err(|_| ApiError::service_unavailable("kcache is shutting down"))?
        .map_err(|e| crate::limits::too_many_requests(e.to_string()))?;
    // Until the watcher takes the reference over, it is given back however this ends: an
    // answer, an error, or the client leaving while the watch waits (the future dropped).
    let mut reference = Reference {
        registry: registry.clone(),
        key: Some((held.key.clone(), key.clone())),
    };
    // A watch that starts with the key's state (from "0") must not hand out an object a
    // parked key has not yet heard was deleted: proven like a consistent read.
    let may_park = !start.consistent
        && plan.initial_events
        && state.cache.immutable_stop_watch
        && held.key.may_hold_immutable();
    let parked = may_park
        && match snapshot(&held.addr, (0, None), None, seat).await? {
            Ok(snap) => parks(state, &held.key, &snap),
            Err(_) => false,
        };
    let prove = start.consistent || parked;
    if prove {
        if let Err(e) = seat.away(state.fresh.prove(&held.key, &held.addr)).await {
            tracing::info!(error = %e, "consistent read not proven fresh; forwarding upstream");
            return Ok(Served::Forward(Reason::NotFresh));
        }
    }
    // The cache has work for the request again: its seat first (429 when none comes: the
    // watch was not accepted).
    seat.back().await?;
    // Served by a covering key, the filter tests what the own key's upstream selector
    // would have guaranteed.
    let filter = Filter::new(label, cover::field_for(&key, &held.key, field));
    let asked = (held.key != key).then(|| Box::new(key));
    // The watcher is the response body: it subscribes now and runs as the HTTP/2 stream
    // polls it. Until its first event the client sees the response head and waits, as with
    // the API server.
    let budget = state.dispatch_budgets.of(&held.key.resource);
    let watcher = Watcher::new(WatcherSpec {
        budget,
        asked,
        filter,
        plan,
        allow_bookmarks: start.allow_bookmarks,
        deadline: deadline_after(timeout),
        encoder,
        buffer: state.cache.watcher_buffer,
        cached: held.link,
        registry,
        mailbox,
        keepalive,
        permit: Some(Box::new(permit)),
    });
    // The watcher holds the reference now (and gives it back however the watch ends).
    reference.key = None;
    // Its head is given back once sent, not held for the watch's life (the HTTP/2
    // dispatcher in vendor/actix-http; tests/http_stack.rs).
    let res = HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("Cache-Control", "no-cache, private"))
        .streaming(watcher);
    Ok(Served::Response(res))
}

/// A watch's duration as the API server computes it: `time.Duration(timeoutSeconds) *
/// time.Second`, in Go's wrapping int64 nanoseconds; zero (or absent) is
/// `--min-request-timeout` × [1, 2) (`jitter` in [0, 1)), and a negative one ends the
/// watch at once (a Go timer fires at once for it).
fn timeout(timeout_seconds: Option<i64>, min_request_timeout_secs: u64, jitter: f64) -> Duration {
    match timeout_seconds.unwrap_or(0).wrapping_mul(1_000_000_000) {
        0 => Duration::from_secs_f64(min_request_timeout_secs as f64 * (1.0 + jitter)),
        n if n < 0 => Duration::ZERO,
        n => Duration::from_nanos(n.unsigned_abs()),
    }
}

/// A watch's reference on its key, until its watcher takes it over: given back to the
/// registry when dropped while still held.
struct Reference {
    registry: Arc<actix::Addr<kcache_actors::registry::Registry>>,
    /// The key held and the key asked for; `None` once handed to the watcher.
    key: Option<(kcache_actors::core::key::Key, kcache_actors::core::key::Key)>,
}

impl Drop for Reference {
    fn drop(&mut self) {
        if let Some((key, asked)) = self.key.take() {
            self.registry.do_send(Release { key, asked });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_read_as_the_api_server_reads_them() {
        let cases: [(Option<i64>, f64, Duration); 6] = [
            (None, 0.0, Duration::from_secs(1800)),
            (Some(0), 0.5, Duration::from_secs(2700)),
            (Some(5), 0.9, Duration::from_secs(5)),
            (Some(-1), 0.0, Duration::ZERO),
            // Go's int64 nanoseconds wrap: 2^63 / 1e9 seconds and beyond come out negative
            // or small, as the API server computes them.
            (Some(9_223_372_037), 0.0, Duration::ZERO),
            // ... and past 2^64 ns, positive again: a watch of 0.29 s.
            (Some(18_446_744_074), 0.0, Duration::from_nanos(290_448_384)),
        ];
        for (secs, jitter, want) in cases {
            assert_eq!(timeout(secs, 1800, jitter), want, "{secs:?}");
        }
    }
}
