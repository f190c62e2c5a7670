//! The request plan: whether a request is the cache's to serve and what it asks of the
//! cache, decided once, purely, from the request and discovery. Every request the plan does
//! not serve is forwarded with a named reason; a served one carries its authorization
//! attributes and either the operation to run or the error to answer once authorized (the
//! API server authenticates and authorizes before it validates).
//!
//! What only the cache's state can tell (a key past its budget, a key not synced in time, a
//! parked key not proven fresh, an object the protobuf schema cannot express) is decided
//! when serving: those [`Reason`]s are [`Reason::AT_SERVE_TIME`].

use std::sync::Arc;

use kcache_actors::core::key::{route, Key, ResourceType};
use kcache_actors::core::page::Continue;
use kcache_actors::core::proto::Codec;
use kcache_actors::core::rv::{plan_get, plan_list, plan_watch, ListPlan, ListRead, Rv, WatchPlan};
use kcache_actors::core::selector::{FieldSelector, LabelSelector};

use crate::authz::Attributes;
use crate::discovery::Resources;
use crate::request::{is_keyable_name, parse_path, parse_query, Query, ResourcePath};
use crate::status::ApiError;
use crate::table::{self, IncludeObject, Negotiated, TableVersion};

/// What the plan reads of a request.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    pub method: &'a str,
    /// The raw (still percent-encoded) path.
    pub path: &'a str,
    pub query: &'a str,
    /// The Accept header; empty when absent or not a string.
    pub accept: &'a str,
    /// Any `Impersonate-*` header is present.
    pub impersonating: bool,
}

/// The plan for one request.
pub enum Plan {
    /// The API server answers, with the client's own credentials.
    Forward(Forward),
    /// Authenticated, authorized and answered by kcache.
    Serve(Box<Serve>),
}

/// Why a request goes to the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward {
    /// Not a GET: writes and every other verb are the API server's.
    Verb,
    /// `kubectl --as`: the API server authorizes `impersonate` and applies it; kcache
    /// never ignores it.
    Impersonation,
    /// Not a path kcache reads the way the API server does, a resource kcache does not
    /// cache (or discovery has not answered yet), a subresource, or a path the resource's
    /// scope does not route.
    Uncached,
    /// A cached resource asked for in a way the cache does not answer; counted in
    /// `kcache_cache_bypassed_total` by reason.
    Bypass(Arc<ResourceType>, Reason),
}

/// Why a GET of a cached resource is forwarded: the `reason` label of
/// `kcache_cache_bypassed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A query kcache cannot be sure to read as the API server does.
    Query,
    /// An Accept the cache does not answer (or a Table streaming list).
    Accept,
    /// A field selector the cache cannot serve for the resource.
    Selector,
    /// A selector's name or node name that cannot be a key.
    Name,
    /// A read the cache does not serve for its resourceVersion or paging: a get by name
    /// without a resourceVersion, a continue token that is not kcache's.
    Rv,
    /// An exact list (`Exact`, or a limit with `N`) older than the key's history
    /// (`core::history`): the API server reads it from its snapshots or etcd.
    History,
    /// The key would exceed a key budget.
    KeyBudget,
    /// The key is not synced in time, or stopping.
    NotReady,
    /// A consistent read (or a parked key's read) not proven fresh.
    NotFresh,
    /// An object the protobuf schema cannot express.
    Protobuf,
    /// A Table whose columns the upstream prints differently from kcache's printer for
    /// the resource (`crate::table::Columns`).
    Table,
}

impl Reason {
    pub const ALL: [Reason; 11] = [
        Reason::Query,
        Reason::Accept,
        Reason::Selector,
        Reason::Name,
        Reason::Rv,
        Reason::History,
        Reason::KeyBudget,
        Reason::NotReady,
        Reason::NotFresh,
        Reason::Protobuf,
        Reason::Table,
    ];

