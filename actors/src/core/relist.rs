//! Relist diff: after an upstream 410 (or any relist), turn "old store vs fresh list" into
//! synthetic events, so downstream watches survive where the API server would close them.
//!
//! As client-go's `DeltaFIFO.Replace`: listed objects are updates, known keys missing from
//! the list are deletions. Events come out in non-decreasing RV order: changed and new
//! objects at their own RV (each is newer than anything the key saw before the gap), a
//! replaced object (same name, new UID) as DELETED just before (one RV below) the new
//! object's ADDED — the deletion happened in between, and no two events of one object
//! may share a resourceVersion — and
//! plain deletions last, at the relist RV (their real deletion RV is unknown).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::core::object::EventType;
use crate::core::object::Object;
use crate::core::store::Store;

/// One synthetic change to apply to the store and send to watchers.
#[derive(Debug, Clone)]
pub struct Change {
    pub kind: EventType,
    pub rv: u64,
    pub object: Arc<Object>,
    pub prev: Option<Arc<Object>>,
}

pub fn diff(store: &Store, listed: Vec<Object>, list_rv: u64) -> Vec<Change> {
    let mut fresh: BTreeMap<String, Arc<Object>> =
        listed.into_iter().map(|o| (o.key(), Arc::new(o))).collect();
    let mut changes = Vec::new();
    let mut deletions = Vec::new();
    for (key, old) in store.iter() {
        match fresh.remove(key) {
            None => deletions.push(Change {
                kind: EventType::Deleted,
                rv: list_rv,
                object: Arc::new(old.with_rv(list_rv)),
                prev: Some(old.clone()),
            }),
            Some(new) if new.uid() != old.uid() => {
                let rv = new.rv();
                let deleted_at = rv.saturating_sub(1).max(old.rv());
                changes.push(Change {
                    kind: EventType::Deleted,
                    rv: deleted_at,
                    object: Arc::new(old.with_rv(deleted_at)),
                    prev: Some(old.clone()),
                });
                changes.push(Change {
                    kind: EventType::Added,
                    rv,
                    object: new,
                    prev: None,
                });
            }
            Some(new) if new.rv() != old.rv() => changes.push(Change {
                kind: EventType::Modified,
                rv: new.rv(),
                object: new,
                prev: Some(old.clone()),
            }),
            Some(_) => {}
        }
    }
    for (_, new) in fresh {
        changes.push(Change {
            kind: EventType::Added,
            rv: new.rv(),
            object: new,
            prev: None,
        });
    }
    // Stable sort keeps each DELETED before its ADDED at the same RV.
    changes.sort_by_key(|c| c.rv);
    changes.extend(deletions);
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::store::fixtures::{obj, store};

    fn summary(c: &[Change]) -> Vec<(EventType, String, u64)> {
        c.iter()
            .map(|c| (c.kind, c.object.name().to_string(), c.rv))
            .collect()
    }

    #[test]
    fn unchanged_list_gives_nothing() {
        let s = store(&[obj("a", "1", 5), obj("b", "2", 6)]);
        assert!(diff(&s, vec![obj("a", "1", 5), obj("b", "2", 6)], 50).is_empty());
    }

    #[test]
    fn adds_modifies_replaces_and_deletes_in_rv_order() {
        let s = store(&[
            obj("a", "1", 5),
            obj("b", "2", 6),
            obj("c", "3", 7),
            obj("d", "4", 8),
        ]);
        let listed = vec![
            obj("a", "1", 5),  // unchanged
            obj("b", "2", 30), // modified
            obj("c", "9", 20), // deleted and recreated
            obj("e", "5", 25), // new
                               // d deleted
        ];
        let got = diff(&s, listed, 40);
        use EventType::*;
        assert_eq!(
            summary(&got),
            vec![
                (Deleted, "c".into(), 19),
                (Added, "c".into(), 20),
                (Added, "e".into(), 25),
                (Modified, "b".into(), 30),
                (Deleted, "d".into(), 40),
            ]
        );
        // A synthetic DELETED carries the RV it is sent at, and the old object's UID.
        assert_eq!(
            got[0].object.to_value()["metadata"]["resourceVersion"],
            "19"
        );
        assert_eq!(got[0].object.rv(), 19);
        assert_eq!(got[0].object.uid(), "3");
        assert_eq!(got[4].object.rv(), 40);
        assert_eq!(got[3].prev.as_ref().map(|p| p.rv()), Some(6));
    }

    #[test]
    fn empty_list_deletes_everything_at_the_list_rv() {
        let s = store(&[obj("a", "1", 5)]);
        let got = diff(&s, vec![], 9);
        assert_eq!(summary(&got), vec![(EventType::Deleted, "a".into(), 9)]);
    }
}
