//! Watch workers: child processes that hold a share of the generator's watch
//! connections, for runs with more connections than one process may open. This machine
//! kind's hard open-file limit is 20,000 per process and the generator cannot raise it
//! (it runs without `CAP_SYS_RESOURCE`), so a million kubelet-pattern watches (30,000
//! nodes, one connection each) need at least two processes holding them.
//!
//! [`Workers::spawn`] starts `n` of them: this binary again, as `kcache-bench
//! watch-worker` ([`serve`]). The parent sends each watch (its connection, URL and
//! readiness) to worker `connection % n` on the worker's stdin. The worker opens it with
//! the same [`watch`] code as the parent would, on one HTTP/2 node connection of its own
//! per connection number, and every [`REPORT_EVERY`] writes one line to its stdout: its
//! counters and failure reasons (totals), and the keyed events that arrived since, each
//! with its wall-clock arrival. The parent adds the counters' growth to the session's
//! and hands each arrival to the session's [`Recorder`] at the instant it happened, so a
//! write's latency is measured as in one process: both read the same system clock, and
//! the report's delay does not enter it.

use std::collections::{BTreeMap, HashMap};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::client::node_client;
use crate::record::{lock, Counters, Recorder};
use crate::watch::{self, Ready, WatchReq};

/// The first argument that makes `kcache-bench` a watch worker.
pub const WORKER_ARG: &str = "watch-worker";
/// How often a worker reports.
const REPORT_EVERY: Duration = Duration::from_millis(100);
/// File descriptors a process keeps for everything but its watch connections (probes of
/// `/proc`, scrapes, the write client, the runtime's own).
const OTHER_FILES: usize = 2_000;

/// Failure to start or talk to a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("starting a watch worker: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("a watch worker's {0} is not piped")]
    Pipe(&'static str),
}

/// The parent's first line to a worker.
#[derive(Serialize, Deserialize)]
struct Hello {
    token: String,
}

/// One watch for a worker to open.
#[derive(Serialize, Deserialize)]
struct Open {
    /// The pool and connection number the watch rides on: a worker holds one connection
    /// per pair, as the parent's pool would.
    pool: u64,
    conn: usize,
    url: String,
    /// Its node's own token; none: the hello's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    /// Established at its response headers ([`Ready::Headers`]), else at its first event.
    headers: bool,
}

/// A worker's periodic line: totals so far, and the arrivals since the last line.
#[derive(Serialize, Deserialize, Default, Clone, Debug, PartialEq)]
struct Report {
    opened: usize,
    ready: usize,
    failed: usize,
    errors: usize,
    ended: usize,
    reasons: BTreeMap<String, usize>,
    /// (write key, arrival in nanoseconds since the Unix epoch).
    arrivals: Vec<(String, u64)>,
}

/// Connections one process may hold: its open-file limit less [`OTHER_FILES`].
pub fn per_process() -> usize {
    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| nofile_soft_limit(&s))
        .unwrap_or(1024);
    limit.saturating_sub(OTHER_FILES).max(100)
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text.
fn nofile_soft_limit(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    match soft {
        "unlimited" => Some(usize::MAX),
        n => n.parse().ok(),
    }
}

/// Worker processes alive now, for the generator's CPU account ([`crate::probe::Cpu`]).
static PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The pids of the watch workers running now.
pub fn pids() -> Vec<u32> {
    lock(&PIDS).clone()
}