    /// The reasons only serving can find: they depend on the cache's state.
    pub const AT_SERVE_TIME: [Reason; 6] = [
        Reason::History,
        Reason::KeyBudget,
        Reason::NotReady,
        Reason::NotFresh,
        Reason::Protobuf,
        Reason::Table,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Query => "query",
            Reason::Accept => "accept",
            Reason::Selector => "selector",
            Reason::Name => "name",
            Reason::Rv => "rv",
            Reason::History => "history",
            Reason::KeyBudget => "key_budget",
            Reason::NotReady => "not_ready",
            Reason::NotFresh => "not_fresh",
            Reason::Protobuf => "protobuf",
            Reason::Table => "table",
        }
    }
}

/// The encoding a cache-served answer is written in, from the request's Accept header.
pub enum Format {
    Json,
    Table(TableVersion),
    /// A built-in kind, as protobuf.
    Protobuf(Arc<Codec>),
}

/// A request the cache serves.
pub struct Serve {
    pub resource: Arc<ResourceType>,
    /// The resource's discovery id (group, version, resource): its read warnings' key.
    pub id: (String, String, String),
    pub path: ResourcePath,
    pub query: Query,
    /// What is authorized, as the API server's request-info derives it.
    pub attrs: Attributes,
    pub format: Format,
    /// What to serve, or the error to answer, once the request is authorized.
    pub op: Result<Op, ApiError>,
}

/// What a served request asks of the cache.
pub enum Op {
    /// A GET by name (it decodes only `resourceVersion`: selectors, limits, watch and
    /// resourceVersionMatch are ignored, as upstream).
    /// `include` is a Table's `includeObject`; the API server parses it when it writes
    /// the answer, after reading: a read's own error (404, 504) comes first.
    Get {
        key: Key,
        name: String,
        namespace: Option<String>,
        min_rv: u64,
        include: Result<IncludeObject, ApiError>,
    },
    List {
        key: Key,
        /// The list's scope: its namespace, `None` cluster-wide (continue tokens name keys
        /// relative to it).
        namespace: Option<String>,
        label: LabelSelector,
        field: FieldSelector,
        /// The state read and the page cut.
        read: ListRead,
        include: Result<IncludeObject, ApiError>,
    },
    Watch(Box<WatchOp>),
    /// Found, once authorized, to be the API server's to answer.
    Forward(Reason),
}

/// A watch. Its own checks come after admission (a watch past the caps is a 429 before
/// its options are validated, as the API server's filters run before its handler).
pub struct WatchOp {
    pub key: Key,
    pub label: LabelSelector,
    pub field: FieldSelector,
    pub include: IncludeObject,
    pub timeout_seconds: Option<i64>,
    pub checked: Result<Admitted, ApiError>,
}

/// A watch's plan once admitted.
pub enum Admitted {
    Start(WatchStart),
    Forward(Reason),
}

pub struct WatchStart {
    pub plan: WatchPlan,
    /// A streaming list with the resourceVersion omitted: its state must be at least as
    /// new as the upstream's when it arrived (the reference cacher waits for etcd's
    /// current revision).
    pub consistent: bool,
    pub allow_bookmarks: bool,
}

