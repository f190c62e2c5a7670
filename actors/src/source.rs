//! Where a CachedObject's events come from: today the upstream API server (one list+watch
//! per key); the multi-replica fan-out adds a NATS mirror producing the same messages.
//!
//! The upstream source runs `core::upstream::step` against a real `kube::Client`: it only
//! does the I/O the state machine asks for, and reports lists, events and progress to its
//! CachedObject over a bounded channel (so a slow key slows its own upstream read, nothing else).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Recipient;
use bytes::Bytes;
use futures::StreamExt;
use thiserror::Error;
use tokio::sync::{mpsc, Mutex, Semaphore};

use crate::config::CacheConfig;
use crate::core::backfill::Replay;
use crate::core::key::Key;
use crate::core::lines::Lines;
use crate::core::list_stream::ListSplitter;
use crate::core::object::EventType;
use crate::core::object::{self, Object, Schema, WireEvent};
use crate::core::upstream::{step, Action, Backoff, Input, State};
use crate::feed::{
    Counted, KeyStatus, ReplayCmd, SourceCmd, SourceFactory, SourceHandle, SourceMsg, TakeSnapshot,
};
use crate::health::UpstreamHealth;
use crate::metrics as m;
use crate::upstream_pool::UpstreamClients;

#[derive(Debug, Error)]
pub enum Error {
    #[error("upstream list of {key} failed: {source}")]
    ListFailed {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("upstream list of {key} returned no usable resourceVersion")]
    NoResourceVersion { key: String },
    /// The list's body is not a list of objects kcache can read (`core::object`).
    #[error("upstream list of {key} is not usable: {source}")]
    ListUnreadable {
        key: String,
        #[source]
        source: object::Error,
    },
    #[error("upstream watch of {key} failed to start: {source}")]
    WatchStartFailed {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("upstream watch of {key} failed: {source}")]
    WatchFailed {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("upstream watch of {key} went silent for {secs} s")]
    WatchSilent { key: String, secs: u64 },
    /// A streaming list that ended, or sent what no streaming list sends, before its
    /// initial-events-end bookmark.
    #[error("upstream streaming list of {key} ended before its initial events did: {what}")]
    StreamingListCut { key: String, what: String },
    #[error("replay of {key} holds more than the {max} events its window has room for")]
    ReplayTooLong { key: String, max: usize },
    /// A tail watch (`UpstreamSource::tail`) that ended before it said whether the key
    /// changed up to the resourceVersion it was asked about.
    #[error("upstream watch of {key} ended before it reached resourceVersion {until}")]
    TailCut { key: String, until: u64 },
    #[error("upstream watch of {key} proves nothing: {source}")]
    TailUnordered {
        key: String,
        #[source]
        source: crate::core::fresh::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shared upstream budget: concurrent lists and a pace for list/watch starts, so a burst
/// of new keys (a node's kubelet starting, a replica restarting) cannot flood the API server.
/// Shared by every key's source task, not owned by an actor: a source waits its turn on a
/// semaphore and a start time (the waiting is the point), which a message round trip per
/// start would only add to.
pub struct UpstreamLimits {
    lists: Semaphore,
    next_slot: Mutex<Instant>,
    interval: Duration,
    /// The upstream refused a streaming list: every key lists instead from then on (an
    /// upstream is one API server version for all keys).
    no_streaming_lists: AtomicBool,
}

impl UpstreamLimits {
    pub fn new(max_concurrent_lists: usize, qps: u32) -> Self {
        UpstreamLimits {
            lists: Semaphore::new(max_concurrent_lists.max(1)),
            next_slot: Mutex::new(Instant::now()),
            interval: Duration::from_secs(1) / qps.max(1),
            no_streaming_lists: AtomicBool::new(false),
        }
    }

    /// Remembers that the upstream does not serve streaming lists, saying why once.
    fn refuse_streaming_lists(&self, key: &Key, why: &str) {
        if !self.no_streaming_lists.swap(true, Ordering::Relaxed) {
            tracing::warn!(%key, why, "the upstream does not serve streaming lists; keys list instead");
        }
    }

    async fn pace(&self) {
        let wait = {
            let mut next = self.next_slot.lock().await;
            let now = Instant::now();
            let slot = (*next).max(now);
            *next = slot + self.interval;
            slot - now
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Sources that list and watch the upstream API server.
pub struct UpstreamSource {
    clients: Arc<UpstreamClients>,
    health: Arc<UpstreamHealth>,
    cfg: Arc<CacheConfig>,
    limits: Arc<UpstreamLimits>,
}

impl UpstreamSource {
    /// `health` hears of every upstream request's outcome.
    pub fn new(
        clients: Arc<UpstreamClients>,
        cfg: Arc<CacheConfig>,
        health: Arc<UpstreamHealth>,
    ) -> Self {
        let limits = Arc::new(UpstreamLimits::new(
            cfg.upstream_max_concurrent_lists,
            cfg.upstream_qps,
        ));
        UpstreamSource {
            clients,
            health,
            cfg,
            limits,
        }
    }
}

impl UpstreamSource {
    /// Starts a list+watch of `key`; with `resume`, the first action is a watch from that
    /// RV (a new owner continuing where its mirror was), relisting only on 410.
    pub fn start_at(
        &self,
        key: &Key,
        resume: Option<u64>,
    ) -> (SourceHandle, mpsc::Receiver<SourceMsg>) {
        let (tx, events) = mpsc::channel(64);
        let (commands, cmd_rx) = mpsc::channel(4);
        let run = Run {
            up: self.reader(key),
            cfg: self.cfg.clone(),
            key: key.clone(),
            tx,
            cmds: cmd_rx,
            streaming: std::sync::Mutex::new(None),
        };
        let initial = match resume {
            Some(rv) if rv > 0 => State::Watching { rv },
            _ => State::Empty { from: None },
        };
        let task = tokio::spawn(run.run(initial));
        (SourceHandle::new(commands, task), events)
    }
}

impl UpstreamSource {
    fn reader(&self, key: &Key) -> Reader {
        Reader {
            clients: self.clients.clone(),
            health: self.health.clone(),
            limits: self.limits.clone(),
            key: key.clone(),
            schema: Schema::of(&key.resource.group, &key.resource.resource),
        }
    }

    /// Opens a watch of `key` from its progress `from` for a freshness proof
    /// (`core::fresh::Tail`): once open, the upstream has registered it, and
    /// [`TailWatch::until`] reads it. `services::fresh` says why it is opened before the
    /// consistent read whose resourceVersion it is read to.
    pub async fn open_tail(&self, key: &Key, from: u64) -> Result<TailWatch> {
        self.reader(key).open_tail(from).await
    }

    /// Replays `key` from `from` up to `to` in a task of its own and sends the answer
    /// (`SourceMsg::Replayed`) to `tx`: for a source that holds no upstream watch of its
    /// own (a fleet mirror).
    pub fn spawn_replay(&self, key: &Key, cmd: ReplayCmd, tx: mpsc::Sender<SourceMsg>) {
        tokio::spawn(self.reader(key).replay(cmd, tx));
    }
}

impl SourceFactory for UpstreamSource {
    fn start(
        &self,
        key: &Key,
        _status: &Arc<KeyStatus>,
        _snapshots: Recipient<TakeSnapshot>,
    ) -> (SourceHandle, mpsc::Receiver<SourceMsg>) {
        self.start_at(key, None)
    }

    fn count(
        &self,
        key: &Key,
        names_up_to: usize,
    ) -> futures::future::BoxFuture<'static, Option<Counted>> {
        let reader = self.reader(key);
        Box::pin(async move {
            match reader.count(names_up_to).await {
                Ok(n) => Some(n),
                Err(error) => {
                    tracing::warn!(key = %reader.key, %error, "cannot count the key's objects upstream");
                    None
                }
            }
        })
    }
}

/// `timeoutSeconds` of a replay's upstream watch (`Reader::replay`).
const REPLAY_WATCH_SECS: u64 = 3;

/// Longest upstream watch line accepted: etcd's default request limit is 1.5 MiB per
/// object, and JSON can escape that to several times as many bytes.
const MAX_EVENT_LINE: usize = 64 << 20;

/// Sends a request and returns its response body; error answers become
/// `kube::Error::Api` with the server's `Status`, as kube-rs's `request` does.
async fn send(
    client: &kube::Client,
    req: http::Request<Vec<u8>>,
) -> Result<kube::client::Body, kube::Error> {
    use http_body_util::BodyExt;
    let (mut parts, body) = req.into_parts();
    // Event lines are small and must arrive at once; gzip would batch them. Lists are
    // read by kcache itself.
    parts.headers.insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    );
    let res = client
        .send(http::Request::from_parts(
            parts,
            kube::client::Body::from(body),
        ))
        .await?;
    let code = res.status();
    if code.is_client_error() || code.is_server_error() {
        let bytes = res.into_body().collect().await?.to_bytes();
        return Err(kube::Error::Api(Box::new(status_of(&bytes, code.as_u16()))));
    }
    Ok(res.into_body())
}

/// The `Status` in an error answer or ERROR event, or one made of its text.
fn status_of(bytes: &[u8], code: u16) -> kube::core::Status {
    serde_json::from_slice::<kube::core::Status>(bytes).unwrap_or_else(|_| {
        kube::core::Status::failure(String::from_utf8_lossy(bytes).trim(), "").with_code(code)
    })
}

/// Starts a watch request and decodes its body line by line ([`Lines`]) into events whose
/// objects keep the bytes the upstream sent (`core::object`); what kube-rs's
/// `request_events` does, without its 8 KiB buffer per stream or a parse into a tree.
async fn watch_events(
    client: &kube::Client,
    req: http::Request<Vec<u8>>,
    schema: Schema,
) -> Result<impl futures::Stream<Item = Result<WireEvent, kube::Error>>, kube::Error> {
    use http_body_util::BodyExt;
    struct St {
        body: kube::client::Body,
        lines: Lines,
        ready: std::collections::VecDeque<Bytes>,
        done: bool,
        schema: Schema,
    }
    let st = St {
        body: send(client, req).await?,
        lines: Lines::new(MAX_EVENT_LINE),
        ready: Default::default(),
        done: false,
        schema,
    };
    Ok(futures::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(line) = st.ready.pop_front() {
                let ev = object::parse_line(&line, st.schema).map_err(|e| {
                    // A bare `Status` instead of an event: the server's error answer.
                    match serde_json::from_slice::<kube::core::Status>(&line) {
                        Ok(status) if status.code != 0 => kube::Error::Api(Box::new(status)),
                        _ => kube::Error::ReadEvents(std::io::Error::other(e)),
                    }
                });
                return Some((ev, st));
            }
            if st.done {
                return None;
            }
            match st.body.frame().await {
                None => st.done = true,
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(e), st));
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if let Err(e) = st.lines.push(data, &mut st.ready) {
                        st.done = true;
                        return Some((Err(kube::Error::ReadEvents(std::io::Error::other(e))), st));
                    }
                }
            }
        }
    }))
}

