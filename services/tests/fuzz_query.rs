//! Property-based fuzzing of the HTTP edge's one canonical parse: paths and query strings
//! (repeated parameters included) never panic, and the first value of a repeated
//! parameter always wins, as Go's `url.Values.Get` — what is authorized is what is served.
//! `PROPTEST_CASES=100000 cargo test -p kcache --test fuzz_query` runs longer.

use kcache::request::{parse_path, parse_query};
use proptest::prelude::*;

fn param() -> impl Strategy<Value = (String, String)> {
    let key = prop_oneof![
        Just("watch"),
        Just("resourceVersion"),
        Just("resourceVersionMatch"),
        Just("allowWatchBookmarks"),
        Just("sendInitialEvents"),
        Just("timeoutSeconds"),
        Just("labelSelector"),
        Just("fieldSelector"),
        Just("limit"),
        Just("continue"),
        Just("includeObject"),
        Just("x"),
    ]
    .prop_map(str::to_string);
    let value = prop_oneof![
        Just("true".to_string()),
        Just("0".to_string()),
        Just("1".to_string()),
        Just("metadata.name=s1".to_string()),
        Just("metadata.name=s2".to_string()),
        Just("NotOlderThan".to_string()),
        "\\PC{0,12}",
    ];
    (key, value)
}

fn encode(params: &[(String, String)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in params {
        q.append_pair(k, v);
    }
    q.finish()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn query_parse_never_panics(s in "\\PC{0,200}") {
        let q = parse_query(&s);
        let _ = q.list_rv();
        let _ = q.watch_or_get_rv();
        let _ = q.rv_match();
        let _ = q.validate_list_options(false);
        let _ = q.validate_list_options(true);
    }

    #[test]
    fn first_field_selector_wins(params in prop::collection::vec(param(), 0..12)) {
        let q = parse_query(&encode(&params));
        let first = params.iter().find(|(k, _)| k == "fieldSelector").map(|(_, v)| v.clone());
        prop_assert_eq!(q.field_selector, first.unwrap_or_default());
        let first_rv = params.iter().find(|(k, _)| k == "resourceVersion").map(|(_, v)| v.clone());
        prop_assert_eq!(q.resource_version, first_rv);
    }

    #[test]
    fn path_parse_never_panics(parts in prop::collection::vec("[a-z0-9%.]{0,8}", 0..8)) {
        let _ = parse_path(&format!("/{}", parts.join("/")));
        let _ = parse_path(&format!("/api/{}", parts.join("/")));
        let _ = parse_path(&format!("/apis/{}", parts.join("/")));
    }
}
