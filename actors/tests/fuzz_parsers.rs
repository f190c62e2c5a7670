//! Property-based fuzzing of everything a client controls in the core: selectors and
//! resourceVersion rules must never panic, whatever the input, and keep their invariants.
//! Runs as an ordinary test (so in CI); `PROPTEST_CASES=100000 cargo test --test
//! fuzz_parsers` runs longer.

use kcache_actors::core::rv::{self, plan_list, plan_watch, Rv, RvMatch};
use kcache_actors::core::selector::{FieldSelector, LabelSelector, MAX_REQUIREMENTS};
use proptest::prelude::*;
use serde_json::json;

/// Strings biased towards selector syntax, so the parsers' deep branches are reached.
fn selectorish() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        Just("a".to_string()),
        Just("app".to_string()),
        Just("example.com/x".to_string()),
        Just("=".to_string()),
        Just("==".to_string()),
        Just("!=".to_string()),
        Just("!".to_string()),
        Just(",".to_string()),
        Just(" in ".to_string()),
        Just(" notin ".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just(">".to_string()),
        Just("<".to_string()),
        Just("\\".to_string()),
        Just("5".to_string()),
        Just("metadata.name".to_string()),
        Just("spec.nodeName".to_string()),
        "[ -~]{0,4}",
        "\\PC{0,3}",
    ];
    prop::collection::vec(atom, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn label_selectors_never_panic(s in selectorish()) {
        if let Ok(sel) = LabelSelector::parse(&s) {
            // A parsed selector evaluates on any object.
            let labels = json!({"app": "web", "a": "5"});
            let _ = sel.matches(labels.as_object());
            let _ = sel.matches(None);
        }
    }

    #[test]
    fn field_selectors_never_panic(s in selectorish()) {
        if let Ok(sel) = FieldSelector::parse(&s) {
            prop_assert!(sel.requirements().len() <= MAX_REQUIREMENTS);
            let _ = sel.validate_for("", "pods");
            let _ = sel.matches(&json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n"}}));
        }
    }

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,64}") {
        let _ = LabelSelector::parse(&s);
        let _ = FieldSelector::parse(&s);
        let _ = Rv::parse(Some(&s));
        let _ = RvMatch::parse(Some(&s));
        let _ = rv::parse_bool("watch", Some(&s));
    }

    #[test]
    fn resource_versions_parse_exactly_the_decimal_integers(n in any::<u64>(), junk in "[^0-9]{1,4}") {
        let expected = if n == 0 { Rv::Any } else { Rv::At(n) };
        prop_assert_eq!(Rv::parse(Some(&n.to_string())), Ok(expected));
        let bad = format!("{n}{junk}");
        prop_assert!(Rv::parse(Some(&bad)).is_err());
    }

    #[test]
    fn plans_never_panic_and_continue_or_exact_go_upstream(
        rv_s in prop_oneof![Just(None), Just(Some("0".to_string())), "[0-9]{1,6}".prop_map(Some), "\\PC{0,4}".prop_map(Some)],
        m in prop_oneof![Just(None), Just(Some("Exact")), Just(Some("NotOlderThan")), Just(Some("bogus"))],
        limit in prop::option::of(0u64..1000),
        cont in any::<bool>(),
        sie in prop::option::of(any::<bool>()),
        bookmarks in any::<bool>(),
    ) {
        let (Ok(rv), Ok(m)) = (Rv::parse(rv_s.as_deref()), RvMatch::parse(m)) else { return Ok(()) };
        if let Ok(plan) = plan_list(rv, m, limit, cont) {
            if cont || m == Some(RvMatch::Exact) || rv == Rv::Unset {
                prop_assert_eq!(plan, rv::ListPlan::Upstream);
            }
        }
        if let Ok(w) = plan_watch(rv, m, sie, bookmarks) {
            // The initial-events-end bookmark is only ever promised with bookmarks allowed.
            prop_assert!(!w.initial_events_end_bookmark || bookmarks);
            prop_assert_eq!(w.from_rv, rv.floor());
        }
    }
}
