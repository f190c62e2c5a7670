//! The process's own figures on `/metrics`, under the names every Prometheus client
//! library exports (`process_resident_memory_bytes`, …), so kcache's pods sit on the same
//! dashboards as any other; plus `kcache_build_info`. RSS is the headline figure of
//! kcache's benchmarks. Read from `/proc/self` at each scrape (Linux; elsewhere absent).

use std::sync::OnceLock;

const RSS: &str = "process_resident_memory_bytes";
const CPU: &str = "process_cpu_seconds_total";
const FDS: &str = "process_open_fds";
const START: &str = "process_start_time_seconds";
const BUILD_INFO: &str = "kcache_build_info";

/// Describes the metrics and sets the ones that never change.
pub fn init() {
    use metrics::{describe_gauge, gauge};
    describe_gauge!(RSS, metrics::Unit::Bytes, "Resident memory size.");
    describe_gauge!(
        CPU,
        metrics::Unit::Seconds,
        "User and system CPU time spent."
    );
    describe_gauge!(FDS, "Open file descriptors.");
    describe_gauge!(
        START,
        metrics::Unit::Seconds,
        "Start time since the Unix epoch."
    );
    describe_gauge!(BUILD_INFO, "Always 1; the build's version in its labels.");
    gauge!(
        BUILD_INFO,
        "version" => env!("CARGO_PKG_VERSION"),
        "revision" => env!("KCACHE_GIT_REVISION"),
    )
    .set(1.0);
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    gauge!(START).set(start);
}

/// Reads the current figures into their gauges; called before each `/metrics` render.
pub fn refresh() {
    let Some(now) = read() else {
        return;
    };
    metrics::gauge!(RSS).set(now.rss_bytes);
    metrics::gauge!(CPU).set(now.cpu_seconds);
    metrics::gauge!(FDS).set(now.open_fds);
}

struct Figures {
    rss_bytes: f64,
    cpu_seconds: f64,
    open_fds: f64,
}

fn read() -> Option<Figures> {
    static UNITS: OnceLock<(f64, f64)> = OnceLock::new();
    let (page, ticks) = *UNITS.get_or_init(|| {
        // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (page.max(1) as f64, ticks.max(1) as f64)
    });
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces, inside parentheses):
    // utime and stime are the 14th and 15th of the line, the 12th and 13th after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
    Some(Figures {
        rss_bytes: resident * page,
        cpu_seconds: (utime + stime) / ticks,
        open_fds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let f = read().expect("/proc/self");
        assert!(f.rss_bytes > 1_000_000.0, "{}", f.rss_bytes);
        assert!(f.open_fds >= 3.0);
        assert!(f.cpu_seconds >= 0.0);
    }
}