/// The plan for `req`, with `resources` the cached resources as discovery describes them
/// (`None` until discovery answered: everything is forwarded).
pub fn plan(req: &Incoming, resources: Option<&Resources>) -> Plan {
    if req.method != "GET" {
        return Plan::Forward(Forward::Verb);
    }
    if req.impersonating {
        return Plan::Forward(Forward::Impersonation);
    }
    let Some(path) = parse_path(req.path) else {
        return Plan::Forward(Forward::Uncached);
    };
    let id = (
        path.group.clone(),
        path.version.clone(),
        path.resource.clone(),
    );
    let Some(resource) = resources
        .and_then(|r| r.get(&id))
        .filter(|r| fits_scope(&path, r))
        .cloned()
    else {
        return Plan::Forward(Forward::Uncached);
    };
    if path.subresource.is_some() {
        return Plan::Forward(Forward::Uncached);
    }
    let query = parse_query(req.query);
    if query.opaque {
        return Plan::Forward(Forward::Bypass(resource, Reason::Query));
    }
    // The kind's protobuf forms, if it has any: looked up only for a client that mentions
    // protobuf at all (JSON clients pay nothing for it).
    let codec = mentions_protobuf(req.accept)
        .then(|| Codec::for_kind(&resource.group, &resource.version, &resource.kind))
        .flatten();
    let format = match (table::negotiate(req.accept, codec.is_some()), codec) {
        (Negotiated::Json, _) => Format::Json,
        (Negotiated::Table(v), _) => Format::Table(v),
        (Negotiated::Protobuf, Some(c)) => Format::Protobuf(Arc::new(c)),
        (Negotiated::Protobuf, None) | (Negotiated::Forward, _) => {
            return Plan::Forward(Forward::Bypass(resource, Reason::Accept))
        }
    };
    let attrs = resource_attributes(&path, &query);
    let op = operation(&path, &query, &format, &resource);
    Plan::Serve(Box::new(Serve {
        resource,
        id,
        path,
        query,
        attrs,
        format,
        op,
    }))
}

/// Whether the path has the form the API server routes for the resource's scope; any
/// other is proxied, and the API server answers it (404). A cluster-scoped resource has
/// no `/namespaces/{ns}/` form (`/api/v1/namespaces/foo/namespaces/bar` would otherwise be
/// authorized in `foo` and answered with `bar`); a namespaced object has no cluster-wide
/// path by name (`/api/v1/secrets/s`).
fn fits_scope(rp: &ResourcePath, resource: &ResourceType) -> bool {
    if resource.namespaced {
        rp.name.is_none() || rp.namespace_prefix
    } else {
        !rp.namespace_prefix
    }
}

/// Whether an Accept header names protobuf (media types are case-insensitive).
fn mentions_protobuf(accept: &str) -> bool {
    const PB: &[u8] = b"vnd.kubernetes.protobuf";
    accept
        .as_bytes()
        .windows(PB.len())
        .any(|w| w.eq_ignore_ascii_case(PB))
}

/// The operation, in the order the API server validates: the errors a request earns come
/// in the order the API server finds them.
fn operation(
    rp: &ResourcePath,
    q: &Query,
    format: &Format,
    resource: &Arc<ResourceType>,
) -> Result<Op, ApiError> {
    // Only a Table reads includeObject; any other answer ignores it, as upstream.
    let include = match format {
        Format::Table(_) => IncludeObject::parse(q.include_object.as_deref())
            .map_err(|e| ApiError::bad_request(e.to_string())),
        _ => Ok(IncludeObject::default()),
    };
    let namespace = rp.namespace.as_deref().filter(|_| resource.namespaced);
    let Some(name) = &rp.name else {
        return list_or_watch(q, format, include, namespace, resource);
    };
    let Some(min_rv) = plan_get(q.watch_or_get_rv()?) else {
        return Ok(Op::Forward(Reason::Rv));
    };
    Ok(Op::Get {
        key: route(
            resource,
            namespace,
            Some(name),
            &FieldSelector::everything(),
        ),
        name: name.clone(),
        namespace: namespace.map(str::to_string),
        min_rv,
        include,
    })
}