/// Counts an open upstream watch for as long as it lives, even if the task is aborted.
struct WatchGauge;

impl WatchGauge {
    fn open() -> Self {
        metrics::gauge!(m::UPSTREAM_WATCHES).increment(1.0);
        WatchGauge
    }
}

impl Drop for WatchGauge {
    fn drop(&mut self) {
        metrics::gauge!(m::UPSTREAM_WATCHES).decrement(1.0);
    }
}

/// The upstream reads of one key, shared by its source and its replays.
#[derive(Clone)]
struct Reader {
    clients: Arc<UpstreamClients>,
    health: Arc<UpstreamHealth>,
    limits: Arc<UpstreamLimits>,
    key: Key,
    /// What the header of the key's objects holds (`core::object`).
    schema: Schema,
}

struct Run {
    up: Reader,
    cfg: Arc<CacheConfig>,
    key: Key,
    tx: mpsc::Sender<SourceMsg>,
    cmds: mpsc::Receiver<SourceCmd>,
    /// A streaming list's stream past its initial events: the watch that follows it. In
    /// a mutex only so that `&Run` may cross an `.await` (the stream is `Send`, not
    /// `Sync`); only `&mut self` methods touch it (`get_mut`: never locked).
    streaming: std::sync::Mutex<Option<Streaming>>,
}

