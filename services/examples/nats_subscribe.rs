//! A plain NATS subscriber of one kcache key, on the `kcache-subscriber` library: prints
//! the snapshot, then each event, and the position to resume from (`--from`) when it is
//! stopped (Ctrl-C).
//!
//! ```sh
//! cargo run -p kcache --example nats_subscribe -- --nats nats://127.0.0.1:4222 \
//!   --token-file nats-token --key _.v1.configmaps.demo.all._ --from 7:1234
//! ```

use std::sync::Arc;

use base64::Engine;
use clap::Parser;
use kcache_actors::core::seal::Keyring;
use kcache_subscriber::{follow, Options, Position, Update};

#[derive(Parser)]
struct Args {
    /// NATS server URL.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// A file holding the NATS token.
    #[arg(long)]
    token_file: Option<String>,
    /// The key's six tokens, e.g. `_.v1.secrets.default.name.my=2Esecret`.
    #[arg(long)]
    key: String,
    /// A file with the base64 encryption key, to open sealed resources (Secrets).
    #[arg(long)]
    key_file: Option<String>,
    /// Its key id.
    #[arg(long, default_value = "k1")]
    key_id: String,
    #[arg(long, default_value = "kcache")]
    prefix: String,
    /// Resume from `EPOCH:SEQ` (printed when the last run stopped): a replica replays the
    /// retained events after it (`[nats] retain`), else a snapshot.
    #[arg(long)]
    from: Option<String>,
}

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    let mut opts = async_nats::ConnectOptions::new();
    if let Some(f) = &args.token_file {
        opts = opts.token(std::fs::read_to_string(f)?.trim().to_string());
    }
    let client = opts.connect(&args.nats).await?;
    let mut options = Options::new(&args.prefix, &args.key);
    if let Some(f) = &args.key_file {
        let key =
            base64::engine::general_purpose::STANDARD.decode(std::fs::read_to_string(f)?.trim())?;
        options.keyring = Some(Arc::new(Keyring::new(
            vec![(args.key_id.clone(), key)],
            &args.key_id,
        )?));
    }
    let from = match &args.from {
        Some(s) => {
            let (epoch, seq) = s.split_once(':').ok_or("--from is EPOCH:SEQ")?;
            Some(Position {
                epoch: epoch.parse()?,
                seq: seq.parse()?,
            })
        }
        None => None,
    };
    let mut sub = follow(client, options, from).await?;
    let mut position = from;
    loop {
        let update = tokio::select! {
            u = sub.next() => u,
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(update) = update else { break };
        position = update.position().or(position);
        match update {
            Update::Snapshot { stamp, list } => {
                let list: serde_json::Value = serde_json::from_slice(&list)?;
                let n = list["items"].as_array().map_or(0, Vec::len);
                println!(
                    "SNAPSHOT epoch={} seq={} rv={} objects={n}",
                    stamp.epoch, stamp.seq, stamp.rv
                );
            }
            Update::Event {
                stamp,
                line,
                replayed,
            } => {
                let ev: serde_json::Value = serde_json::from_slice(&line)?;
                println!(
                    "{} {} rv={} seq={}{}",
                    ev["type"].as_str().unwrap_or("?"),
                    ev["object"]["metadata"]["name"].as_str().unwrap_or("?"),
                    stamp.rv,
                    stamp.seq,
                    if replayed { " (replayed)" } else { "" }
                );
            }
            Update::Progress { rv } => eprintln!("progress rv={rv}"),
            Update::Resumed { replayed } => eprintln!("resumed: {replayed} events from the log"),
            Update::Resync(why) => eprintln!("resynchronising: {why:?}"),
            Update::Refused(why) => eprintln!("refused a message: {why}"),
        }
    }
    if let Some(p) = position {
        eprintln!("stopped; resume with --from {}:{}", p.epoch, p.seq);
    }
    Ok(())
}
