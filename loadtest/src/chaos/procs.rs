//! The processes the soak kills, pauses and restarts: kcache replicas and NATS nodes.
//!
//! `loadtest/chaos.sh` writes, for each, `<dir>/<name>.run`: a script that `exec`s the
//! process with its full command line and appends its output to `<dir>/<name>.log`.
//! The driver runs that script as its own child (so it is the parent that reaps it)
//! and keeps the pid in `<dir>/<name>.pid` for chaos.sh's clean-up if the driver dies.
//! A restart is the same script again: same flags, ports and store.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Proc {
    pub name: String,
    dir: PathBuf,
    child: Option<Child>,
    /// SIGSTOPped and not yet resumed.
    pub paused: bool,
}

impl Proc {
    pub fn new(name: &str, dir: &std::path::Path) -> Proc {
        Proc {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            child: None,
            paused: false,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts `<name>.run`.
    pub fn start(&mut self) -> std::io::Result<u32> {
        let script = self.dir.join(format!("{}.run", self.name));
        let child = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id();
        std::fs::write(
            self.dir.join(format!("{}.pid", self.name)),
            format!("{pid}\n"),
        )?;
        self.child = Some(child);
        self.paused = false;
        Ok(pid)
    }

    /// Whether it is running (not exited; a paused process is running).
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL, and reap it: a crash, no goodbye to anyone.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused = false;
    }

    fn signal(&self, sig: &str) -> bool {
        let Some(pid) = self.pid() else {
            return false;
        };
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// SIGSTOP: a process that holds its sockets and answers nothing (a long GC pause, a
    /// frozen VM).
    pub fn pause(&mut self) -> bool {
        let ok = self.signal("-STOP");
        self.paused |= ok;
        ok
    }

    pub fn resume(&mut self) -> bool {
        let ok = self.signal("-CONT");
        if ok {
            self.paused = false;
        }
        ok
    }

    /// SIGTERM (after SIGCONT: a stopped process does not act on it).
    pub fn terminate(&mut self) {
        if self.paused {
            self.resume();
        }
        self.signal("-TERM");
    }
}

/// Stops them all: SIGTERM at once, up to `grace` to exit, then SIGKILL.
pub async fn stop_all(procs: &mut [&mut Proc], grace: Duration) {
    for p in procs.iter_mut() {
        p.terminate();
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && procs.iter_mut().any(|p| p.alive()) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for p in procs.iter_mut() {
        p.kill9();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.paused {
            self.resume();
        }
        self.kill9();
    }
}

/// Waits until `127.0.0.1:port` accepts a TCP connection.
pub async fn wait_tcp(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Waits until `url` answers 200 (any certificate).
pub async fn wait_ok(http: &reqwest::Client, url: &str, token: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let r = http
            .get(url)
            .bearer_auth(token)
            .timeout(Duration::from_secs(3))
            .send()
            .await;
        if r.is_ok_and(|r| r.status().is_success()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}
