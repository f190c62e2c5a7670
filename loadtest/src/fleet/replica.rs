//! The replicas of a fleet under test: their processes (kill, start again, alive, ready)
//! and what their endpoints say (`/metrics`, `/debug/keys`).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client::insecure_client;
use crate::probe::{scrape, sum_where};

pub struct Replica {
    pub url: String,
    pub pid: u32,
    pub client: reqwest::Client,
}

/// The bench's client: certificates not verified, no request timeout (watches).
pub fn http() -> reqwest::Client {
    insecure_client(Duration::from_secs(30), None)
}

pub async fn metric(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    scrape(http, base, token)
        .await
        .map_or(0.0, |t| sum_where(&t, name, labels))
}

pub async fn debug_keys(http: &reqwest::Client, base: &str, token: &str) -> Value {
    match http
        .get(format!("{base}/debug/keys"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(10))
        .send()
        .await
    {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// Starts replica `r` again with `cmd` (`{i}` → r): its new pid.
pub async fn restart(cmd: &str, r: usize) -> Result<u32, String> {
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd.replace("{i}", &r.to_string()))
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .map_err(|e| format!("restart command: {e}"))?;
    if !out.status.success() {
        return Err(format!("restart command exited with {}", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| "restart command printed no pid".to_string())
}

pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| {
            !s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
        .unwrap_or(false)
}

pub async fn wait_ready(http: &reqwest::Client, url: &str, pid: u32, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Ok(r) = http
            .get(format!("{url}/readyz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
        {
            if r.status().is_success() {
                return true;
            }
        }
        if !alive(pid) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