/// An upstream watch's events.
type Events = Pin<Box<dyn futures::Stream<Item = Result<WireEvent, kube::Error>> + Send>>;

/// A streaming list's stream once its initial events ended at `rv`.
struct Streaming {
    rv: u64,
    conn: crate::upstream_pool::Checkout,
    events: Events,
}

/// Where an upstream watch starts.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// With the events after this RV.
    After(u64),
    /// As a streaming list: the state (at least as new as the RV, when given) as ADDED
    /// events, the initial-events-end bookmark, then events.
    Stream(Option<u64>),
}

/// The outcome of one watch stream.
enum WatchEnd {
    Ended,
    Gone,
    Parked,
    Failed(Option<Duration>),
    /// The CachedObject is gone: stop.
    Closed,
}

impl Reader {
    fn uri(&self, params: &[(&str, String)]) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        if let Some(fs) = self.key.upstream_field_selector() {
            q.append_pair("fieldSelector", &fs);
        }
        for (k, v) in params {
            q.append_pair(k, v);
        }
        format!("{}?{}", self.key.upstream_path(), q.finish())
    }

    /// Lists the key: its objects keep the upstream's bytes (`core::object`), with the
    /// `kind` and `apiVersion` list items lack and watch events carry added once here.
    async fn list_params(&self, params: &[(&str, String)]) -> Result<(Vec<Object>, u64)> {
        use http_body_util::BodyExt;
        self.limits.pace().await;
        // A closed semaphore cannot happen (never closed); treat it as no limit.
        let _permit = self.limits.lists.acquire().await.ok();
        metrics::counter!(m::UPSTREAM_LISTS, "group" => self.key.resource.group.clone(), "resource" => self.key.resource.resource.clone()).increment(1);
        let failed = |source| Error::ListFailed {
            key: self.key.to_string(),
            source,
        };
        let uri = self.uri(params);
        let req = http::Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(Vec::new())
            .map_err(|e| failed(kube::Error::HttpError(e)))?;
        let conn = self.clients.checkout();
        let mut body = send(conn.client(), req).await.map_err(failed)?;
        // Items are split out and parsed as the body arrives (`core::list_stream`): a
        // list is never held whole beside its objects.
        let unreadable = |source: object::Error| Error::ListUnreadable {
            key: self.key.to_string(),
            source,
        };
        let (kind, api_version) = (&self.key.resource.kind, self.key.resource.api_version());
        let mut splitter = ListSplitter::new(MAX_EVENT_LINE);
        let mut raw = Vec::new();
        let mut items = Vec::new();
        let mut read = 0;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(failed)?.into_data() else {
                continue;
            };
            read += data.len();
            splitter
                .push(data, &mut raw)
                .map_err(|e| unreadable(object::Error::List(e.to_string())))?;
            for item in raw.drain(..) {
                let o = Object::parse_copy(&item, self.schema, kind, &api_version)
                    .map_err(unreadable)?;
                items.push(o);
            }
        }
        drop(body);
        let rv = splitter
            .finish()
            .map_err(|e| unreadable(object::Error::List(e.to_string())))?;
        if read > crate::memory::TRIM_AFTER_BYTES {
            // The frames are gone, the objects stay: return the holes they left.
            crate::memory::release_freed();
        }
        let rv = rv.ok_or_else(|| Error::NoResourceVersion {
            key: self.key.to_string(),
        })?;
        Ok((items, rv))
    }

    /// How many objects the key holds upstream: a list of at most `names_up_to` objects'
    /// metadata (at least one), whose `remainingItemCount` says how many more there are;
    /// with their names when that list was all of them.
    async fn count(&self, names_up_to: usize) -> Result<Counted> {
        use http_body_util::BodyExt;
        self.limits.pace().await;
        let failed = |source| Error::ListFailed {
            key: self.key.to_string(),
            source,
        };
        let limit = names_up_to.max(1);
        let req = http::Request::get(self.uri(&[("limit", limit.to_string())]))
            // Names only: the API server sends each object's metadata, not its data.
            .header(
                http::header::ACCEPT,
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
            )
            .body(Vec::new())
            .map_err(|e| failed(kube::Error::HttpError(e)))?;
        let conn = self.clients.checkout();
        let body = send(conn.client(), req).await.map_err(failed)?;
        let bytes = body.collect().await.map_err(failed)?.to_bytes();
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(rename = "remainingItemCount")]
            remaining: Option<u64>,
            #[serde(rename = "continue", default)]
            next: String,
        }
        #[derive(serde::Deserialize)]
        struct Name {
            #[serde(default)]
            name: String,
        }
        #[derive(serde::Deserialize)]
        struct Item {
            metadata: Name,
        }
        #[derive(serde::Deserialize)]
        struct Page {
            metadata: Meta,
            items: Vec<Item>,
        }
        let page: Page = serde_json::from_slice(&bytes).map_err(|e| Error::ListUnreadable {
            key: self.key.to_string(),
            source: object::Error::List(e.to_string()),
        })?;
        let objects = page.items.len() as u64 + page.metadata.remaining.unwrap_or(0);
        let whole = page.metadata.next.is_empty() && page.metadata.remaining.unwrap_or(0) == 0;
        Ok(Counted {
            objects,
            names: (whole && names_up_to > 1)
                .then(|| page.items.into_iter().map(|i| i.metadata.name).collect()),
        })
    }

    async fn list_with(&self, rv: u64, matching: &str) -> Result<(Vec<Object>, u64)> {
        self.list_params(&[
            ("resourceVersion", rv.to_string()),
            ("resourceVersionMatch", matching.to_string()),
        ])
        .await
    }

    /// Starts a watch of the key from `rv` with bookmarks, ending after `timeout_secs`;
    /// the checkout is the stream's share of its upstream connection, to hold as long.
    async fn open_watch(
        &self,
        start: Start,
        timeout_secs: u64,
        paced: bool,
    ) -> Result<(crate::upstream_pool::Checkout, Events), kube::Error> {
        if paced {
            self.limits.pace().await;
        }
        let mut params = vec![("watch", "true".to_string())];
        match start {
            Start::After(rv) => params.push(("resourceVersion", rv.to_string())),
            Start::Stream(rv) => {
                params.push(("sendInitialEvents", "true".into()));
                params.push(("resourceVersionMatch", "NotOlderThan".into()));
                if let Some(rv) = rv {
                    params.push(("resourceVersion", rv.to_string()));
                }
            }
        }
        params.push(("allowWatchBookmarks", "true".into()));
        params.push(("timeoutSeconds", timeout_secs.to_string()));
        let req = http::Request::get(self.uri(&params))
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        let conn = self.clients.checkout();
        let stream = watch_events(conn.client(), req, self.schema).await?;
        Ok((conn, Box::pin(stream)))
    }

    /// Answers `SourceCmd::Replay`: the key at exactly `from`, then a watch from `from`
    /// collecting events up to `to`. The watch ends at the first event at or past `to`
    /// (RVs are unique), at a bookmark at or past `to`, or when the upstream ends it
    /// (`REPLAY_WATCH_SECS`): a 1.20 bookmark carries the last RV its watch cache
    /// processed for the resource, often below `to` (an etcd revision that other
    /// resources moved on), so the end of the stream, seconds after the key's list, is
    /// the evidence that the cache sent what it had. `core::backfill` then checks the
    /// events reach the key's state at `to`. More events than `max_events` (the window's
    /// room), a 410 or a failure answer `None`.
    async fn replay(self, cmd: ReplayCmd, tx: mpsc::Sender<SourceMsg>) {
        let ReplayCmd {
            from,
            to,
            max_events,
        } = cmd;
        let replay = match self.replay_from(from, to, max_events).await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::info!(key = %self.key, from, error = %e, "cannot replay the key from an older resourceVersion");
                None
            }
        };
        let _ = tx.send(SourceMsg::Replayed { from, replay }).await;
    }

    async fn replay_from(&self, from: u64, to: u64, max_events: usize) -> Result<Replay> {
        let (at_from, _) = self.list_with(from, "Exact").await?;
        let mut replay = Replay {
            at_from,
            events: Vec::new(),
        };
        if from >= to {
            return Ok(replay);
        }
        let mut watch = ShortWatch::open(self, from, true).await?;
        loop {
            let Some(event) = watch.next().await? else {
                return Ok(replay);
            };
            let (kind, object) = match event {
                WireEvent::Object { kind, object } => (kind, object),
                WireEvent::Bookmark { rv, .. } => {
                    if rv >= to {
                        return Ok(replay);
                    }
                    continue;
                }
                // `ShortWatch::next` answers an ERROR event with an error.
                WireEvent::Error(_) => continue,
            };
            let rv = object.rv();
            if rv > to {
                return Ok(replay);
            }
            if replay.events.len() >= max_events {
                return Err(Error::ReplayTooLong {
                    key: watch.key,
                    max: max_events,
                });
            }
            replay.events.push((kind, object, rv));
            if rv == to {
                return Ok(replay);
            }
        }
    }
}

