//! Serving a planned request (`crate::plan`) from the cache: a snapshot of its key (or a
//! covering key) at the resourceVersion asked — proven fresh for a consistent read and
//! where the key may not have heard of a deletion, or at an exact resourceVersion from the
//! key's history — cut into a page where a limit asks for one (`core::page`), written as
//! JSON, protobuf or a Table; watches in [`watch`].

mod list_body;
pub mod watch;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use actix::Addr;
use actix_web::HttpResponse;
use kcache_actors::cached_object::{self, Read, TryRead};
use kcache_actors::core::cover;
use kcache_actors::core::filter::Filter;
use kcache_actors::core::key::{Key, ResourceType};
use kcache_actors::core::object::{self, Object};
use kcache_actors::core::page::{self, Token};
use kcache_actors::core::proto;
use kcache_actors::core::rv::At;
use kcache_actors::registry::{self, Hold};
use kcache_actors::watcher::KeepalivePhase;
use serde_json::{json, Value};

use crate::auth::UserInfo;
use crate::fairness::{Seat, SeatSlot};
use crate::plan::{Format, Op, Reason};
use crate::state::ApiState;
use crate::status::ApiError;
use crate::table;

/// What a cache-served request turned out to need.
pub enum Served {
    Response(HttpResponse),
    /// Not the cache's to answer after all (a key past its budget, not synced, not proven
    /// fresh, ...): proxy it. The reason labels `kcache_cache_bypassed_total`.
    Forward(Reason),
}

