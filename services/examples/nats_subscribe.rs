//! A plain NATS subscriber of one kcache key, following the contract in `docs/nats.md`:
//! subscribe to the key's events, ask its owner for a snapshot, then apply events in seq
//! order, resynchronising on a gap or a new owner. Prints the state, then each event.
//!
//! ```sh
//! cargo run -p kcache --example nats_subscribe -- --nats nats://127.0.0.1:4222 \
//!   --token-file nats-token --key-file nats-key-k1 --key _.v1.configmaps.demo.all._
//! ```

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use kcache_actors::core::mirror::{Input, Mirror, Output, Stamp};
use kcache_actors::core::seal::Keyring;
use kcache_actors::core::subject::{parse_key_token, Subjects};
use kcache_actors::core::wire::{Frame, Kind, Reassembler};

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
}

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    let parsed = parse_key_token(&args.key).ok_or("--key must be six escaped tokens")?;
    eprintln!("following {parsed:?}");
    let mut opts = async_nats::ConnectOptions::new();
    if let Some(f) = &args.token_file {
        opts = opts.token(std::fs::read_to_string(f)?.trim().to_string());
    }
    let client = opts.connect(&args.nats).await?;
    let keyring = match &args.key_file {
        Some(f) => {
            let key = base64::engine::general_purpose::STANDARD
                .decode(std::fs::read_to_string(f)?.trim())?;
            Some(Keyring::new(
                vec![(args.key_id.clone(), key)],
                &args.key_id,
            )?)
        }
        None => None,
    };
    let subjects = Subjects::new(&args.prefix);
    let mut events = client.subscribe(subjects.events(&args.key)).await?;
    // Answers come to the key's own reply space (a reader's permissions name it), under a
    // nonce of this subscriber's.
    let nonce = format!("{:016x}", rand::random::<u64>());
    let mut replies = client
        .subscribe(subjects.replies(&args.key, &nonce))
        .await?;
    let mut request = 0u64;
    let mut mirror: Mirror<(Kind, Bytes)> = Mirror::new(10_000, 10_000);
    let (mut ev_parts, mut snap_parts) = (Reassembler::default(), Reassembler::default());
    let started = std::time::Instant::now();
    // A sealed key's every message (heartbeats too) is sealed over its body and headers.
    let open = |frame: &Frame, body: Bytes| -> Result<Bytes, Error> {
        match (&frame.key_id, &keyring) {
            (Some(id), Some(ring)) => Ok(ring
                .open(id, &body, &frame.associated_data(&args.key))?
                .into()),
            (Some(id), None) => Err(format!("sealed with {id}: pass --key-file").into()),
            (None, Some(_)) => Err("an unsealed message on a sealed key: refused".into()),
            (None, None) => Ok(body),
        }
    };
    let mut want_snapshot = true;
    let period = Duration::from_secs(2);
    let mut retry = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        if want_snapshot {
            want_snapshot = false;
            snap_parts.reset();
            request += 1;
            let reply = subjects.reply(&args.key, &nonce, request);
            client
                .publish_with_reply(subjects.snapshot(&args.key), reply, "{}".into())
                .await?;
        }
        let (msg, snapshot) = tokio::select! {
            m = events.next() => (m.ok_or("subscription closed")?, false),
            m = replies.next() => (m.ok_or("subscription closed")?, true),
            _ = retry.tick() => {
                want_snapshot = !mirror.synced();
                continue;
            }
        };
        let Some(headers) = msg.headers.as_ref() else {
            // No responders: no owner yet; the retry timer asks again.
            continue;
        };
        let frame = Frame::parse(|n| headers.get(n).map(|v| v.as_str()))?;
        let stamp = Stamp {
            epoch: frame.epoch,
            seq: frame.seq,
            rv: frame.rv,
        };
        let parts = if snapshot {
            &mut snap_parts
        } else {
            &mut ev_parts
        };
        let Some(body) = parts.feed(&frame, msg.payload.clone())? else {
            continue;
        };
        let body = match open(&frame, body) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("refused a message: {e}");
                continue;
            }
        };
        let input = match frame.kind {
            Kind::Heartbeat => Input::Heartbeat(stamp),
            Kind::NotReady => continue,
            kind if snapshot => Input::Snapshot(stamp, (kind, body)),
            kind => Input::Event(stamp, (kind, body)),
        };
        for out in mirror.on(started.elapsed().as_millis() as u64, input) {
            match out {
                Output::Snapshot(s, (_, body)) => {
                    let list: serde_json::Value = serde_json::from_slice(&body)?;
                    let n = list["items"].as_array().map_or(0, Vec::len);
                    println!(
                        "SNAPSHOT epoch={} seq={} rv={} objects={n}",
                        s.epoch, s.seq, s.rv
                    );
                }
                Output::Apply(s, (_, body)) => {
                    let ev: serde_json::Value = serde_json::from_slice(&body)?;
                    println!(
                        "{} {} rv={} seq={}",
                        ev["type"].as_str().unwrap_or("?"),
                        ev["object"]["metadata"]["name"].as_str().unwrap_or("?"),
                        s.rv,
                        s.seq
                    );
                }
                Output::Progress(rv) => eprintln!("progress rv={rv}"),
                Output::Resync(why) => {
                    eprintln!("resynchronising: {why:?}");
                    want_snapshot = true;
                }
                Output::Stale(s) => {
                    eprintln!("ignored a fenced-off owner's message (epoch {})", s.epoch)
                }
            }
        }
    }
}
