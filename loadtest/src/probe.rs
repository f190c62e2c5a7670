//! What the harness reads about the processes under test: RSS and CPU seconds from
//! `/proc`, and samples from a Prometheus `/metrics` endpoint (the API server's
//! `apiserver_longrunning_requests`, kcache's `kcache_terminated_watchers_total`, …).

use std::collections::BTreeMap;
use std::ops::Sub;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

/// Resident set size of a process, in KiB (0 if it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The highest RSS process `pid` has had since it started (`VmHWM`, the kernel's own
/// high-water mark: no sample misses a peak), in KiB; 0 when unknown.
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// A `kB` field of `/proc/<pid>/status`; 0 when unknown.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| status_field(&s, field))
        .unwrap_or(0)
}

fn status_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
}

/// The highest VmRSS of a process over a stretch of time: sampled every `every` on a
/// thread of its own (not a tokio task, so a busy runtime does not skip samples) until
/// [`PeakRss::stop`]. VmHWM would be the peak of the process's whole life, not of the
/// stretch measured.
pub struct PeakRss {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl PeakRss {
    pub fn start(pid: u32, every: Duration) -> PeakRss {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rss-sampler".into())
            .spawn(move || {
                let mut peak = rss_kib(pid);
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(every);
                    peak = peak.max(rss_kib(pid));
                }
                peak
            })
            .ok();
        PeakRss { stop, thread }
    }

    /// Stops sampling; the peak in KiB (with one last sample), or the RSS now if the
    /// sampling thread could not be started.
    pub fn stop(mut self, pid: u32) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let now = rss_kib(pid);
        let peak = self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0);
        peak.max(now)
    }
}

impl Drop for PeakRss {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// This process's soft limit of open files (`None` if unlimited or unreadable).
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How many write calls (`write`, `writev`, ...) a process made, all its threads
/// (`syscw` of `/proc/<pid>/io`); `None` if it cannot be read.
pub fn write_calls(pid: u32) -> Option<u64> {
    io_field(
        &std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?,
        "syscw",
    )
}

/// The value of `field` in a `/proc/<pid>/io` text (`name: value` lines).
fn io_field(io: &str, field: &str) -> Option<u64> {
    io.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .parse()
        .ok()
}

/// utime + stime of a process (all its threads), in seconds (0 if it cannot be read).
pub fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_cpu(&s).map(|(_, seconds)| seconds))
        .unwrap_or(0.0)
}

/// The command name and utime + stime in seconds of a `/proc/.../stat` line
/// (`pid (comm) state ...`).
fn stat_cpu(stat: &str) -> Option<(&str, f64)> {
    const USER_HZ: f64 = 100.0;
    // The command name may contain spaces and parentheses: fields start after ") ".
    let (head, after) = stat.rsplit_once(") ")?;
    let comm = head.split_once(" (").map_or("", |(_, c)| c);
    let f: Vec<&str> = after.split_whitespace().collect();
    let user: f64 = f.get(11)?.parse().ok()?;
    let system: f64 = f.get(12)?.parse().ok()?;
    Some((comm, (user + system) / USER_HZ))
}

/// CPU seconds used so far by each class of a kcache process's threads
/// ([`thread_class`]); empty if its threads cannot be read.
pub fn thread_cpu(pid: u32) -> BTreeMap<&'static str, f64> {
    let mut by_class = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_class;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let Some((comm, seconds)) = stat_cpu(&stat) else {
            continue;
        };
        *by_class.entry(thread_class(tid == pid, comm)).or_default() += seconds;
    }
    by_class
}

/// What a kcache thread does, from its name (`comm`, cut to 15 bytes by the kernel). The
/// main thread runs the actix system the registry is started on: the registry, its
/// coalescing checks and (in a fleet) fleet interest, and the upstream HTTP/2 connections
/// first opened from there (a profile of it during a scale run's opening showed their
/// TLS and h2 work beside the registry's) — and the keys too, unless they have arbiters
/// of their own (`cache.arbiters` > 1; its default gives none on a process pinned to one
/// core). Every other arbiter (the HTTP workers with their watchers, and the keys') is
/// named `actix-rt|system:0|arbiter:N`, which the cut makes one name.
pub fn thread_class(main: bool, comm: &str) -> &'static str {
    if main {
        "main (registry, upstream I/O)"
    } else if comm.starts_with("actix-rt|") {
        "arbiters (HTTP workers, keys)"
    } else {
        "other"
    }
}

/// CPU seconds used so far by the target, the API server and the generator (this process
/// and its watch workers, [`crate::workers`]).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Cpu {
    pub target: f64,
    pub apiserver: f64,
    pub generator: f64,
}

impl Cpu {
    pub fn now(target_pid: u32, apiserver_pid: u32) -> Cpu {
        Cpu {
            target: cpu_seconds(target_pid),
            apiserver: cpu_seconds(apiserver_pid),
            generator: cpu_seconds(std::process::id())
                + crate::workers::pids()
                    .into_iter()
                    .map(cpu_seconds)
                    .sum::<f64>(),
        }
    }
}

