//! The clients under test, each logging what it sees ([`Log`]):
//!
//! - **reflectors**: `kube::runtime::reflector` over `kube::runtime::watcher` on every
//!   ConfigMap of the namespace, as an informer: list (a consistent read, kube-rs's
//!   default), watch from the list's resourceVersion, on a broken watch re-watch from
//!   the last resourceVersion (a bookmark's included), on 410 relist;
//! - **single-object watches**, the kubelet's pattern for a pod's ConfigMaps
//!   (`fieldSelector=metadata.name=X`), written out as client-go's reflector runs it: the
//!   first list from the cache (`resourceVersion=0`), watch from its resourceVersion, on
//!   a broken watch re-watch from the last one, on 410 relist with a consistent read
//!   (client-go's `relistResourceVersion` after "expired").
//!
//! Each has a home server ([`super::transport::Failover`]) and a stall switch: a client
//! told to stall stops reading its watch for a while (the slow-client fault).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::runtime::utils::Backoff;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Api;
use serde::Serialize;
use tokio::task::JoinHandle;

use super::observe::{now_ms, Log, Obs, SeenKind};

/// Entries a client's log may hold: a 10-minute soak at 10 writes/s gives a reflector
/// ~6,000 events; this leaves two orders of magnitude of room and still bounds memory.
pub const LOG_CAP: usize = 1_000_000;

/// Which objects a client watches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Namespace,
    Name(String),
}

impl Scope {
    pub fn covers(&self, name: &str) -> bool {
        match self {
            Scope::Namespace => true,
            Scope::Name(n) => n == name,
        }
    }
}

/// A client that stops reading until a time (ms since the soak began).
#[derive(Default)]
pub struct Stall(AtomicU64);

impl Stall {
    pub fn until(&self, at_ms: u64) {
        self.0.store(at_ms, Ordering::Relaxed);
    }

    async fn wait(&self) {
        loop {
            let until = self.0.load(Ordering::Relaxed);
            let now = now_ms();
            if now >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(until - now)).await;
        }
    }
}

/// Retry delays: 0.5 s doubling to 4 s. kube-rs's default goes to 30 s; a shorter cap
/// keeps the settle phase after the faults short without changing what is judged.
#[derive(Clone)]
struct Retry(Duration);

impl Default for Retry {
    fn default() -> Self {
        Retry(Duration::from_millis(500))
    }
}

impl Iterator for Retry {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(4));
        Some(d)
    }
}

impl Backoff for Retry {
    fn reset(&mut self) {
        self.0 = Duration::from_millis(500);
    }
}

fn name_of(cm: &ConfigMap) -> String {
    cm.metadata.name.clone().unwrap_or_default()
}

fn rv_of(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

enum View {
    Store(reflector::Store<ConfigMap>),
    One(Arc<Mutex<Option<u64>>>),
}

/// One running client.
pub struct Client {
    /// `home/kind-n`, e.g. `r1/reflector-0`, `apiserver/watch-c7`.
    pub label: String,
    pub home: String,
    pub scope: Scope,
    pub log: Arc<Log>,
    pub stall: Arc<Stall>,
    view: View,
    task: JoinHandle<()>,
}

impl Client {
    /// What the client believes exists now: name → resourceVersion.
    pub fn view(&self) -> BTreeMap<String, u64> {
        match &self.view {
            View::Store(s) => s.state().iter().map(|c| (name_of(c), rv_of(c))).collect(),
            View::One(one) => match (&self.scope, one.lock().ok().and_then(|g| *g)) {
                (Scope::Name(n), Some(rv)) => BTreeMap::from([(n.clone(), rv)]),
                _ => BTreeMap::new(),
            },
        }
    }

    pub fn stop(&self) {
        self.task.abort();
    }

    /// A reflector over the namespace's ConfigMaps.
    pub fn reflector(
        label: String,
        home: String,
        kube: kube::Client,
        log: Arc<Log>,
        ns: &str,
    ) -> Client {
        let api: Api<ConfigMap> = Api::namespaced(kube, ns);
        let (store, writer) = reflector::store();
        let stall = Arc::new(Stall::default());
        let stream =
            reflector(writer, watcher(api, watcher::Config::default())).backoff(Retry::default());
        let (l, s) = (log.clone(), stall.clone());
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut listing: Vec<(String, u64)> = Vec::new();
            loop {
                s.wait().await;
                let Some(ev) = stream.next().await else {
                    return;
                };
                let at_ms = now_ms();
                match ev {
                    Ok(watcher::Event::Init) => listing.clear(),
                    Ok(watcher::Event::InitApply(o)) => listing.push((name_of(&o), rv_of(&o))),
                    Ok(watcher::Event::InitDone) => l.push(Obs::Listed {
                        at_ms,
                        rv: None,
                        items: std::mem::take(&mut listing),
                    }),
                    Ok(watcher::Event::Apply(o)) => l.push(Obs::Event {
                        at_ms,
                        kind: SeenKind::Applied,
                        name: name_of(&o),
                        rv: rv_of(&o),
                    }),
                    Ok(watcher::Event::Delete(o)) => l.push(Obs::Event {
                        at_ms,
                        kind: SeenKind::Deleted,
                        name: name_of(&o),
                        rv: rv_of(&o),
                    }),
                    Err(e) => l.push(classify(at_ms, &e)),
                }
            }
        });
        Client {
            label,
            home,
            scope: Scope::Namespace,
            log,
            stall,
            view: View::Store(store),
            task,
        }
    }

    /// A kubelet-pattern watch of the ConfigMap `name`.
    pub fn single(
        label: String,
        home: String,
        kube: kube::Client,
        log: Arc<Log>,
        ns: &str,
        name: &str,
        start_after: Duration,
    ) -> Client {
        let api: Api<ConfigMap> = Api::namespaced(kube, ns);
        let stall = Arc::new(Stall::default());
        let one = Arc::new(Mutex::new(None));
        let run = run_single(
            api,
            name.to_string(),
            log.clone(),
            stall.clone(),
            one.clone(),
        );
        let task = tokio::spawn(async move {
            tokio::time::sleep(start_after).await;
            run.await
        });
        Client {
            label,
            home,
            scope: Scope::Name(name.to_string()),
            log,
            stall,
            view: View::One(one),
            task,
        }
    }
}

