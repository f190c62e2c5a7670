//! Audit: `audit.k8s.io/v1` `Event` JSON lines for the requests kcache answers itself
//! (proxied requests are audited by the API server), written by one background task from
//! a bounded queue so a slow disk never slows requests (drops are counted), rotated by size.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::auth::UserInfo;
use crate::authz::Attributes;

/// `[audit]` in the config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// Audit log file; empty disables auditing.
    pub path: String,
    /// Resources audited at Metadata level (plural names; `*` for all cached resources).
    pub resources: Vec<String>,
    /// Rotate when the file passes this size.
    pub max_size_bytes: u64,
    /// Rotated files kept (`path.1` … `path.N`).
    pub max_backups: usize,
    /// Events queued for the writer before new ones are dropped (and counted).
    pub queue: usize,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            path: String::new(),
            resources: vec!["secrets".into()],
            max_size_bytes: 100 * 1024 * 1024,
            max_backups: 5,
            queue: 10_000,
        }
    }
}

/// Formats a time as RFC 3339 UTC with microseconds, as audit timestamps are.
pub use kcache_actors::core::time::format_rfc3339_micros as rfc3339_micros;

/// What one audited request was.
pub struct Record<'a> {
    pub user: &'a UserInfo,
    pub attrs: &'a Attributes,
    pub request_uri: &'a str,
    pub source_ip: Option<String>,
    pub user_agent: Option<&'a str>,
    /// The authorization decision and its reason; `None` for a request refused before
    /// authorization (no seat for it: `crate::fairness`), whose event carries no decision,
    /// as the API server's for a request its priority and fairness rejected.
    pub decision: Option<(bool, &'a str)>,
    pub code: u16,
    pub received: SystemTime,
}

pub struct Auditor {
    resources: Vec<String>,
    tx: Option<mpsc::Sender<Value>>,
}

impl Auditor {
    /// A disabled auditor (no path configured).
    pub fn disabled() -> Self {
        Auditor {
            resources: Vec::new(),
            tx: None,
        }
    }

    /// Starts the writer task; fails when the file cannot be opened.
    pub fn start(cfg: &AuditConfig) -> std::io::Result<Self> {
        if cfg.path.is_empty() {
            return Ok(Self::disabled());
        }
        let mut writer = RotatingFile::open(
            PathBuf::from(&cfg.path),
            cfg.max_size_bytes,
            cfg.max_backups,
        )?;
        let (tx, mut rx) = mpsc::channel::<Value>(cfg.queue.max(1));
        std::thread::Builder::new()
            .name("kcache-audit".into())
            .spawn(move || {
                while let Some(ev) = rx.blocking_recv() {
                    if let Err(e) = writer.write_line(&ev) {
                        tracing::warn!(error = %e, "writing the audit log failed");
                    }
                }
            })?;
        Ok(Auditor {
            resources: cfg.resources.clone(),
            tx: Some(tx),
        })
    }

    fn wants(&self, attrs: &Attributes) -> bool {
        match attrs {
            Attributes::Resource { resource, .. } => {
                self.resources.iter().any(|r| r == "*" || r == resource)
            }
            Attributes::NonResource { .. } => false,
        }
    }

    pub fn record(&self, r: Record<'_>) {
        let Some(tx) = &self.tx else { return };
        if !self.wants(r.attrs) {
            return;
        }
        let Attributes::Resource {
            verb,
            group,
            version,
            resource,
            namespace,
            name,
            ..
        } = r.attrs
        else {
            return;
        };
        let mut object_ref = json!({"resource": resource, "apiVersion": version});
        if !group.is_empty() {
            object_ref["apiGroup"] = json!(group);
        }
        if !namespace.is_empty() {
            object_ref["namespace"] = json!(namespace);
        }
        if !name.is_empty() {
            object_ref["name"] = json!(name);
        }
        let mut annotations = json!({});
        if let Some((allowed, reason)) = r.decision {
            annotations["authorization.k8s.io/decision"] =
                json!(if allowed { "allow" } else { "forbid" });
            annotations["authorization.k8s.io/reason"] = json!(reason);
        }
        annotations["kcache.io/served-by"] = json!("cache");
        let allowed = r.decision.is_some_and(|(a, _)| a);
        let ev = json!({
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "auditID": format!("{:032x}", rand::random::<u128>()),
            "stage": if verb == "watch" && allowed { "ResponseStarted" } else { "ResponseComplete" },
            "requestURI": r.request_uri,
            "verb": verb,
            "user": {"username": r.user.username, "uid": r.user.uid, "groups": r.user.groups},
            "sourceIPs": r.source_ip.into_iter().collect::<Vec<_>>(),
            "userAgent": r.user_agent,
            "objectRef": object_ref,
            "responseStatus": {"metadata": {}, "code": r.code},
            "requestReceivedTimestamp": rfc3339_micros(r.received),
            "stageTimestamp": rfc3339_micros(SystemTime::now()),
            "annotations": annotations,
        });
        if tx.try_send(ev).is_err() {
            metrics::counter!("kcache_audit_events_dropped_total").increment(1);
        }
    }
}

/// An append-only file rotated by size: `path` → `path.1` → … → `path.N`.
struct RotatingFile {
    path: PathBuf,
    file: File,
    size: u64,
    max_size: u64,
    backups: usize,
}

impl RotatingFile {
    fn open(path: PathBuf, max_size: u64, backups: usize) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path,
            file,
            size,
            max_size: max_size.max(1),
            backups,
        })
    }

    fn backup(path: &Path, n: usize) -> PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    fn write_line(&mut self, v: &Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if self.size > 0 && self.size + line.len() as u64 > self.max_size {
            self.rotate()?;
        }
        self.file.write_all(&line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        if self.backups == 0 {
            self.file.set_len(0)?;
        } else {
            for n in (1..self.backups).rev() {
                let from = Self::backup(&self.path, n);
                if from.exists() {
                    std::fs::rename(&from, Self::backup(&self.path, n + 1))?;
                }
            }
            std::fs::rename(&self.path, Self::backup(&self.path, 1))?;
            self.file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
        }
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339_micros(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(951_868_801_000_042);
        assert_eq!(rfc3339_micros(t), "2000-03-01T00:00:01.000042Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_867_200);
        assert_eq!(rfc3339_micros(t), "2026-11-28T12:00:00.000000Z");
    }

    #[test]
    fn rotates_by_size_keeping_backups() {
        let dir = std::env::temp_dir().join(format!("kcache-audit-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("audit.log");
        let mut f = RotatingFile::open(path.clone(), 100, 2).expect("open");
        for i in 0..10 {
            f.write_line(&json!({"i": i, "pad": "x".repeat(30)}))
                .expect("write");
        }
        assert!(path.exists());
        assert!(RotatingFile::backup(&path, 1).exists());
        assert!(RotatingFile::backup(&path, 2).exists());
        assert!(!RotatingFile::backup(&path, 3).exists());
        let current = std::fs::read_to_string(&path).expect("read");
        assert!(current.len() <= 100, "{}", current.len());
        assert!(current.contains("\"i\":9"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
