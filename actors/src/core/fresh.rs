//! Whether a key's state is at least as new as the upstream's at a given moment: the
//! freshness proof behind consistent reads (a list or streaming list with the
//! resourceVersion omitted) served from the cache.
//!
//! The reference API server proves its watch cache fresh with etcd's progress
//! notifications (`waitUntilFreshAndBlock` after `GetCurrentResourceVersion`). kcache has no
//! such signal one level up: upstream bookmarks come about once a minute and cannot be
//! asked for, and the global resourceVersion moves with writes to other resources, so a
//! quiet key never "reaches" it. The proof instead asks the upstream for the key's own
//! state as a consistent read (a metadata-only list with the key's selectors, `R` its
//! resourceVersion), taken after the request arrived, and compares:
//!
//! - the key has progressed to `R` or past it: fresh;
//! - the key's objects at its own progress `r < R` are exactly the upstream's at `R`
//!   (same namespace, name, UID and resourceVersion each): nothing the key holds changed
//!   between `r` and `R` — any write gives an object a new resourceVersion, a re-creation
//!   a new UID — so its state is the state at `R`: fresh;
//! - otherwise the key is behind: the events it lacks are at most `R`, already in the
//!   upstream's cache and on their way; wait for its progress to reach `R` (bounded; past
//!   the bound the request goes to the API server).

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// The upstream's answer to the probe is not a list kcache can read.
    #[error("unreadable freshness probe answer: {0}")]
    Unreadable(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What identifies an object's version: namespace, name, UID, resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub rv: u64,
}

/// The upstream's state of a key at `rv`, as the probe read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub rv: u64,
    /// Sorted.
    pub objects: Vec<Version>,
}

impl Probe {
    /// Reads a `PartialObjectMetadataList` (or any list: only `metadata` is read).
    pub fn from_list_json(body: &[u8]) -> Result<Probe> {
        #[derive(serde::Deserialize)]
        struct List {
            metadata: ListMeta,
            #[serde(default)]
            items: Option<Vec<Item>>,
        }
        #[derive(serde::Deserialize)]
        struct ListMeta {
            #[serde(rename = "resourceVersion", default)]
            resource_version: String,
        }
        #[derive(serde::Deserialize)]
        struct Item {
            metadata: ItemMeta,
        }
        #[derive(serde::Deserialize)]
        struct ItemMeta {
            #[serde(default)]
            namespace: String,
            #[serde(default)]
            name: String,
            #[serde(default)]
            uid: String,
            #[serde(rename = "resourceVersion", default)]
            resource_version: String,
        }
        let list: List =
            serde_json::from_slice(body).map_err(|e| Error::Unreadable(e.to_string()))?;
        let rv = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| Error::Unreadable(format!("resourceVersion {s:?}")))
        };
        let mut objects = list
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|i| {
                Ok(Version {
                    rv: rv(&i.metadata.resource_version)?,
                    namespace: i.metadata.namespace,
                    name: i.metadata.name,
                    uid: i.metadata.uid,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        objects.sort_unstable();
        Ok(Probe {
            rv: rv(&list.metadata.resource_version)?,
            objects,
        })
    }
}

/// The verdict on a key against a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The key's state is the upstream's at the probe's RV or newer: serve.
    Fresh,
    /// The key lacks events up to this RV: wait until its progress reaches it.
    WaitFor(u64),
}

/// Judges a key at progress `key_rv` holding `key_objects` (any order) against `probe`.
pub fn judge(key_rv: u64, mut key_objects: Vec<Version>, probe: &Probe) -> Verdict {
    if key_rv >= probe.rv {
        return Verdict::Fresh;
    }
    key_objects.sort_unstable();
    if key_objects == probe.objects {
        Verdict::Fresh
    } else {
        Verdict::WaitFor(probe.rv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(name: &str, uid: &str, rv: u64) -> Version {
        Version {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
            rv,
        }
    }

    #[test]
    fn verdicts() {
        let probe = Probe {
            rv: 50,
            objects: vec![v("a", "u1", 10), v("b", "u2", 20)],
        };
        let cases = [
            // Progressed to the probe's RV or past it: fresh whatever it holds.
            (50, vec![], Verdict::Fresh),
            (60, vec![v("a", "u1", 55)], Verdict::Fresh),
            // Same objects, same versions, any order: nothing changed up to 50.
            (20, vec![v("b", "u2", 20), v("a", "u1", 10)], Verdict::Fresh),
            // An update it has not seen yet.
            (
                20,
                vec![v("a", "u1", 10), v("b", "u2", 15)],
                Verdict::WaitFor(50),
            ),
            // A creation it has not seen yet.
            (20, vec![v("a", "u1", 10)], Verdict::WaitFor(50)),
            // A deletion it has not seen yet (a deleted Secret must not stay readable).
            (
                20,
                vec![v("a", "u1", 10), v("b", "u2", 20), v("c", "u3", 18)],
                Verdict::WaitFor(50),
            ),
            // Deleted and re-created under the same name, even at an equal RV number.
            (
                20,
                vec![v("a", "u0", 10), v("b", "u2", 20)],
                Verdict::WaitFor(50),
            ),
        ];
        for (key_rv, objects, want) in cases {
            assert_eq!(
                judge(key_rv, objects.clone(), &probe),
                want,
                "{key_rv} {objects:?}"
            );
        }
    }

    #[test]
    fn probe_reads_a_metadata_list() {
        let body = br#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"812"},"items":[
            {"kind":"PartialObjectMetadata","metadata":{"name":"b","namespace":"ns","uid":"u2","resourceVersion":"20","labels":{"x":"y"}}},
            {"metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"10"}}]}"#;
        let p = Probe::from_list_json(body).expect("parses");
        assert_eq!(p.rv, 812);
        assert_eq!(p.objects, vec![v("a", "u1", 10), v("b", "u2", 20)]);
        let empty = Probe::from_list_json(br#"{"metadata":{"resourceVersion":"9"},"items":null}"#)
            .expect("parses");
        assert_eq!(
            empty,
            Probe {
                rv: 9,
                objects: vec![]
            }
        );
        for bad in [
            &br#"{"metadata":{"resourceVersion":"x"}}"#[..],
            br#"{"metadata":{"resourceVersion":"9"},"items":[{"metadata":{"name":"a","resourceVersion":""}}]}"#,
            br#"not json"#,
        ] {
            assert!(Probe::from_list_json(bad).is_err());
        }
    }
}