/// A kube-rs watcher error as a log entry: 410 (in the stream or as the watch request's
/// status) is [`Obs::Gone`].
fn classify(at_ms: u64, e: &watcher::Error) -> Obs {
    let gone = match e {
        watcher::Error::WatchError(s) => s.code == 410,
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 410,
        _ => false,
    };
    if gone {
        Obs::Gone {
            at_ms,
            how: e.to_string(),
        }
    } else {
        Obs::Error {
            at_ms,
            what: e.to_string(),
        }
    }
}

fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 410)
}

/// The single-object loop; `one` holds the object's resourceVersion (None: absent).
async fn run_single(
    api: Api<ConfigMap>,
    name: String,
    log: Arc<Log>,
    stall: Arc<Stall>,
    one: Arc<Mutex<Option<u64>>>,
) {
    let selector = format!("metadata.name={name}");
    let set = |v: Option<u64>| {
        if let Ok(mut g) = one.lock() {
            *g = v;
        }
    };
    let mut retry = Retry::default();
    // client-go: the first list may come from a cache; after "expired", a consistent one.
    let mut consistent = false;
    'relist: loop {
        let mut lp = ListParams::default().fields(&selector);
        if !consistent {
            lp = lp.match_any();
        }
        let list = match api.list(&lp).await {
            Ok(list) => list,
            Err(e) => {
                log.push(Obs::Error {
                    at_ms: now_ms(),
                    what: format!("list: {e}"),
                });
                tokio::time::sleep(retry.next().unwrap_or_default()).await;
                continue;
            }
        };
        let Some(mut rv) = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|s| s.parse::<u64>().ok())
        else {
            log.push(Obs::Error {
                at_ms: now_ms(),
                what: "list without a resourceVersion".into(),
            });
            tokio::time::sleep(retry.next().unwrap_or_default()).await;
            continue;
        };
        retry.reset();
        let items: Vec<(String, u64)> = list.items.iter().map(|c| (name_of(c), rv_of(c))).collect();
        set(items.iter().find(|(n, _)| *n == name).map(|(_, r)| *r));
        log.push(Obs::Listed {
            at_ms: now_ms(),
            rv: Some(rv),
            items,
        });
        loop {
            let wp = WatchParams::default().fields(&selector).timeout(290);
            let stream = match api.watch(&wp, &rv.to_string()).await {
                Ok(s) => s,
                Err(e) if is_gone(&e) => {
                    log.push(Obs::Gone {
                        at_ms: now_ms(),
                        how: format!("watch request: {e}"),
                    });
                    consistent = true;
                    continue 'relist;
                }
                Err(e) => {
                    log.push(Obs::Error {
                        at_ms: now_ms(),
                        what: format!("watch request: {e}"),
                    });
                    tokio::time::sleep(retry.next().unwrap_or_default()).await;
                    continue;
                }
            };
            let mut stream = std::pin::pin!(stream);
            loop {
                stall.wait().await;
                let Some(item) = stream.next().await else {
                    break; // closed (timeout or server): watch again from `rv`
                };
                let at_ms = now_ms();
                let (kind, obj) = match item {
                    Ok(WatchEvent::Added(o)) => (SeenKind::Added, o),
                    Ok(WatchEvent::Modified(o)) => (SeenKind::Modified, o),
                    Ok(WatchEvent::Deleted(o)) => (SeenKind::Deleted, o),
                    Ok(WatchEvent::Bookmark(b)) => {
                        if let Ok(r) = b.metadata.resource_version.parse() {
                            rv = r;
                        }
                        continue;
                    }
                    Ok(WatchEvent::Error(s)) if s.code == 410 => {
                        log.push(Obs::Gone {
                            at_ms,
                            how: format!("watch event: {}", s.message),
                        });
                        consistent = true;
                        continue 'relist;
                    }
                    Ok(WatchEvent::Error(s)) => {
                        log.push(Obs::Error {
                            at_ms,
                            what: format!("watch event {}: {}", s.code, s.message),
                        });
                        break;
                    }
                    Err(e) => {
                        log.push(Obs::Error {
                            at_ms,
                            what: format!("watch stream: {e}"),
                        });
                        break;
                    }
                };
                retry.reset();
                let r = rv_of(&obj);
                log.push(Obs::Event {
                    at_ms,
                    kind,
                    name: name_of(&obj),
                    rv: r,
                });
                set((kind != SeenKind::Deleted).then_some(r));
                rv = r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