impl Sub for Cpu {
    type Output = Cpu;
    fn sub(self, before: Cpu) -> Cpu {
        Cpu {
            target: self.target - before.target,
            apiserver: self.apiserver - before.apiserver,
            generator: self.generator - before.generator,
        }
    }
}

/// Every sample of metric `name` in a Prometheus text exposition: its label set (what is
/// inside the braces, empty without them) and its value. The one reader of the format
/// the sums below share.
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(move |line| {
            let rest = line.strip_prefix(name)?;
            // Not a longer metric name with this prefix.
            if !rest.starts_with(['{', ' ']) {
                return None;
            }
            let value = line.rsplit(' ').next()?.parse::<f64>().ok()?;
            let labels = rest
                .strip_prefix('{')
                .and_then(|r| r.split_once('}'))
                .map_or("", |(l, _)| l);
            Some((labels, value))
        })
}

/// The value of `label` in a sample's label set, if it has it. A label is at the start or
/// after a comma, so `kind` does not match `subkind`.
fn label_value<'a>(labels: &'a str, label: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| {
        let v = kv.strip_prefix(label)?.strip_prefix("=\"")?;
        v.split('"').next()
    })
}

/// The sum of every sample of metric `name` in a Prometheus text exposition (all label
/// sets), or `None` if the metric does not appear (a counter vector that never counted).
pub fn sum_samples(text: &str, name: &str) -> Option<f64> {
    samples(text, name).fold(None, |sum, (_, v)| Some(sum.unwrap_or(0.0) + v))
}

/// The sum of metric `name`'s samples that have every `(label, value)` of `want`; 0 when
/// there are none.
pub fn sum_where(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    samples(text, name)
        .filter(|(labels, _)| want.iter().all(|(k, v)| label_value(labels, k) == Some(*v)))
        // Not `sum()`: an empty float sum is -0.0.
        .fold(0.0, |a, (_, v)| a + v)
}

/// The samples of metric `name` summed by the value of one of its labels (`label`), over
/// the samples whose label `only.0` has the value `only.1` (all with `None`), e.g.
/// `apiserver_longrunning_requests` by `resource` where `verb` is `WATCH`; samples without
/// the label count under the empty string.
pub fn sum_by_label_where(
    text: &str,
    name: &str,
    label: &str,
    only: Option<(&str, &str)>,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (labels, v) in samples(text, name) {
        let value_of = |label: &str| label_value(labels, label).unwrap_or_default();
        if only.is_some_and(|(l, want)| value_of(l) != want) {
            continue;
        }
        *out.entry(value_of(label).to_string()).or_insert(0.0) += v;
    }
    out
}

/// The metric that counts the API server's open watches on every supported version:
/// `apiserver_longrunning_requests{verb="WATCH"}` (`apiserver_registered_watchers`, which
/// earlier harnesses read, was removed in 1.25 and reads nothing on a modern server).
pub const APISERVER_WATCHES: &str = "apiserver_longrunning_requests";

/// The API server's open watches by resource, from its `/metrics` text.
pub fn apiserver_watches_by_resource(text: &str) -> BTreeMap<String, f64> {
    sum_by_label_where(text, APISERVER_WATCHES, "resource", Some(("verb", "WATCH")))
}

/// The API server's open watches, from its `/metrics` text.
pub fn apiserver_watches(text: &str) -> f64 {
    apiserver_watches_by_resource(text).values().sum()
}

/// The API server's open watches at `base`; `None` when its metrics could not be read.
pub async fn apiserver_watches_at(http: &reqwest::Client, base: &str, token: &str) -> Option<f64> {
    Some(apiserver_watches(&scrape(http, base, token).await?))
}

/// Fetches `{base}/metrics` with the bearer token; `None` on any failure.
pub async fn scrape(http: &reqwest::Client, base: &str, token: &str) -> Option<String> {
    let resp = http
        .get(format!("{base}/metrics"))
        .bearer_auth(token)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.text().await.ok()
}