/// Serves `op` for an authorized `user`.
pub async fn serve(
    state: &ApiState,
    user: &UserInfo,
    (resource, conn): (&Arc<ResourceType>, Option<KeepalivePhase>),
    op: Op,
    format: Format,
    seat: Option<Seat>,
) -> Result<Served, ApiError> {
    // The seat is held until the answer is written — dropped here for all but a list's
    // body, which keeps it until its last byte — except while the request only waits.
    let mut seat = SeatSlot::new(&state.fairness, &user.username, seat);
    // A Table is printed with the upstream's own column definitions, or not at all when
    // the upstream prints the resource's Tables with other columns (a request already
    // forwarded keeps its own reason).
    let columns = match (&op, &format) {
        (Op::Forward(_), _) => None,
        (_, Format::Table(_)) => {
            let id = (
                resource.group.clone(),
                resource.version.clone(),
                resource.resource.clone(),
            );
            let upstream = state.table_columns.get().and_then(|c| c.get(&id));
            match table::columns_for(&resource.group, &resource.resource, upstream) {
                Some(columns) => Some(columns.clone()),
                None => return Ok(Served::Forward(Reason::Table)),
            }
        }
        _ => None,
    };
    match op {
        Op::Forward(reason) => Ok(Served::Forward(reason)),
        Op::Watch(w) => watch::watch(state, (user, &mut seat), (*w, conn), (format, columns)).await,
        Op::Get {
            key,
            name,
            namespace,
            min_rv,
            include,
        } => {
            get(
                state,
                (user, &mut seat),
                resource,
                key,
                (&name, namespace.as_deref()),
                min_rv,
                (format, columns.as_ref()),
                include,
            )
            .await
        }
        Op::List {
            key,
            namespace,
            label,
            field,
            read: list_read,
            include,
        } => {
            let selectors = !label.is_empty() || !field.is_empty();
            // A list pinned to one name is one key's read for the API server (never
            // recursive), so it never continues — unless a token made it recursive.
            let one_name =
                field.equality_value("metadata.name").is_some() && list_read.start.is_none();
            let read = read(state, (user, &mut seat), key.clone(), list_read.at).await?;
            // A continued chain whose state left the window goes on upstream, from etcd's
            // history (its token in the API server's version: `proxy::upstream_target`).
            let (held, snap) = match read {
                Ok(read) => read,
                Err(reason) => return Ok(Served::Forward(reason)),
            };
            let filter = Filter::new(label, cover::field_for(&key, &held, field));
            // The list's scope in key order (a covering key's snapshot holds more), from
            // the page's start on: a namespace's keys (`namespace/name`) are contiguous.
            let scope = namespace
                .as_ref()
                .map(|ns| format!("{ns}/"))
                .unwrap_or_default();
            let from = format!("{scope}{}", list_read.start.as_deref().unwrap_or(""));
            let first = snap.objects.partition_point(|o| page::key_before(o, &from));
            let candidates = snap.objects[first..]
                .iter()
                .take_while(|o| namespace.as_deref().is_none_or(|ns| o.namespace() == ns));
            let cut = page::cut(
                candidates,
                |o| filter.matches(o),
                list_read.limit,
                selectors,
            );
            let more = cut.more.filter(|_| !one_name).map(|m| {
                let last = m.last.strip_prefix(&scope).unwrap_or(&m.last);
                (Token::after(snap.rv, last).encode(), m.remaining)
            });
            list(
                resource,
                (snap.rv, more.as_ref().map(|(t, n)| (t.as_str(), *n))),
                cut.items,
                (format, columns.as_ref()),
                include,
                seat.into_seat(),
            )
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn get(
    state: &ApiState,
    who: (&UserInfo, &mut SeatSlot<'_>),
    resource: &ResourceType,
    key: Key,
    (name, namespace): (&str, Option<&str>),
    min_rv: u64,
    (format, columns): (Format, Option<&Value>),
    include: Result<table::IncludeObject, ApiError>,
) -> Result<Served, ApiError> {
    // The snapshot may be a covering key's (`core::cover`): the object is found by name
    // and namespace either way.
    let (_, snap) = match read(state, who, key, At::NotOlderThan(min_rv)).await? {
        Ok(read) => read,
        Err(reason) => return Ok(Served::Forward(reason)),
    };
    let obj = snap
        .objects
        .iter()
        .find(|o| o.name() == name && namespace.is_none_or(|ns| o.namespace() == ns));
    let Some(obj) = obj else {
        return Err(ApiError::not_found(
            &resource.group,
            &resource.resource,
            name,
        ));
    };
    let v = match format {
        // The object's bytes as the upstream sent them.
        Format::Json => {
            return Ok(Served::Response(
                HttpResponse::Ok()
                    .content_type("application/json")
                    .body(obj.json().clone()),
            ))
        }
        Format::Protobuf(codec) => {
            let Some(msg) = obj.proto(&codec) else {
                return Ok(Served::Forward(Reason::Protobuf));
            };
            return Ok(Served::Response(
                HttpResponse::Ok()
                    .content_type(proto::codec::CONTENT_TYPE)
                    .body(codec.envelope(&msg)),
            ));
        }
        Format::Table(v) => v,
    };
    // Set for every Table `serve` lets through (`table::columns_for`).
    let Some(columns) = columns else {
        return Ok(Served::Forward(Reason::Table));
    };
    // Parsed as the API server parses it: writing the Table, after the read.
    let include = include?;
    let body = table::to_table(
        v,
        columns,
        &resource.group,
        &resource.resource,
        &[&obj.to_value()],
        json!({ "resourceVersion": snap.rv.to_string() }),
        include,
        now_secs(),
    );
    Ok(Served::Response(json_response(&body)))
}

/// A list of `items` at `rv` in `format`; `more`: the continue token and the count of
/// objects left, when more follow.
fn list(
    resource: &ResourceType,
    (rv, more): (u64, Option<(&str, Option<u64>)>),
    items: Vec<Arc<Object>>,
    (format, columns): (Format, Option<&Value>),
    include: Result<table::IncludeObject, ApiError>,
    seat: Option<Seat>,
) -> Result<Served, ApiError> {
    let v = match format {
        Format::Json => {
            let head = object::list_page_head(
                &format!("{}List", resource.kind),
                &resource.api_version(),
                rv,
                more,
            );
            // A built-in kind's items leave `kind` and `apiVersion` to the list, as the
            // API server writes them (a custom resource's keep theirs).
            let built_in =
                proto::Codec::for_kind(&resource.group, &resource.version, &resource.kind)
                    .is_some();
            return Ok(Served::Response(list_body::list_response(
                head,
                (items, built_in),
                seat,
            )));
        }
        Format::Protobuf(codec) => {
            // Every item's message first: one the schema cannot express sends the whole
            // list to the API server rather than leave a field out.
            let Some(messages) = items.iter().map(|o| o.proto(&codec)).collect() else {
                return Ok(Served::Forward(Reason::Protobuf));
            };
            return Ok(Served::Response(list_body::proto_list_response(
                &codec,
                (rv, more),
                messages,
                seat,
            )));
        }
        Format::Table(v) => v,
    };
    // Set for every Table `serve` lets through (`table::columns_for`).
    let Some(columns) = columns else {
        return Ok(Served::Forward(Reason::Table));
    };
    // Parsed as the API server parses it: writing the Table, after the read.
    let include = include?;
    let values: Vec<Value> = items.iter().map(|o| o.to_value()).collect();
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if let Some((token, remaining)) = more {
        meta["continue"] = json!(token);
        if let Some(n) = remaining {
            meta["remainingItemCount"] = json!(n);
        }
    }
    let body = table::to_table(
        v,
        columns,
        &resource.group,
        &resource.resource,
        &values.iter().collect::<Vec<_>>(),
        meta,
        include,
        now_secs(),
    );
    Ok(Served::Response(json_response(&body)))
}

/// Before a request of `key` takes its reference: waits, if the registry says so, while
/// the key's namespace group is decided from the requests in flight (`registry::Gather`:
/// coalescing from the first request). Away from its seat meanwhile — a waiting burst
/// holding every seat would queue the rest of itself — and with no reference taken, so a
/// client that leaves while it waits leaves nothing behind.
async fn gather(state: &ApiState, seat: &mut SeatSlot<'_>, key: &Key) -> Result<(), ApiError> {
    let waiting = state
        .registry
        .send(registry::Gather { key: key.clone() })
        .await
        .map_err(|_| ApiError::service_unavailable("kcache is shutting down"))?;
    if waiting.is_some() {
        seat.away(registry::gathered(waiting)).await;
        seat.back().await?;
    }
    Ok(())
}

/// A snapshot of `key`, or of a running key covering it, `at` the state asked — at least
/// as new as a resourceVersion, at least as new as the upstream was when the request
/// arrived (consistent), or exactly at one — holding that key for the grace period; the
/// key it is of and the snapshot, or `Err` with the reason when the API server should
/// answer instead.
async fn read(
    state: &ApiState,
    (user, seat): (&UserInfo, &mut SeatSlot<'_>),
    key: Key,
    at: At,
) -> Result<Result<(Key, cached_object::Snapshot), Reason>, ApiError> {
    gather(state, seat, &key).await?;
    let held = state
        .registry
        .send(Hold {
            key: key.clone(),
            duration: state.cache.grace_period(),
            user: Some(user.username.clone()),
        })
        .await
        .map_err(|_| ApiError::service_unavailable("kcache is shutting down"))?;
    let held = match held {
        Ok(held) => held,
        // Past the key budget: the API server answers reads as well as the cache would.
        Err(e) => {
            tracing::debug!(error = %e, "no new key; forwarding upstream");
            return Ok(Err(Reason::KeyBudget));
        }
    };
    let (min_rv, exact) = match at {
        At::NotOlderThan(rv) => (rv, None),
        At::Consistent => (0, None),
        At::Exact(rv) => (rv, Some(rv)),
    };
    // Read through a covering key, the snapshot holds only what the key asked for could
    // (a kubelet's list of one Secret through its namespace's key: one object, not the
    // namespace's). Whether a key parks is unchanged by it: only a name key parks
    // (`Key::parks`), and a name key is never another's cover.
    let asked = (held.key != key).then_some(key);
    // A consistent read asks for the upstream's state when it arrived. And a deleted
    // credential must not stay readable: a parked key (its objects all immutable, no
    // upstream watch) hears of a deletion or re-creation only when next verified; a
    // watching key hears of it a moment after a watch of the API server's own does (its
    // events travel one more hop). A consistent read, a Secret's key and a parked key are
    // proven as new as the upstream before they answer (one batched probe per key however
    // many read at once), then read. A state of the past is what the API server's
    // snapshot at that resourceVersion holds, deletions after it included: nothing to
    // prove. Only whether a key parks needs its snapshot to tell.
    let proven = match at {
        At::Exact(_) => false,
        At::Consistent => true,
        At::NotOlderThan(_) => holds_credentials(&held.key),
    };
    if !proven {
        let snap = match snapshot(&held.addr, (min_rv, exact), asked.clone(), seat).await? {
            Ok(snap) => snap,
            Err(reason) => return Ok(Err(reason)),
        };
        if exact.is_some() || !parks(state, &held.key, &snap) {
            seat.back().await?;
            return Ok(Ok((held.key, snap)));
        }
    }
    if let Err(e) = seat.away(state.fresh.prove(&held.key, &held.addr)).await {
        tracing::info!(error = %e, "read not proven fresh; forwarding upstream");
        return Ok(Err(Reason::NotFresh));
    }
    let snap = match snapshot(&held.addr, (min_rv, None), asked, seat).await? {
        Ok(snap) => snap,
        Err(reason) => return Ok(Err(reason)),
    };
    // The cache has work for the request again: its seat first.
    seat.back().await?;
    Ok(Ok((held.key, snap)))
}

/// Whether `key` holds Secrets: reads of them are proven fresh (`read`).
fn holds_credentials(key: &Key) -> bool {
    key.resource.group.is_empty() && key.resource.resource == "secrets"
}

/// Whether `key` holding `snap` parks (`Key::parks`) in this configuration: it may not
/// have heard of the latest deletion or re-creation.
fn parks(state: &ApiState, key: &Key, snap: &cached_object::Snapshot) -> bool {
    state.cache.immutable_stop_watch && key.parks(snap.objects.iter().map(|o| &**o))
}

/// The key's snapshot at `min_rv` or later (its state at `at`, if given), of `asked`
/// alone when the key covers it, or `Err` with the reason when the API server should
/// answer instead. A key not ready yet (its first sync, or behind `min_rv`) is waited for
/// without the seat.
async fn snapshot(
    addr: &Addr<cached_object::CachedObject>,
    (min_rv, at): (u64, Option<u64>),
    asked: Option<Key>,
    seat: &mut SeatSlot<'_>,
) -> Result<Result<cached_object::Snapshot, Reason>, ApiError> {
    let tried = addr.send(TryRead {
        min_rv,
        at,
        asked: asked.clone(),
    });
    let read = match tried.await {
        Ok(Some(read)) => Ok(read),
        _ => seat.away(addr.send(Read { min_rv, at, asked })).await,
    };
    match read {
        Ok(Ok(snap)) => Ok(Ok(snap)),
        Ok(Err(cached_object::Error::TooLargeResourceVersion { requested, current })) => {
            Err(ApiError::too_large_resource_version(requested, current))
        }
        // Older than the key's history: the API server keeps more (its snapshots, etcd).
        Ok(Err(e @ cached_object::Error::TooOld { .. })) => {
            tracing::debug!(error = %e, "exact read older than the key's history");
            Ok(Err(Reason::History))
        }
        // Not synced in time, or stopping: the API server can still answer.
        Ok(Err(e)) => {
            tracing::info!(error = %e, "cache cannot answer; forwarding upstream");
            Ok(Err(Reason::NotReady))
        }
        Err(_) => Ok(Err(Reason::NotReady)),
    }
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn json_response(v: &Value) -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").json(v)
}