/// A list or watch: the query decodes as the API server's `ListOptions`.
fn list_or_watch(
    q: &Query,
    format: &Format,
    include: Result<IncludeObject, ApiError>,
    namespace: Option<&str>,
    resource: &Arc<ResourceType>,
) -> Result<Op, ApiError> {
    // A watch's answer is written as it is started: its includeObject is checked first.
    let include = if q.watch() { Ok(include?) } else { include };
    let label = LabelSelector::parse(&q.label_selector)
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let field = FieldSelector::parse(&q.field_selector)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let limit = q.limit()?;
    let timeout_seconds = q.timeout_seconds()?;
    let servable = field
        .validate_for(&resource.group, &resource.resource, resource.namespaced)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if !servable {
        return Ok(Op::Forward(Reason::Selector));
    }
    // A selector value becomes a key (an upstream selector, a NATS subject): only names
    // kcache can carry verbatim; others are for the API server to answer.
    if ["metadata.name", "spec.nodeName"]
        .iter()
        .filter_map(|f| field.equality_value(f))
        .any(|v| !is_keyable_name(v))
    {
        return Ok(Op::Forward(Reason::Name));
    }
    let key = route(resource, namespace, None, &field);
    if q.watch() {
        return Ok(Op::Watch(Box::new(WatchOp {
            key,
            label,
            field,
            include: include?,
            timeout_seconds,
            checked: watch_checks(q, format),
        })));
    }
    // As the API server: ListOptions validation (422), then the storage's: the continue
    // token, then the resourceVersion (400 for a list).
    q.validate_list_options(false)?;
    let cont = q
        .continue_token
        .as_deref()
        .map(Continue::read)
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("invalid continue token: {e}")))?;
    let rv = match &cont {
        // The API server's token: its to read, whatever else the query says.
        Some(Continue::Upstream) => return Ok(Op::Forward(Reason::Rv)),
        Some(Continue::Kcache(_)) => match q.resource_version.as_deref() {
            None | Some("") => Rv::Unset,
            Some("0") => Rv::Any,
            Some(_) => {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ))
            }
        },
        None => q.list_rv()?,
    };
    let ListPlan::Cache(read) = plan_list(rv, q.rv_match(), limit, cont.as_ref()) else {
        return Ok(Op::Forward(Reason::Rv));
    };
    Ok(Op::List {
        key,
        namespace: namespace.map(str::to_string),
        label,
        field,
        read,
        include,
    })
}

/// A watch's checks once admitted.
fn watch_checks(q: &Query, format: &Format) -> Result<Admitted, ApiError> {
    // As the API server: ListOptions validation (422), then the storage's parse of the
    // resourceVersion (500 for a watch).
    q.validate_list_options(true)?;
    let rv = q.watch_or_get_rv()?;
    // Planned on the defaulted options: a watch from "" or 0 is a streaming list.
    let send_initial_events = q.list_options(true).send_initial_events;
    // A streaming list as Table: the reference server sends the column definitions in the
    // first event only and its initial-events-end bookmark as a Table (so that a reflector,
    // which cannot store Tables, never syncs); kcache's Table encoder does neither, so the
    // API server answers these itself.
    if matches!(format, Format::Table(_)) && send_initial_events == Some(true) {
        return Ok(Admitted::Forward(Reason::Accept));
    }
    let allow_bookmarks = q.allow_watch_bookmarks();
    Ok(Admitted::Start(WatchStart {
        plan: plan_watch(rv, send_initial_events, allow_bookmarks),
        consistent: rv == Rv::Unset && send_initial_events == Some(true),
        allow_bookmarks,
    }))
}

/// The request's attributes as the API server's request-info derives them: a path with a
/// name is a `get` (whatever `watch` says); without one, `watch` or `list`, named by a
/// `metadata.name` field selector when the query decodes as `ListOptions` and the name is
/// a valid path segment.
fn resource_attributes(rp: &ResourcePath, q: &Query) -> Attributes {
    let verb = if rp.name.is_some() {
        "get"
    } else if q.watch() {
        "watch"
    } else {
        "list"
    };
    let name = rp.name.clone().unwrap_or_else(|| {
        if !q.list_options_decode() {
            return String::new();
        }
        FieldSelector::parse(&q.field_selector)
            .ok()
            .and_then(|f| f.equality_value("metadata.name").map(str::to_string))
            .filter(|n| is_valid_path_segment(n))
            .unwrap_or_default()
    });
    // Selectors are authorized for list and watch only (`GetAuthorizerAttributes`).
    let (field_selector, label_selector) = if verb == "get" {
        (String::new(), String::new())
    } else {
        (q.field_selector.clone(), q.label_selector.clone())
    };
    Attributes::Resource {
        verb: verb.into(),
        group: rp.group.clone(),
        version: rp.version.clone(),
        resource: rp.resource.clone(),
        subresource: String::new(),
        namespace: rp.namespace.clone().unwrap_or_default(),
        name,
        field_selector,
        label_selector,
    }
}