/// A short upstream watch of one key from an RV, a replay's or a freshness tail's:
/// `REPLAY_WATCH_SECS`, so the upstream's cache sends its bookmark (two seconds before the
/// watch's deadline) after about one; the stream's end is the backstop.
struct ShortWatch {
    key: String,
    _conn: crate::upstream_pool::Checkout,
    events: Events,
    _gauge: WatchGauge,
}

impl ShortWatch {
    async fn open(reader: &Reader, from: u64, paced: bool) -> Result<ShortWatch> {
        let key = reader.key.to_string();
        let (conn, events) = reader
            .open_watch(Start::After(from), REPLAY_WATCH_SECS, paced)
            .await
            .map_err(|source| Error::WatchStartFailed {
                key: key.clone(),
                source,
            })?;
        Ok(ShortWatch {
            key,
            _conn: conn,
            events,
            _gauge: WatchGauge::open(),
        })
    }

    /// The next event, `None` once the upstream ended the watch; silence past the
    /// deadline, a failure or an ERROR event is an error.
    async fn next(&mut self) -> Result<Option<WireEvent>> {
        let give_up = Duration::from_secs(REPLAY_WATCH_SECS + 2);
        let key = || self.key.clone();
        match tokio::time::timeout(give_up, self.events.next()).await {
            Err(_) => Err(Error::WatchSilent {
                key: key(),
                secs: give_up.as_secs(),
            }),
            Ok(None) => Ok(None),
            Ok(Some(Err(source))) => Err(Error::WatchFailed { key: key(), source }),
            Ok(Some(Ok(WireEvent::Error(status)))) => Err(Error::WatchFailed {
                key: key(),
                source: kube::Error::Api(Box::new(status_of(&status, 500))),
            }),
            Ok(Some(Ok(ev))) => Ok(Some(ev)),
        }
    }
}