/// The running workers of one session.
pub struct Workers {
    senders: Vec<mpsc::UnboundedSender<Open>>,
    children: Vec<Child>,
    tasks: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` workers that open watches with `token` and report into `rec`.
    pub fn spawn(n: usize, token: &str, rec: Arc<Recorder>) -> Result<Workers, WorkerError> {
        let exe = std::env::current_exe()?;
        let mut w = Workers {
            senders: Vec::new(),
            children: Vec::new(),
            tasks: Vec::new(),
        };
        for _ in 0..n.max(1) {
            let mut child = Command::new(&exe)
                .arg(WORKER_ARG)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()?;
            let stdin = child.stdin.take().ok_or(WorkerError::Pipe("stdin"))?;
            let stdout = child.stdout.take().ok_or(WorkerError::Pipe("stdout"))?;
            if let Some(pid) = child.id() {
                lock(&PIDS).push(pid);
            }
            let (tx, rx) = mpsc::unbounded_channel();
            w.tasks
                .push(tokio::spawn(feed(stdin, token.to_string(), rx)));
            w.tasks.push(tokio::spawn(collect(stdout, rec.clone())));
            w.senders.push(tx);
            w.children.push(child);
        }
        Ok(w)
    }

    /// Hands one watch to the worker that holds connection `conn` of pool `pool`
    /// ([`crate::client::ConnPool::id`]). A
    /// worker that has gone away fails its watches (counted, so nothing waits on them).
    pub fn open(
        &self,
        rec: &Recorder,
        pool: u64,
        conn: usize,
        url: String,
        token: Option<String>,
        ready: Ready,
    ) {
        let sender = &self.senders[conn % self.senders.len()];
        let open = Open {
            pool,
            conn,
            url,
            token,
            headers: ready == Ready::Headers,
        };
        if sender.send(open).is_err() {
            Counters::inc(&rec.counters.opened);
            Counters::inc(&rec.counters.failed);
            rec.failure("watch worker gone".into());
        }
    }

    /// Ends the workers and their watches.
    pub async fn stop(mut self) {
        self.senders.clear();
        for mut c in self.children.drain(..) {
            let pid = c.id();
            let _ = c.kill().await;
            lock(&PIDS).retain(|p| Some(*p) != pid);
        }
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

/// Writes the hello and then each watch to a worker's stdin, one JSON line each.
async fn feed(
    stdin: tokio::process::ChildStdin,
    token: String,
    mut rx: mpsc::UnboundedReceiver<Open>,
) {
    let mut out = BufWriter::new(stdin);
    let hello = line(&Hello { token });
    if out.write_all(hello.as_bytes()).await.is_err() || out.flush().await.is_err() {
        return;
    }
    while let Some(open) = rx.recv().await {
        let mut batch = line(&open);
        // What is queued already goes in the same write.
        while let Ok(more) = rx.try_recv() {
            batch.push_str(&line(&more));
        }
        if out.write_all(batch.as_bytes()).await.is_err() || out.flush().await.is_err() {
            return;
        }
    }
}

/// Reads a worker's reports into `rec`.
async fn collect(stdout: tokio::process::ChildStdout, rec: Arc<Recorder>) {
    let mut lines = BufReader::new(stdout).lines();
    let mut last = Report::default();
    while let Ok(Some(line)) = lines.next_line().await {
        match serde_json::from_str::<Report>(&line) {
            Ok(r) => {
                apply(&rec, &last, &r, Instant::now(), SystemTime::now());
                last = Report {
                    arrivals: Vec::new(),
                    ..r
                };
            }
            Err(e) => rec.failure(format!("watch worker report unreadable: {e}")),
        }
    }
}

/// Adds what a worker's report `r` says beyond its previous one to `rec`: counters and
/// reasons by their growth, arrivals at their instants (`now` and `wall` read together).
fn apply(rec: &Recorder, last: &Report, r: &Report, now: Instant, wall: SystemTime) {
    let c = &rec.counters;
    for (counter, new, old) in [
        (&c.opened, r.opened, last.opened),
        (&c.ready, r.ready, last.ready),
        (&c.failed, r.failed, last.failed),
        (&c.errors, r.errors, last.errors),
        (&c.ended, r.ended, last.ended),
    ] {
        counter.fetch_add(new.saturating_sub(old), Ordering::Relaxed);
    }
    for (reason, n) in &r.reasons {
        let before = last.reasons.get(reason).copied().unwrap_or(0);
        for _ in before..*n {
            rec.note(reason.clone());
        }
    }
    let wall_ns = unix_ns(wall);
    for (key, at_ns) in &r.arrivals {
        let at = if *at_ns <= wall_ns {
            now.checked_sub(Duration::from_nanos(wall_ns - at_ns))
        } else {
            now.checked_add(Duration::from_nanos(at_ns - wall_ns))
        };
        rec.delivered(key, at.unwrap_or(now));
    }
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A worker's main: reads the hello and watches from stdin, reports on stdout, and exits
/// when stdin closes (the parent is done or gone).
pub async fn serve() -> ExitCode {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let token = match lines.next_line().await {
        Ok(Some(l)) => match serde_json::from_str::<Hello>(&l) {
            Ok(h) => h.token,
            Err(e) => {
                eprintln!("watch worker: unreadable hello: {e}");
                return ExitCode::FAILURE;
            }
        },
        _ => return ExitCode::FAILURE,
    };
    // Records every keyed event: which writes are current is the parent's to decide.
    let rec = Arc::new(Recorder::reference());
    let origin = (Instant::now(), SystemTime::now());
    let reporter = tokio::spawn(report(rec.clone(), origin));
    let mut clients: HashMap<(u64, usize), reqwest::Client> = HashMap::new();
    while let Ok(Some(l)) = lines.next_line().await {
        let open = match serde_json::from_str::<Open>(&l) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("watch worker: unreadable watch line: {e}");
                continue;
            }
        };
        let client = clients
            .entry((open.pool, open.conn))
            .or_insert_with(|| node_client(false))
            .clone();
        let ready = if open.headers {
            Ready::Headers
        } else {
            Ready::FirstEvent
        };
        let req = WatchReq {
            client,
            url: open.url,
            token: open.token.unwrap_or_else(|| token.clone()),
        };
        // Detached: the watch runs until the stream ends or this process does.
        drop(watch::spawn(req, ready, rec.clone()));
    }
    reporter.abort();
    ExitCode::SUCCESS
}

/// Writes a [`Report`] line every [`REPORT_EVERY`] until stdout is gone.
async fn report(rec: Arc<Recorder>, origin: (Instant, SystemTime)) {
    let mut out = tokio::io::stdout();
    let origin_ns = unix_ns(origin.1);
    loop {
        tokio::time::sleep(REPORT_EVERY).await;
        let c = &rec.counters;
        let arrivals = rec
            .take_arrivals()
            .into_iter()
            .flat_map(|(key, at)| {
                at.into_iter().map(move |a| {
                    let ns = a.saturating_duration_since(origin.0).as_nanos() as u64;
                    (key.clone(), origin_ns + ns)
                })
            })
            .collect();
        let r = Report {
            opened: Counters::get(&c.opened),
            ready: Counters::get(&c.ready),
            failed: Counters::get(&c.failed),
            errors: Counters::get(&c.errors),
            ended: Counters::get(&c.ended),
            reasons: rec.reasons(),
            arrivals,
        };
        let mut line = match serde_json::to_string(&r) {
            Ok(l) => l,
            Err(_) => continue,
        };
        line.push('\n');
        if out.write_all(line.as_bytes()).await.is_err() || out.flush().await.is_err() {
            // The parent is gone: nothing to hold the watches for.
            std::process::exit(0);
        }
    }
}

/// One JSON line of a message.
fn line<T: Serialize>(v: &T) -> String {
    // Serializing these plain structs cannot fail.
    let mut s = serde_json::to_string(v).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::next_seq_key;

    #[test]
    fn the_soft_open_file_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            20000                20000                files     \n";
        assert_eq!(nofile_soft_limit(limits), Some(20_000));
        assert_eq!(
            nofile_soft_limit(
                "Max open files            unlimited            unlimited            files"
            ),
            Some(usize::MAX)
        );
        assert_eq!(nofile_soft_limit("Max processes 10 10"), None);
    }

    #[test]
    fn a_report_adds_its_growth_and_its_arrivals_at_their_instants() {
        let rec = Recorder::new(1);
        let key = next_seq_key();
        rec.mark_sent(key.clone(), 0);
        // The report is read as if 100 ms after the write was sent.
        let now = Instant::now() + Duration::from_millis(100);
        let wall = SystemTime::now() + Duration::from_millis(100);
        let ms = |n: u64| unix_ns(wall) - n * 1_000_000;
        let first = Report {
            opened: 5,
            ready: 3,
            failed: 1,
            errors: 1,
            ended: 0,
            reasons: BTreeMap::from([("watch connect error".to_string(), 1)]),
            // One current write's arrival 40 ms ago, and an old key (an initial event).
            arrivals: vec![(key.clone(), ms(40)), ("s0".into(), ms(30))],
        };
        apply(&rec, &Report::default(), &first, now, wall);
        let second = Report {
            ready: 4,
            reasons: BTreeMap::from([("watch connect error".to_string(), 3)]),
            arrivals: vec![(key.clone(), ms(10))],
            ..first.clone()
        };
        let last = Report {
            arrivals: Vec::new(),
            ..first
        };
        apply(&rec, &last, &second, now, wall);
        let c = &rec.counters;
        assert_eq!(
            [&c.opened, &c.ready, &c.failed, &c.errors, &c.ended].map(Counters::get),
            [5, 4, 1, 1, 0]
        );
        assert_eq!(rec.reasons()["watch connect error"], 3);
        // Two deliveries of the current write; the old key does not count.
        assert_eq!(rec.count(0), 2);
        assert_eq!(Counters::get(&c.deliveries), 2);
        // Arrivals 40 and 10 ms before the report was read: ~60 and ~90 ms after the
        // write was sent.
        let s = rec.sorted(0);
        assert!(s[0] >= Duration::from_millis(55), "{s:?}");
        assert!(s[0] <= Duration::from_millis(65), "{s:?}");
        let gap = s[1] - s[0];
        assert!(
            gap > Duration::from_millis(29) && gap < Duration::from_millis(31),
            "{s:?}"
        );
    }
}