/// The API server's `IsValidPathSegmentName`.
fn is_valid_path_segment(s: &str) -> bool {
    s != "." && s != ".." && !s.contains('/') && !s.contains('%')
}

#[cfg(test)]
mod tests {
    use super::*;
    use kcache_actors::core::page::Token;
    use kcache_actors::core::rv::At;

    fn resources() -> Resources {
        let mut r = Resources::new();
        for (g, v, res, kind, namespaced) in [
            ("", "v1", "secrets", "Secret", true),
            ("", "v1", "pods", "Pod", true),
            ("", "v1", "nodes", "Node", false),
            ("apps", "v1", "deployments", "Deployment", true),
            ("example.com", "v1", "widgets", "Widget", true),
        ] {
            r.insert(
                (g.into(), v.into(), res.into()),
                Arc::new(ResourceType::new(g, v, res, kind, namespaced)),
            );
        }
        r
    }

    /// A plan in a word: what the table compares.
    fn outcome(p: &Plan) -> String {
        let reason = |r: &Reason| r.as_str().to_string();
        match p {
            Plan::Forward(Forward::Verb) => "forward verb".into(),
            Plan::Forward(Forward::Impersonation) => "forward impersonation".into(),
            Plan::Forward(Forward::Uncached) => "forward uncached".into(),
            Plan::Forward(Forward::Bypass(_, r)) => format!("bypass {}", reason(r)),
            Plan::Serve(s) => match &s.op {
                Err(e) => format!("serve error {}", e.code),
                Ok(Op::Get { key, min_rv, .. }) => format!("get {key} from {min_rv}"),
                Ok(Op::List { key, read, .. }) => {
                    let at = match read.at {
                        At::Consistent => "consistent".to_string(),
                        At::NotOlderThan(rv) => format!("from {rv}"),
                        At::Exact(rv) => format!("at {rv}"),
                    };
                    let limit = match read.limit {
                        0 => String::new(),
                        l => format!(" limit {l}"),
                    };
                    let start = match &read.start {
                        Some(s) => format!(" after {s:?}"),
                        None => String::new(),
                    };
                    format!("list {key} {at}{limit}{start}")
                }
                Ok(Op::Forward(r)) => format!("serve then bypass {}", reason(r)),
                Ok(Op::Watch(w)) => match &w.checked {
                    Err(e) => format!("watch {} error {}", w.key, e.code),
                    Ok(Admitted::Forward(r)) => format!("watch then bypass {}", reason(r)),
                    Ok(Admitted::Start(s)) => format!(
                        "watch {} initial={} consistent={}",
                        w.key, s.plan.initial_events, s.consistent
                    ),
                },
            },
        }
    }

    const JSON: &str = "application/json";
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
    const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