/// An open tail watch ([`UpstreamSource::open_tail`]).
pub struct TailWatch {
    from: u64,
    watch: ShortWatch,
}

impl TailWatch {
    /// Reads the watch until the upstream has sent every event of the key up to `until`:
    /// the RV whose state is the key's state at `until`.
    pub async fn until(mut self, until: u64) -> Result<u64> {
        use crate::core::fresh::{Tail, TailEvent};
        let mut tail = Tail::new(self.from, until);
        loop {
            let step = match self.watch.next().await? {
                None => {
                    return Err(Error::TailCut {
                        key: self.watch.key,
                        until,
                    })
                }
                Some(WireEvent::Object { object, .. }) => TailEvent::Change(object.rv()),
                Some(WireEvent::Bookmark { rv, .. }) => TailEvent::Bookmark(rv),
                // `ShortWatch::next` answers an ERROR event with an error.
                Some(WireEvent::Error(_)) => continue,
            };
            match tail.step(step) {
                Ok(Some(at)) => return Ok(at),
                Ok(None) => {}
                Err(source) => {
                    return Err(Error::TailUnordered {
                        key: self.watch.key,
                        source,
                    })
                }
            }
        }
    }
}

impl Reader {
    /// See [`UpstreamSource::open_tail`]. Unpaced, as the probe's list: the pace is the
    /// budget of key (re)starts, which a burst of consistent reads must not spend.
    async fn open_tail(&self, from: u64) -> Result<TailWatch> {
        Ok(TailWatch {
            from,
            watch: ShortWatch::open(self, from, false).await?,
        })
    }
}

