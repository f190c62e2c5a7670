//! Which upstream Kubernetes versions kcache supports, and what it says at start about
//! the one it found: the reference version the tests are judged by and the two minors
//! before it (upstream's own support window), pinned in `scripts/k8s/versions.env`.
//!
//! An upstream older than that is not refused — it may well work — but kcache reproduces
//! the reference's semantics (validation, streaming lists, selector authorization), so an
//! older server's answers may differ from kcache's: a warning at start and
//! `kcache_upstream_version_supported 0` say so instead of silent misbehaviour.

use kcache_actors::metrics as m;
use thiserror::Error;

/// The reference version's minor (`KCACHE_K8S_REFERENCE` in scripts/k8s/versions.env).
pub const REFERENCE_MINOR: u32 = 37;
/// The oldest supported minor (`KCACHE_K8S_SECOND`: reference − 2).
pub const OLDEST_MINOR: u32 = 35;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error("cannot read a Kubernetes version from gitVersion {0:?}")]
    Unparsable(String),
}

/// How kcache stands with an upstream version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Within the supported range: tested (reference, second) or between them.
    Supported,
    /// Older than the oldest supported minor.
    TooOld,
    /// Newer than the reference: untested, most likely fine (newer servers keep the
    /// semantics kcache reproduces), said at start.
    Newer,
}

/// `(major, minor)` of a `/version` gitVersion such as `v1.37.2`, `v1.36.0-rc.1` or
/// `v1.35.4-gke.100`.
pub fn parse(git_version: &str) -> Result<(u32, u32), Error> {
    let bad = || Error::Unparsable(git_version.to_string());
    let rest = git_version.strip_prefix('v').ok_or_else(bad)?;
    let mut parts = rest.splitn(3, '.');
    let major = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let minor_part = parts.next().ok_or_else(bad)?;
    let digits: String = minor_part
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let minor = digits.parse().map_err(|_| bad())?;
    Ok((major, minor))
}

pub fn support(major: u32, minor: u32) -> Support {
    match (major, minor) {
        (1, m) if m < OLDEST_MINOR => Support::TooOld,
        (1, m) if m > REFERENCE_MINOR => Support::Newer,
        (1, _) => Support::Supported,
        (0, _) => Support::TooOld,
        _ => Support::Newer,
    }
}

/// Logs and records what kcache found upstream: `kcache_upstream_version_supported`
/// (1 within the supported range, 0 outside it or unreadable) and
/// `kcache_upstream_info{git_version}`.
pub fn report(git_version: &str) {
    metrics::gauge!(m::UPSTREAM_INFO, "git_version" => git_version.to_string()).set(1.0);
    let supported = match parse(git_version).map(|(ma, mi)| (ma, mi, support(ma, mi))) {
        Ok((_, _, Support::Supported)) => {
            tracing::info!(git_version, "upstream Kubernetes version is supported");
            true
        }
        Ok((ma, mi, Support::Newer)) => {
            tracing::warn!(
                git_version,
                "upstream Kubernetes {ma}.{mi} is newer than the newest version kcache is tested against (1.{REFERENCE_MINOR}); it is expected to work, but is untested"
            );
            false
        }
        Ok((ma, mi, Support::TooOld)) => {
            tracing::warn!(
                git_version,
                "upstream Kubernetes {ma}.{mi} is older than kcache supports (1.{OLDEST_MINOR}–1.{REFERENCE_MINOR}): kcache answers with the newer semantics (validation, streaming lists, authorization with selectors), which this API server may not share; upgrade it or expect differences"
            );
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell the upstream Kubernetes version");
            false
        }
    };
    metrics::gauge!(m::UPSTREAM_VERSION_SUPPORTED).set(if supported { 1.0 } else { 0.0 });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_are_judged_against_the_supported_range() {
        let cases = [
            ("v1.37.2", Ok((1, 37)), Some(Support::Supported)),
            ("v1.35.4", Ok((1, 35)), Some(Support::Supported)),
            ("v1.36.0-rc.1", Ok((1, 36)), Some(Support::Supported)),
            ("v1.35.4-gke.100", Ok((1, 35)), Some(Support::Supported)),
            ("v1.34.9", Ok((1, 34)), Some(Support::TooOld)),
            ("v1.20.2", Ok((1, 20)), Some(Support::TooOld)),
            ("v1.38.0", Ok((1, 38)), Some(Support::Newer)),
            ("v1.37+", Ok((1, 37)), Some(Support::Supported)),
            ("1.37.2", Err(()), None),
            (
                "v0.0.0-master+$Format:%H$",
                Ok((0, 0)),
                Some(Support::TooOld),
            ),
            ("vx.y", Err(()), None),
            ("", Err(()), None),
        ];
        for (v, want, judged) in cases {
            let got = parse(v).map_err(|_| ());
            assert_eq!(got, want, "{v}");
            if let Ok((ma, mi)) = got {
                assert_eq!(Some(support(ma, mi)), judged, "{v}");
            }
        }
    }

    /// The range here is the one the project builds and tests (scripts/k8s/versions.env).
    #[test]
    fn the_supported_range_is_the_tested_one() {
        let env = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/k8s/versions.env"),
        )
        .expect("read scripts/k8s/versions.env");
        let get = |key: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(str::trim)
                .unwrap_or_else(|| panic!("{key} in versions.env"))
                .to_string()
        };
        assert_eq!(
            parse(&get("KCACHE_K8S_REFERENCE")),
            Ok((1, REFERENCE_MINOR))
        );
        assert_eq!(parse(&get("KCACHE_K8S_SECOND")), Ok((1, OLDEST_MINOR)));
    }
}
