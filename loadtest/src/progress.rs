//! The live progress line on stderr (indicatif): the current stage, watches sent and
//! established, writes, deliveries and errors of the target being measured. It is off
//! when stderr is not a terminal (or with `--no-progress`); stage changes are then
//! printed as plain lines instead, so logs of scripted runs stay readable.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;

use crate::record::{lock, Counters, Recorder};

#[derive(Clone)]
pub struct Progress {
    bar: ProgressBar,
    enabled: bool,
    stage: Arc<Mutex<String>>,
}

impl Progress {
    /// A live display if `wanted` and stderr is a terminal, else plain stage lines.
    pub fn new(wanted: bool) -> Progress {
        let enabled = wanted && std::io::stderr().is_terminal();
        let bar = if enabled {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {prefix} [{elapsed_precise}] {msg}")
            {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        } else {
            ProgressBar::hidden()
        };
        Progress {
            bar,
            enabled,
            stage: Arc::default(),
        }
    }

    /// Prints a line above the live display (or plainly when it is off).
    pub fn log(&self, msg: &str) {
        if self.enabled {
            self.bar.suspend(|| eprintln!("{msg}"));
        } else {
            eprintln!("{msg}");
        }
    }

    /// Names the current stage (shown live, or printed when the display is off).
    pub fn stage(&self, stage: &str) {
        *lock(&self.stage) = stage.to_string();
        if !self.enabled {
            match self.bar.prefix() {
                p if p.is_empty() => eprintln!("  {stage}"),
                p => eprintln!("  {p}: {stage}"),
            }
        }
    }

    /// Shows `rec`'s counters under `prefix` until the returned guard is dropped.
    pub fn track(&self, prefix: String, rec: Arc<Recorder>, watches: usize) -> Tracking {
        self.bar.set_prefix(prefix);
        self.bar.reset_elapsed();
        let task = self.enabled.then(|| {
            let (bar, stage) = (self.bar.clone(), self.stage.clone());
            tokio::spawn(async move {
                loop {
                    let c = &rec.counters;
                    bar.set_message(format!(
                        "{} | watches {}/{watches} sent, {} up, {} ended | writes {} | deliveries {} | errors {}",
                        lock(&stage),
                        Counters::get(&c.opened),
                        Counters::get(&c.ready),
                        Counters::get(&c.ended),
                        Counters::get(&c.writes),
                        Counters::get(&c.deliveries),
                        Counters::get(&c.errors),
                    ));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        });
        Tracking {
            task,
            bar: self.bar.clone(),
        }
    }

    /// Removes the live display for good.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Keeps the live counters updating; stops them when dropped.
pub struct Tracking {
    task: Option<JoinHandle<()>>,
    bar: ProgressBar,
}

impl Drop for Tracking {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.bar.set_message("");
    }
}