impl Run {
    async fn run(mut self, initial: State) {
        let started = Instant::now();
        let now_ms = || started.elapsed().as_millis() as u64;
        let mut backoff = Backoff::new();
        let mut retry_after = None;
        let (mut state, mut action) = step(initial, Input::Start);
        // The last action was a successful list: its watch goes unpaced.
        let mut listed = false;
        loop {
            let after_list = std::mem::take(&mut listed);
            let input = match action {
                Action::List { rv: from } => match self.list(from).await {
                    Ok((items, rv)) => {
                        self.up.health.ok();
                        let frozen = self.frozen(&items);
                        // A list from a known RV follows a watch that could not go on (410):
                        // the events in between are gone.
                        let gap = from.is_some();
                        if self
                            .tx
                            .send(SourceMsg::Listed { items, rv, gap })
                            .await
                            .is_err()
                        {
                            return;
                        }
                        listed = true;
                        Input::Listed { rv, frozen }
                    }
                    Err(e) => {
                        retry_after = retry_after_of(&e);
                        self.report(e).await;
                        Input::ListFailed
                    }
                },
                Action::Watch { rv } => match self.watch(rv, &mut state, !after_list).await {
                    Ok(WatchEnd::Ended) => Input::WatchEnded,
                    Ok(WatchEnd::Gone) => Input::WatchFailed { gone: true },
                    Ok(WatchEnd::Parked) => Input::Progress {
                        rv: state.rv().unwrap_or(rv),
                        frozen: true,
                    },
                    Ok(WatchEnd::Failed(ra)) => {
                        retry_after = ra;
                        Input::WatchFailed { gone: false }
                    }
                    Ok(WatchEnd::Closed) => return,
                    Err(e) => {
                        retry_after = retry_after_of(&e);
                        self.report(e).await;
                        Input::WatchFailed { gone: false }
                    }
                },
                Action::Backoff => {
                    *self.streaming_mut() = None;
                    let delay = backoff.next(now_ms(), rand::random::<f64>(), retry_after.take());
                    tokio::time::sleep(delay).await;
                    action = state.resume();
                    continue;
                }
                Action::Park => {
                    // No upstream watch (a streaming list's stream included): wait for the
                    // verification timer or a probe.
                    *self.streaming_mut() = None;
                    let verify = Duration::from_secs(self.cfg.immutable_verify_secs.max(1));
                    tokio::select! {
                        _ = tokio::time::sleep(verify) => {}
                        cmd = self.cmds.recv() => match cmd {
                            None => return,
                            Some(SourceCmd::Replay(cmd)) => {
                                tokio::spawn(self.up.clone().replay(cmd, self.tx.clone()));
                                action = Action::Park;
                                continue;
                            }
                            Some(SourceCmd::Probe) => {}
                        },
                    }
                    Input::Verify
                }
                Action::Continue => {
                    action = state.resume();
                    continue;
                }
            };
            (state, action) = step(state, input);
        }
    }