/// One metric's sum at `base`, 0 when the metric is absent and `None` when the endpoint
/// could not be read.
pub async fn metric(http: &reqwest::Client, base: &str, token: &str, name: &str) -> Option<f64> {
    let text = scrape(http, base, token).await?;
    Some(sum_samples(&text, name).unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_field_of_proc_status() {
        let status = "Name:\tkube-apiserver\nVmHWM:\t  812344 kB\nVmRSS:\t  640112 kB\n";
        assert_eq!(status_field(status, "VmRSS:"), Some(640_112));
        assert_eq!(status_field(status, "VmHWM:"), Some(812_344));
        assert_eq!(status_field(status, "VmSwap:"), None);
        // This process: its peak since it started is at least what it held a moment ago.
        let me = std::process::id();
        let held = rss_kib(me);
        assert!(held > 0 && peak_rss_kib(me) >= held);
    }

    #[test]
    fn reads_a_field_of_proc_io() {
        let io = "rchar: 120\nwchar: 340\nsyscr: 7\nsyscw: 42\nread_bytes: 0\n";
        assert_eq!(io_field(io, "syscw"), Some(42));
        assert_eq!(io_field(io, "syscr"), Some(7));
        assert_eq!(io_field(io, "cancelled_write_bytes"), None);
        assert_eq!(io_field("syscw: many\n", "syscw"), None);
    }

    #[test]
    fn this_process_write_calls_count_up() {
        use std::io::Write;
        let before = write_calls(std::process::id()).expect("readable");
        let mut f = unlinked_temp_file();
        for _ in 0..5 {
            f.write_all(b"x").expect("write");
        }
        let after = write_calls(std::process::id()).expect("readable");
        assert!(after >= before + 5, "{before} -> {after}");
    }

    fn unlinked_temp_file() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("kcache-probe-{}", std::process::id()));
        let f = std::fs::File::create(&path).expect("create");
        let _ = std::fs::remove_file(&path);
        f
    }

    #[test]
    fn classes_kcache_threads_by_name() {
        let cases = [
            (true, "kcache", "main (registry, upstream I/O)"),
            (false, "actix-rt|system", "arbiters (HTTP workers, keys)"),
            (false, "actix-server ac", "other"),
            (false, "tokio-runtime-w", "other"),
            (false, "kcache", "other"),
        ];
        for (main, comm, want) in cases {
            assert_eq!(thread_class(main, comm), want, "{comm}");
        }
    }

    #[test]
    fn reads_a_stat_line_whose_name_holds_parentheses() {
        let stat = "42 (x) y) S 1 2 3 4 5 6 7 8 9 10 250 150 0";
        assert_eq!(stat_cpu(stat), Some(("x) y", 4.0)));
        assert_eq!(stat_cpu("42 (x) S 1"), None);
    }

    #[test]
    fn reads_this_process_threads() {
        let by_class = thread_cpu(std::process::id());
        assert!(
            by_class.contains_key("main (registry, upstream I/O)"),
            "{by_class:?}"
        );
    }

    #[test]
    fn counts_the_api_servers_watches_by_resource() {
        let text = "# HELP apiserver_longrunning_requests x\n\
                    apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"secrets\",scope=\"resource\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 100\n\
                    apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"pods\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 2\n\
                    apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"exec\",verb=\"CONNECT\",version=\"v1\"} 5\n";
        assert_eq!(apiserver_watches(text), 102.0);
        assert_eq!(
            apiserver_watches_by_resource(text),
            [("pods".to_string(), 2.0), ("secrets".to_string(), 100.0)].into()
        );
        assert_eq!(apiserver_watches(""), 0.0);
    }

    #[test]
    fn sums_label_sets_and_skips_longer_names() {
        let text = "# HELP apiserver_registered_watchers x\n\
                    apiserver_registered_watchers{group=\"\",kind=\"Secret\",version=\"v1\"} 100\n\
                    apiserver_registered_watchers{group=\"\",kind=\"Pod\",version=\"v1\"} 2\n\
                    apiserver_registered_watchers_other 7\n";
        assert_eq!(
            sum_samples(text, "apiserver_registered_watchers"),
            Some(102.0)
        );
        assert_eq!(sum_samples(text, "kcache_terminated_watchers_total"), None);
        assert_eq!(sum_samples("k 3\n", "k"), Some(3.0));
        let w = "apiserver_registered_watchers";
        assert_eq!(sum_where(text, w, &[("kind", "Pod")]), 2.0);
        assert_eq!(
            sum_where(text, w, &[("group", ""), ("version", "v1")]),
            102.0
        );
        assert_eq!(sum_where(text, w, &[("kind", "Node")]), 0.0);
        assert_eq!(sum_where(text, w, &[]), 102.0);
        assert_eq!(sum_where("k 3\n", "k", &[]), 3.0);
        // A label is matched whole: `resource` is not `subresource`.
        let sub = "r{subresource=\"exec\",resource=\"pods\"} 1\nr{subresource=\"pods\"} 4\n";
        assert_eq!(sum_where(sub, "r", &[("resource", "pods")]), 1.0);
        let by_kind = sum_by_label_where(text, "apiserver_registered_watchers", "kind", None);
        assert_eq!(by_kind.get("Secret"), Some(&100.0));
        assert_eq!(by_kind.get("Pod"), Some(&2.0));
        assert_eq!(by_kind.len(), 2);
    }

    #[test]
    fn own_process_is_readable() {
        assert!(rss_kib(std::process::id()) > 0);
        assert!(cpu_seconds(std::process::id()) >= 0.0);
        assert!(open_files_limit().is_some_and(|n| n > 0));
        let peak = PeakRss::start(std::process::id(), Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(peak.stop(std::process::id()) > 0);
    }
}
