//! The failover phase: the owner of a written key is killed with SIGKILL, `kills` times;
//! how soon events flow again on the survivors, whether any write around the kill went
//! missing, and whether keys changed hands while their owner was alive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::ownership::{changes_json, ownership, sub, Ledger};
use super::replica::{http, loadavg, restart, wait_ready, Replica};
use super::watches::{distribution, ms_between, now_ns, open_watches, Api, Collected};

/// The phase's settings (`kcache-fleet-bench`'s flags of the same names).
pub struct Params {
    pub kills: usize,
    pub restart_cmd: Option<String>,
    pub failover_keys: usize,
    pub failover_write_ms: u64,
    pub failover_watches: usize,
    pub writes_per_sec: u64,
    pub per_replica: usize,
    pub settle_secs: u64,
    pub recover_timeout_secs: u64,
}

pub async fn run(
    p: &Params,
    api: &Api,
    replicas: &mut [Replica],
    sink: &Arc<Mutex<Collected>>,
) -> Value {
    let fo: Vec<usize> = (api.secrets..api.secrets + p.failover_keys.max(1)).collect();
    let target = fo[0];
    let target_path = api.path(target);
    for &key in &fo {
        api.create(key).await;
    }
    let mut expected_added = sink.lock().expect("c").added;
    for (r, rep) in replicas.iter().enumerate() {
        expected_added += open_watches(
            api,
            rep,
            r,
            fo.iter().copied(),
            |_| p.failover_watches,
            sink,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink.lock().expect("c").added < expected_added && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Continuous writes: every failover ConfigMap every --failover-write-ms (their times
    // kept), and the Secrets at --writes-per-sec as background load.
    let stop = Arc::new(AtomicBool::new(false));
    let written: Arc<Mutex<HashMap<usize, Vec<u128>>>> = Arc::default();
    let mut writers = Vec::new();
    for &key in &fo {
        let (api, stop, written) = (api.clone(), stop.clone(), written.clone());
        let every = Duration::from_millis(p.failover_write_ms.max(1));
        writers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                if let Some(t) = api.write(key).await {
                    written
                        .lock()
                        .expect("written")
                        .entry(key)
                        .or_default()
                        .push(t);
                }
            }
        }));
    }
    {
        let (api, stop) = (api.clone(), stop.clone());
        let every = Duration::from_secs(1) / p.writes_per_sec.max(1) as u32;
        writers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let _ = api.write(i % api.secrets.max(1)).await;
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let kills = if p.restart_cmd.is_some() {
        p.kills
    } else {
        if p.kills > 1 {
            eprintln!("failover: no --restart-cmd, so one kill only");
        }
        p.kills.min(1)
    };
    let mut ledger = Ledger::new(replicas.len());
    let all: Vec<usize> = (0..replicas.len()).collect();
    ledger.refresh(replicas, api.token(), &all).await;
    let start_total = ledger.total();
    let timeout = Duration::from_secs(p.recover_timeout_secs);
    let mut per_kill = Vec::new();
    let mut flowing = Vec::new();
    let mut all_flowing = Vec::new();
    let mut slowest_key = Vec::new();
    let mut not_recovered = 0;
    let mut explained_total = 0.0;
    let mut while_alive = 0.0;
    let mut shortfall = 0.0;
    let mut missing_total = 0;
    let mut aborted = Value::Null;
    let load_start = loadavg();

    for k in 0..kills {
        // The target key's one owner, and every key each replica owns.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut split = 0;
        let (victim, owned) = loop {
            let (owners, owned) = ownership(replicas, api.token(), &target_path).await;
            if owners.len() == 1 {
                break (Some(owners[0]), owned);
            }
            if owners.len() > 1 {
                split += 1;
            }
            if Instant::now() > deadline {
                break (None, owned);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let Some(victim) = victim else {
            aborted = json!(format!(
                "kill {}: no single owner of {target_path} in 30 s",
                k + 1
            ));
            break;
        };
        let victim_keys = owned[victim].clone();
        let victim_fo: Vec<usize> = fo
            .iter()
            .copied()
            .filter(|key| victim_keys.contains(&api.path(*key)))
            .collect();
        let survivors: Vec<usize> = all.iter().copied().filter(|r| *r != victim).collect();
        ledger.refresh(replicas, api.token(), &all).await;
        let before = ledger.total();

        let kill_at = now_ns();
        let killed = tokio::process::Command::new("kill")
            .args(["-9", &replicas[victim].pid.to_string()])
            .status()
            .await
            .is_ok_and(|s| s.success());
        ledger.killed(victim);
        if !killed {
            aborted = json!(format!(
                "kill {}: kill -9 {} failed",
                k + 1,
                replicas[victim].pid
            ));
            break;
        }

        // Events flow again: the first write made after the kill arrives on a survivor,
        // for the target key and for every written key the victim owned.
        let until = Instant::now() + timeout;
        loop {
            let done = {
                let c = sink.lock().expect("c");
                victim_fo
                    .iter()
                    .chain(std::iter::once(&target))
                    .all(|key| c.first_after(*key, &survivors, kill_at).is_some())
                    && survivors
                        .iter()
                        .all(|r| c.first_after(target, &[*r], kill_at).is_some())
            };
            if done || Instant::now() > until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (first, per_survivor, per_key) = {
            let c = sink.lock().expect("c");
            let first = c
                .first_after(target, &survivors, kill_at)
                .map(|t| ms_between(kill_at, t));
            let per_survivor: Vec<Option<f64>> = survivors
                .iter()
                .map(|r| {
                    c.first_after(target, &[*r], kill_at)
                        .map(|t| ms_between(kill_at, t))
                })
                .collect();
            let per_key: Vec<(usize, Option<f64>)> = victim_fo
                .iter()
                .map(|key| {
                    (
                        *key,
                        c.first_after(*key, &survivors, kill_at)
                            .map(|t| ms_between(kill_at, t)),
                    )
                })
                .collect();
            (first, per_survivor, per_key)
        };
        let cap = timeout.as_secs_f64() * 1000.0;
        if first.is_none() {
            not_recovered += 1;
        }
        flowing.push(first.unwrap_or(cap));
        all_flowing.push(
            per_survivor
                .iter()
                .map(|m| m.unwrap_or(cap))
                .fold(0.0, f64::max),
        );
        slowest_key.push(
            per_key
                .iter()
                .map(|(_, m)| m.unwrap_or(cap))
                .fold(first.unwrap_or(cap), f64::max),
        );
        let (new_owners, _) = ownership(replicas, api.token(), &target_path).await;
        tokio::time::sleep(Duration::from_secs(2)).await;

        // Start the victim again, reopen its watches, let the fleet settle.
        let mut restart_ms = Value::Null;
        let mut restart_error = Value::Null;
        if let Some(cmd) = &p.restart_cmd {
            let started = Instant::now();
            match restart(cmd, victim).await {
                Ok(pid) => {
                    replicas[victim].pid = pid;
                    replicas[victim].client = http();
                    let rep = &replicas[victim];
                    if wait_ready(&rep.client, &rep.url, pid, Duration::from_secs(60)).await {
                        restart_ms = json!(started.elapsed().as_secs_f64() * 1000.0);
                        // (The count read first: open_watches locks the sink.)
                        let added = sink.lock().expect("c").added;
                        let expected = added
                            + open_watches(
                                api,
                                rep,
                                victim,
                                (0..api.secrets).chain(fo.iter().copied()),
                                |key| {
                                    if key < api.secrets {
                                        p.per_replica
                                    } else {
                                        p.failover_watches
                                    }
                                },
                                sink,
                            );
                        let deadline = Instant::now() + Duration::from_secs(60);
                        while sink.lock().expect("c").added < expected && Instant::now() < deadline
                        {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    } else {
                        restart_error = json!("not ready within 60 s");
                    }
                }
                Err(e) => restart_error = json!(e),
            }
            tokio::time::sleep(Duration::from_secs(p.settle_secs)).await;
        }

        // Every write to a failover key from 1 s before the kill until 3 s ago, on every
        // survivor watch that was open (had its object) before that.
        let check_from = kill_at.saturating_sub(1_000_000_000);
        let check_to = now_ns().saturating_sub(3_000_000_000);
        let (missing, checked, ended) = {
            let c = sink.lock().expect("c");
            let w = written.lock().expect("written");
            c.missing(&w, &survivors, &fo, (check_from, check_to))
        };
        missing_total += missing;

        ledger.refresh(replicas, api.token(), &all).await;
        let delta = sub(ledger.total(), before);
        let explained = victim_keys.len() as f64;
        explained_total += explained;
        let excess = delta[0] - explained;
        if excess > 0.0 {
            while_alive += excess;
        } else {
            shortfall -= excess;
        }
        let record = json!({
            "kill": k + 1,
            "victim": victim,
            "victim_owned_keys": victim_keys.len(),
            "victim_owned_written_keys": victim_fo.len(),
            "events_flowing_again_ms": first,
            "per_survivor_ms": survivors.iter().zip(&per_survivor).map(|(r, m)| json!({"replica": r, "ms": m})).collect::<Vec<_>>(),
            "per_written_key_ms": per_key.iter().map(|(key, m)| json!({"key": api.path(*key), "ms": m})).collect::<Vec<_>>(),
            "new_owner": new_owners,
            "split_owner_polls": split,
            "ownership_changes": changes_json(delta),
            "acquisitions_explained": explained,
            "takeovers_while_alive": excess.max(0.0),
            "slow_path_acquisitions": (delta[0] - delta[1]).max(0.0),
            "restart_ready_ms": restart_ms,
            "restart_error": restart_error,
            "deliveries_checked": checked,
            "deliveries_missing": missing,
            "survivor_watches_ended": ended,
        });
        eprintln!(
            "kill {:>2}/{kills}: r{victim} (owned {} keys) → events flowing again after {} ms on r{:?}; acquired {} taken-over {} lost {}; missing {missing}/{checked}",
            k + 1,
            victim_keys.len(),
            first.map_or("NOT RECOVERED".to_string(), |m| format!("{m:.0}")),
            new_owners,
            delta[0],
            delta[1],
            delta[2],
        );
        per_kill.push(record);
        if !restart_error.is_null() {
            aborted = json!(format!("kill {}: restart of r{victim} failed", k + 1));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }

    let total = sub(ledger.total(), start_total);
    let dist = distribution(&flowing);
    let p99 = dist["p99_ms"].as_f64().unwrap_or(f64::MAX);
    let lost = total[2];
    let met = per_kill.len() == kills
        && not_recovered == 0
        && p99 <= 2000.0
        && while_alive == 0.0
        && lost == 0.0;
    let result = json!({
        "kills_requested": kills,
        "kills_done": per_kill.len(),
        "aborted": aborted,
        "target_key": target_path,
        "written_keys": fo.len(),
        "write_every_ms": p.failover_write_ms,
        "background_secret_writes_per_sec": p.writes_per_sec,
        "settle_secs": p.settle_secs,
        "events_flowing_again": dist,
        "events_flowing_again_samples_ms": flowing,
        "not_recovered": not_recovered,
        "within_2s": flowing.iter().filter(|m| **m <= 2000.0).count(),
        "every_survivor_flowing_again": distribution(&all_flowing),
        "slowest_written_victim_key": distribution(&slowest_key),
        "ownership_changes": changes_json(total),
        "acquisitions_explained_by_kills": explained_total,
        "takeovers_while_alive": while_alive,
        "acquisitions_short_of_kills": shortfall,
        "lost": lost,
        "slow_path_acquisitions": (total[0] - total[1]).max(0.0),
        "deliveries_missing": missing_total,
        "metric_scrape_failures": ledger.scrape_failures,
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "target": {"p99_ms_at_most": 2000, "takeovers_while_alive": 0, "met": met},
        "per_kill": per_kill,
    });
    eprintln!(
        "failover over {} kills: events flowing again p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} within 2 s, {not_recovered} not recovered); takeovers while alive {while_alive}, lost {lost}; acquired {} (taken-over {}), explained by kills {explained_total}; missing deliveries {missing_total}; target p99 ≤ 2 s and 0 takeovers while alive: {}",
        per_kill.len(),
        dist["p50_ms"].as_f64().unwrap_or(0.0),
        dist["p90_ms"].as_f64().unwrap_or(0.0),
        p99,
        dist["max_ms"].as_f64().unwrap_or(0.0),
        result["within_2s"],
        total[0],
        total[1],
        if met { "met" } else { "NOT met" },
    );
    result
}