    /// Every forward and every reason the plan can find, with the request that earns it;
    /// the reasons only serving can find are [`Reason::AT_SERVE_TIME`].
    #[test]
    fn every_request_gets_its_plan() {
        let cases: &[(&str, &str, &str, &str, bool, &str)] = &[
            ("POST", "/api/v1/namespaces/a/secrets", "", JSON, false, "forward verb"),
            ("GET", "/api/v1/namespaces/a/secrets", "", JSON, true, "forward impersonation"),
            ("GET", "/api/v1/namespaces/a/configmaps", "", JSON, false, "forward uncached"),
            ("GET", "/api/v1/namespaces/a/secrets/s/status", "", JSON, false, "forward uncached"),
            // A namespaced object has no cluster-wide path by name; a cluster-scoped
            // resource has no namespaced path.
            ("GET", "/api/v1/secrets/s", "", JSON, false, "forward uncached"),
            ("GET", "/api/v1/namespaces/a/nodes", "", JSON, false, "forward uncached"),
            ("GET", "/api//v1/secrets", "", JSON, false, "forward uncached"),
            ("GET", "/api/v1/secrets", "a=1;b=2", JSON, false, "bypass query"),
            ("GET", "/api/v1/secrets", "", "application/yaml", false, "bypass accept"),
            // A custom resource has no protobuf form.
            ("GET", "/apis/example.com/v1/widgets", "", PROTOBUF, false, "bypass accept"),
            ("GET", "/apis/apps/v1/deployments", "resourceVersion=0", PROTOBUF, false, "list /apis/apps/v1/deployments from 0"),
            // A GET by name without a resourceVersion is a consistent read: the API server's.
            ("GET", "/api/v1/namespaces/a/secrets/s", "", JSON, false, "serve then bypass rv"),
            ("GET", "/api/v1/namespaces/a/secrets/s", "resourceVersion=0", JSON, false, "get /api/v1/namespaces/a/secrets/s from 0"),
            ("GET", "/api/v1/namespaces/a/secrets/s", "resourceVersion=7", PROTOBUF, false, "get /api/v1/namespaces/a/secrets/s from 7"),
            // The storage's parse of a GET's resourceVersion fails as a 500.
            ("GET", "/api/v1/namespaces/a/secrets/s", "resourceVersion=x", JSON, false, "serve error 500"),
            // A GET by name ignores selectors, limits and watch, as upstream.
            ("GET", "/api/v1/namespaces/a/secrets/s", "resourceVersion=0&labelSelector=%3D%3D&watch=1", JSON, false, "get /api/v1/namespaces/a/secrets/s from 0"),
            ("GET", "/api/v1/namespaces/a/secrets/s", "resourceVersion=", JSON, false, "serve then bypass rv"),
            ("GET", "/api/v1/secrets/s", "", TABLE, false, "forward uncached"),
            ("GET", "/api/v1/namespaces/a/secrets/s", "includeObject=Bogus", TABLE, false, "serve then bypass rv"),
            // A Table's includeObject is the API server's last check, after the read (a
            // read's 404 or 504 comes first): found when serving, not planning.
            ("GET", "/api/v1/namespaces/a/secrets/s", "includeObject=Bogus&resourceVersion=0", TABLE, false, "get /api/v1/namespaces/a/secrets/s from 0"),
            ("GET", "/api/v1/namespaces/a/secrets", "includeObject=Bogus&resourceVersion=0", TABLE, false, "list /api/v1/namespaces/a/secrets from 0"),
            ("GET", "/api/v1/namespaces/a/secrets", "includeObject=Bogus&watch=1", TABLE, false, "serve error 400"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=0", JSON, false, "list /api/v1/namespaces/a/secrets from 0"),
            // A list without a resourceVersion is a consistent read, served once proven fresh;
            // paginated, it is the API server's.
            ("GET", "/api/v1/namespaces/a/secrets", "", JSON, false, "list /api/v1/namespaces/a/secrets consistent"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=", TABLE, false, "list /api/v1/namespaces/a/secrets consistent"),
            ("GET", "/api/v1/namespaces/a/secrets", "limit=0", PROTOBUF, false, "list /api/v1/namespaces/a/secrets consistent"),
            ("GET", "/api/v1/namespaces/a/secrets", "limit=500", JSON, false, "list /api/v1/namespaces/a/secrets consistent limit 500"),
            // Pages and exact versions from the key's history; `0` lifts the limit.
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=7&limit=3", JSON, false, "list /api/v1/namespaces/a/secrets at 7 limit 3"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=7&resourceVersionMatch=Exact", JSON, false, "list /api/v1/namespaces/a/secrets at 7"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=7&resourceVersionMatch=NotOlderThan&limit=3", JSON, false, "list /api/v1/namespaces/a/secrets from 7 limit 3"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=0&resourceVersionMatch=NotOlderThan&limit=3", JSON, false, "list /api/v1/namespaces/a/secrets from 0"),
            // A continue token that is not kcache's is the API server's.
            ("GET", "/api/v1/namespaces/a/secrets", "limit=5&continue=x", JSON, false, "serve then bypass rv"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersionMatch=NotOlderThan", JSON, false, "serve error 422"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=0&limit=5&continue=x", JSON, false, "serve then bypass rv"),
            ("GET", "/api/v1/namespaces/a/secrets", "labelSelector=a%3D%3D%3D", JSON, false, "serve error 400"),
            ("GET", "/api/v1/namespaces/a/secrets", "fieldSelector=data.x%3Dy", JSON, false, "serve error 400"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=0&limit=x", JSON, false, "serve error 400"),
            ("GET", "/api/v1/nodes", "resourceVersion=0&fieldSelector=spec.unschedulable%3Dtrue", JSON, false, "serve then bypass selector"),
            ("GET", "/api/v1/pods", "resourceVersion=0&fieldSelector=spec.nodeName%3Da%2Bb", JSON, false, "serve then bypass name"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=0&resourceVersionMatch=Exact", JSON, false, "serve error 422"),
            // "00" is not "0" to the API server's list storage (it compares the string):
            // the request parser forwards leading zeros before any plan.
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=00&resourceVersionMatch=Exact", JSON, false, "bypass query"),
            ("GET", "/api/v1/namespaces/a/secrets", "resourceVersion=00&limit=5", JSON, false, "bypass query"),
            ("GET", "/api/v1/namespaces/a/secrets", "watch=1", JSON, false, "watch /api/v1/namespaces/a/secrets initial=true consistent=true"),
            ("GET", "/api/v1/namespaces/a/secrets", "watch=1&resourceVersion=9", JSON, false, "watch /api/v1/namespaces/a/secrets initial=false consistent=false"),
            ("GET", "/api/v1/namespaces/a/secrets", "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", JSON, false, "watch /api/v1/namespaces/a/secrets initial=true consistent=true"),
            ("GET", "/api/v1/namespaces/a/secrets", "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", TABLE, false, "watch then bypass accept"),
            ("GET", "/api/v1/namespaces/a/secrets", "watch=1&sendInitialEvents=true", JSON, false, "watch /api/v1/namespaces/a/secrets error 422"),
            ("GET", "/api/v1/namespaces/a/secrets", "watch=1&timeoutSeconds=x", JSON, false, "serve error 400"),
        ];
        let resources = resources();
        let mut reasons = std::collections::BTreeSet::new();
        let mut wrong = Vec::new();
        for &(method, path, query, accept, impersonating, want) in cases {
            let incoming = Incoming {
                method,
                path,
                query,
                accept,
                impersonating,
            };
            let got = outcome(&plan(&incoming, Some(&resources)));
            if got != want {
                wrong.push(format!(
                    "{method} {path}?{query} [{accept}]: {got:?}, not {want:?}"
                ));
            }
            if let Some(r) = got.split("bypass ").nth(1) {
                reasons.insert(r.to_string());
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        // Every reason is earned by a request above, or only serving can find it.
        for r in Reason::ALL {
            assert!(
                reasons.contains(r.as_str()) || Reason::AT_SERVE_TIME.contains(&r),
                "no case earns {r:?}"
            );
        }
        // Until discovery answered, nothing is the cache's.
        let incoming = Incoming {
            method: "GET",
            path: "/api/v1/namespaces/a/secrets/s",
            query: "",
            accept: JSON,
            impersonating: false,
        };
        assert_eq!(outcome(&plan(&incoming, None)), "forward uncached");
    }

    /// kcache's own continue tokens are read by kcache, with the API server's checks.
    #[test]
    fn continue_tokens_are_planned() {
        let resources = resources();
        let ours = Token::after(9, "s1").encode();
        let bad = {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(r#"{"v":"kcache.io/v1","rv":0,"start":"s1"}"#)
        };
        let cases = [
            (
                format!("limit=2&continue={ours}"),
                "list /api/v1/namespaces/a/secrets at 9 limit 2 after \"s1\\0\"",
            ),
            (
                format!("continue={ours}"),
                "list /api/v1/namespaces/a/secrets at 9 after \"s1\\0\"",
            ),
            (
                format!("limit=2&resourceVersion=0&continue={ours}"),
                "list /api/v1/namespaces/a/secrets at 9 after \"s1\\0\"",
            ),
            (
                format!("limit=2&resourceVersion=8&continue={ours}"),
                "serve error 400",
            ),
            (
                format!("limit=2&resourceVersion=x&continue={ours}"),
                "serve error 400",
            ),
            (
                format!("limit=2&resourceVersionMatch=Exact&resourceVersion=8&continue={ours}"),
                "serve error 422",
            ),
            (format!("limit=2&continue={bad}"), "serve error 400"),
        ];
        for (query, want) in cases {
            let incoming = Incoming {
                method: "GET",
                path: "/api/v1/namespaces/a/secrets",
                query: &query,
                accept: JSON,
                impersonating: false,
            };
            assert_eq!(outcome(&plan(&incoming, Some(&resources))), want, "{query}");
        }
    }

    /// A new reason does not compile here until it has its place in `Reason::ALL` (and so
    /// its series registered at zero).
    #[test]
    fn every_reason_is_in_all() {
        for r in Reason::ALL {
            let i = match r {
                Reason::Query => 0,
                Reason::Accept => 1,
                Reason::Selector => 2,
                Reason::Name => 3,
                Reason::Rv => 4,
                Reason::History => 5,
                Reason::KeyBudget => 6,
                Reason::NotReady => 7,
                Reason::NotFresh => 8,
                Reason::Protobuf => 9,
                Reason::Table => 10,
            };
            assert_eq!(Reason::ALL[i], r);
        }
    }

    #[test]
    fn attributes_are_the_api_servers() {
        let resources = resources();
        let cases: &[(&str, &str, &str)] = &[
            (
                "/api/v1/namespaces/a/secrets/s",
                "watch=1&labelSelector=x",
                "get a s  ",
            ),
            (
                "/api/v1/namespaces/a/secrets",
                "watch=1&fieldSelector=metadata.name%3Ds",
                "watch a s metadata.name=s ",
            ),
            (
                "/api/v1/namespaces/a/secrets",
                "fieldSelector=metadata.name%3D..&labelSelector=x",
                "list a  metadata.name=.. x",
            ),
            // A query that does not decode as ListOptions names nothing.
            (
                "/api/v1/namespaces/a/secrets",
                "fieldSelector=metadata.name%3Ds&limit=x",
                "list a  metadata.name=s ",
            ),
        ];
        for &(path, query, want) in cases {
            let incoming = Incoming {
                method: "GET",
                path,
                query,
                accept: JSON,
                impersonating: false,
            };
            let Plan::Serve(s) = plan(&incoming, Some(&resources)) else {
                panic!("{path}?{query} not served");
            };
            let Attributes::Resource {
                verb,
                namespace,
                name,
                field_selector,
                label_selector,
                ..
            } = &s.attrs
            else {
                panic!("not a resource request");
            };
            let got = format!("{verb} {namespace} {name} {field_selector} {label_selector}");
            assert_eq!(got, want, "{path}?{query}");
        }
    }

    #[test]
    fn protobuf_is_looked_up_only_when_asked_for() {
        assert!(mentions_protobuf(
            "application/vnd.kubernetes.protobuf, application/json"
        ));
        assert!(mentions_protobuf("Application/Vnd.Kubernetes.Protobuf"));
        assert!(!mentions_protobuf("application/json"));
        assert!(!mentions_protobuf(""));
    }
}