    fn streaming_mut(&mut self) -> &mut Option<Streaming> {
        // A poisoned lock only means a panic elsewhere held it; the value is still whole.
        self.streaming
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the key parks on `items` (`Key::parks`), when configured to.
    fn frozen(&self, items: &[Object]) -> bool {
        self.cfg.immutable_stop_watch && self.key.parks(items)
    }

    async fn report(&self, e: Error) {
        self.up.health.failed();
        metrics::counter!(m::UPSTREAM_ERRORS, "group" => self.key.resource.group.clone(), "resource" => self.key.resource.resource.clone()).increment(1);
        tracing::warn!(key = %self.key, error = %e, "upstream request failed; backing off");
        let _ = self
            .tx
            .send(SourceMsg::Unhealthy {
                error: e.to_string(),
            })
            .await;
    }

    /// The key's (re)list: a streaming list where the upstream serves them (its watch
    /// cache sends the state as events, building no list; the stream goes on as the
    /// key's watch), else a list.
    async fn list(&mut self, rv: Option<u64>) -> Result<(Vec<Object>, u64)> {
        *self.streaming_mut() = None;
        if self.cfg.upstream_streaming_lists
            && !self.up.limits.no_streaming_lists.load(Ordering::Relaxed)
        {
            if let Some(listed) = self.stream_list(rv).await? {
                return Ok(listed);
            }
        }
        match rv {
            // NotOlderThan the last RV: a relist must never go back in time, which `0` could.
            Some(rv) => self.up.list_with(rv, "NotOlderThan").await,
            None => self.up.list_params(&[]).await,
        }
    }

    /// A streaming list of the key (state at least as new as `from`), its stream kept for
    /// the watch that follows; `None` when the upstream does not serve streaming lists: it
    /// refuses the parameters (a WatchList gate turned off), or — a server that ignores
    /// them — sends something else than ADDED events before its first bookmark.
    async fn stream_list(&mut self, from: Option<u64>) -> Result<Option<(Vec<Object>, u64)>> {
        let key = self.key.to_string();
        let timeout = self.cfg.upstream_watch_timeout_secs.max(1);
        // Paced, limited and counted as a list: its initial events are one.
        self.up.limits.pace().await;
        let permit = self.up.limits.lists.acquire().await.ok();
        let labels = [
            ("group", self.key.resource.group.clone()),
            ("resource", self.key.resource.resource.clone()),
        ];
        metrics::counter!(m::UPSTREAM_LISTS, &labels).increment(1);
        metrics::counter!(m::UPSTREAM_STREAMING_LISTS, &labels).increment(1);
        let refused = |code: u16| matches!(code, 400 | 422);
        let (conn, mut events) = match self
            .up
            .open_watch(Start::Stream(from), timeout, false)
            .await
        {
            Ok(opened) => opened,
            Err(kube::Error::Api(s)) if refused(s.code) => {
                self.up.limits.refuse_streaming_lists(&self.key, &s.message);
                return Ok(None);
            }
            Err(source) => return Err(Error::ListFailed { key, source }),
        };
        let idle = Duration::from_secs(timeout + 30);
        let cut = |what: String| Error::StreamingListCut {
            key: key.clone(),
            what,
        };
        let mut items = Vec::new();
        loop {
            let event = match tokio::time::timeout(idle, events.next()).await {
                Err(_) => return Err(cut(format!("silent for {} s", idle.as_secs()))),
                // Ended cleanly without its initial-events-end bookmark: a server that
                // ignores the parameters and sends no bookmark would do it on every try.
                Ok(None) => {
                    self.up.limits.refuse_streaming_lists(
                        &self.key,
                        &format!(
                            "the stream ended after {} objects without k8s.io/initial-events-end",
                            items.len()
                        ),
                    );
                    return Ok(None);
                }
                Ok(Some(Err(kube::Error::Api(s)))) if refused(s.code) && items.is_empty() => {
                    self.up.limits.refuse_streaming_lists(&self.key, &s.message);
                    return Ok(None);
                }
                Ok(Some(Err(source))) => return Err(Error::ListFailed { key, source }),
                Ok(Some(Ok(event))) => event,
            };
            match event {
                WireEvent::Object {
                    kind: EventType::Added,
                    object,
                } => items.push(object),
                WireEvent::Bookmark {
                    rv,
                    initial_events_end: true,
                } if rv > 0 => {
                    drop(permit);
                    *self.streaming_mut() = Some(Streaming { rv, conn, events });
                    return Ok(Some((items, rv)));
                }
                WireEvent::Object { kind, .. } => {
                    self.up.limits.refuse_streaming_lists(
                        &self.key,
                        &format!("a {kind:?} event among the initial events"),
                    );
                    return Ok(None);
                }
                WireEvent::Bookmark { .. } => {
                    self.up.limits.refuse_streaming_lists(
                        &self.key,
                        "a bookmark without k8s.io/initial-events-end before the initial events ended",
                    );
                    return Ok(None);
                }
                WireEvent::Error(status) => {
                    let s = status_of(&status, 500);
                    return Err(cut(format!("error {}: {}", s.code, s.message)));
                }
            }
        }
    }

    /// `paced`: false for the watch that follows the key's own list at once (the pair is
    /// one list-and-watch, as client-go's reflector runs it, and took one pace slot: the
    /// list). Pacing it too made every key's start — and, after an API server restart,
    /// every key's recovery — take two slots.
    async fn watch(&mut self, rv: u64, state: &mut State, paced: bool) -> Result<WatchEnd> {
        let timeout = self.cfg.upstream_watch_timeout_secs.max(1);
        let key = self.key.to_string();
        // The checkout is held while the stream lives: it counts against its HTTP/2
        // connection.
        // The streaming list's own stream, when it ended its initial events at `rv`.
        let (_conn, stream) = match self.streaming_mut().take().filter(|s| s.rv == rv) {
            Some(s) => (s.conn, s.events),
            None => match self.up.open_watch(Start::After(rv), timeout, paced).await {
                Ok(s) => s,
                Err(kube::Error::Api(s)) if s.code == 410 => return Ok(WatchEnd::Gone),
                Err(source) => return Err(Error::WatchStartFailed { key, source }),
            },
        };
        self.up.health.ok();
        let _gauge = WatchGauge::open();
        let mut stream = std::pin::pin!(stream);
        // A stream silent past its own timeout plus a margin is dead (a half-open TCP
        // connection after an API server crash): as kube-rs's idle timeout.
        let idle = Duration::from_secs(timeout + 30);
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(idle, stream.next()) => next,
                cmd = self.cmds.recv() => {
                    match cmd {
                        None => return Ok(WatchEnd::Closed),
                        Some(SourceCmd::Replay(cmd)) => {
                            // Its own task: the key's events go on meanwhile.
                            tokio::spawn(self.up.clone().replay(cmd, self.tx.clone()));
                            continue;
                        }
                        Some(SourceCmd::Probe) => {
                            // A plain list: the watch goes on beside it.
                            match self.up.list_params(&[]).await {
                                Ok((items, rv)) => {
                                    if self.tx.send(SourceMsg::Listed { items, rv, gap: false }).await.is_err() {
                                        return Ok(WatchEnd::Closed);
                                    }
                                    // Events at or below the probe's RV are dropped by the
                                    // CachedObject; the watch itself continues.
                                    (*state, _) = step(*state, Input::Progress { rv, frozen: false });
                                }
                                Err(e) => self.report(e).await,
                            }
                            continue;
                        }
                    }
                }
            };
            let event = match next {
                Err(_) => {
                    return Err(Error::WatchSilent {
                        key,
                        secs: idle.as_secs(),
                    })
                }
                Ok(None) => return Ok(WatchEnd::Ended),
                Ok(Some(Err(kube::Error::Api(s)))) if s.code == 410 => return Ok(WatchEnd::Gone),
                Ok(Some(Err(source))) => return Err(Error::WatchFailed { key, source }),
                Ok(Some(Ok(ev))) => ev,
            };
            let (msg, frozen) = match event {
                WireEvent::Object { kind, object } => {
                    // A name key holds one object: an immutable one added or modified
                    // freezes the key (a re-created Secret parks again).
                    let frozen =
                        kind != EventType::Deleted && self.frozen(std::slice::from_ref(&object));
                    let rv = object.rv();
                    (SourceMsg::Event { kind, object, rv }, frozen)
                }
                // A bookmark without a usable RV moves nothing.
                WireEvent::Bookmark { rv: 0, .. } => continue,
                WireEvent::Bookmark { rv, .. } => (SourceMsg::Progress { rv }, false),
                WireEvent::Error(status) => {
                    let s = status_of(&status, 500);
                    if s.code == 410 {
                        return Ok(WatchEnd::Gone);
                    }
                    tracing::warn!(key = %self.key, code = s.code, message = %s.message, "upstream watch error event");
                    let ra = s
                        .details
                        .as_ref()
                        .map(|d| Duration::from_secs(u64::from(d.retry_after_seconds)))
                        .filter(|d| !d.is_zero());
                    return Ok(WatchEnd::Failed(ra));
                }
            };
            let rv = match &msg {
                SourceMsg::Event { rv, .. } | SourceMsg::Progress { rv } => *rv,
                _ => 0,
            };
            if self.tx.send(msg).await.is_err() {
                return Ok(WatchEnd::Closed);
            }
            let (next_state, action) = step(*state, Input::Progress { rv, frozen });
            *state = next_state;
            if action == Action::Park {
                return Ok(WatchEnd::Parked);
            }
        }
    }
}

/// `Retry-After` of a throttled request (429), from the Status details the API server sends.
fn retry_after_of(e: &Error) -> Option<Duration> {
    let source = match e {
        Error::ListFailed { source, .. }
        | Error::WatchStartFailed { source, .. }
        | Error::WatchFailed { source, .. } => source,
        _ => return None,
    };
    match source {
        kube::Error::Api(s) if s.code == 429 => Some(Duration::from_secs(
            s.details
                .as_ref()
                .map(|d| u64::from(d.retry_after_seconds))
                .filter(|s| *s > 0)
                .unwrap_or(1),
        )),
        _ => None,
    }
}
