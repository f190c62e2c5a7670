//! The `kcache` binary: parse flags, set up logging and metrics, bind, call `server::run`.

use std::net::TcpListener;
use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{CommandFactory, Parser, Subcommand};
use kcache::config::Config;
use kcache::server::Serving;

/// `0.1.0 (rev 1a2b3c4d5e6f)`: the git revision comes from `build.rs`.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (rev ",
    env!("KCACHE_GIT_REVISION"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "kcache",
    version = VERSION,
    about = "A horizontally scaled cache tier for the Kubernetes list/watch API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Kubernetes API from the cache.
    Serve(Box<ServeArgs>),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the kcache(1) man page (roff) to stdout.
    Man,
    /// Print the public key (base64) of a fleet signing key file (`nats.signing_key_file`:
    /// a 32-byte seed, base64, e.g. `head -c 32 /dev/urandom | base64`), for the
    /// `nats.verify_key_files` of a rotation or for NATS subscribers that verify events.
    NatsPublicKey { file: String },
    /// Wait, then exit: a container `preStop` hook, so that endpoints stop sending new
    /// connections before SIGTERM starts the shutdown (the image has no shell or `sleep`).
    PreStop {
        #[arg(long, default_value_t = 5)]
        delay_seconds: u64,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// kubeconfig for the upstream API server; without it, kube's inference (KUBECONFIG,
    /// ~/.kube/config, in-cluster service account).
    #[arg(long, env = "KCACHE_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Address to serve on.
    #[arg(long, env = "KCACHE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    /// Address of kcache's own /livez, /readyz, /metrics and /debug/keys (plain HTTP;
    /// /metrics unauthenticated, keep it on the pod network; /debug/keys authorized), so
    /// that the API address is the API server's alone: it proxies the API server's own
    /// /livez, /readyz, /healthz and /metrics, as clients of an API server expect.
    /// `api` serves kcache's admin endpoints on the API address instead (those paths are
    /// then kcache's, not the API server's).
    #[arg(long, env = "KCACHE_ADMIN_LISTEN", default_value = "127.0.0.1:8081")]
    admin_listen: String,
    /// Configuration file (see config/kcache.toml); without it, ./config/kcache.toml or
    /// /etc/kcache/kcache.toml, the first that exists, else the built-in defaults.
    #[arg(long, env = "KCACHE_CONFIG")]
    config: Option<PathBuf>,
    /// NATS URL: join a fleet of replicas sharing one upstream watch per key
    /// (see docs/nats.md). Without it, kcache runs as a single replica.
    #[arg(long, env = "KCACHE_NATS_URL")]
    nats: Option<String>,
    /// Replica id shown in /debug/keys (default: the config's, else the hostname).
    #[arg(long, env = "KCACHE_REPLICA_ID")]
    replica_id: Option<String>,
    /// PEM certificate (chain) to serve; without it a self-signed one is generated.
    #[arg(long, env = "KCACHE_TLS_CERT_FILE")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "KCACHE_TLS_PRIVATE_KEY_FILE")]
    tls_private_key_file: Option<PathBuf>,
    /// PEM CA bundle: client certificates it signed authenticate (CN = user, O = groups),
    /// as the API server's --client-ca-file.
    #[arg(long, env = "KCACHE_CLIENT_CA_FILE")]
    client_ca_file: Option<PathBuf>,
    /// Seconds between looks at --tls-cert-file/--tls-private-key-file for a renewed pair
    /// (tests shorten it).
    #[arg(
        long,
        hide = true,
        default_value_t = kcache::tls::DEFAULT_RELOAD_INTERVAL.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    tls_reload_interval_secs: u64,
    /// Forward kubelets' proxied requests (node status, leases, events) authenticated by
    /// their client certificates, as kcache impersonating `system:node:*` users in group
    /// `system:nodes` only: `[auth] impersonate_cert_users = true` with
    /// `impersonate_user_prefixes = ["system:node:"]`, `impersonate_groups =
    /// ["system:nodes"]`. Needs --client-ca-file and deploy/components/kubelet-certs' RBAC.
    #[arg(long, env = "KCACHE_IMPERSONATE_NODES", value_parser = BoolishValueParser::new())]
    impersonate_nodes: bool,
    /// Serve plain HTTP instead of HTTPS (local use only: kubectl sends no token over it).
    #[arg(long, env = "KCACHE_INSECURE_HTTP", value_parser = BoolishValueParser::new())]
    insecure_http: bool,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "KCACHE_LOG_JSON", value_parser = BoolishValueParser::new())]
    log_json: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Serve(args) => *args,
        // Rendered into memory first: the generators panic on a write error (a closed pipe).
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "kcache", &mut out);
            return print(&out);
        }
        Command::PreStop { delay_seconds } => {
            std::thread::sleep(std::time::Duration::from_secs(delay_seconds.min(3600)));
            return std::process::ExitCode::SUCCESS;
        }
        Command::NatsPublicKey { file } => {
            use base64::Engine;
            return match kcache_actors::fleet::signer_from_file(&file) {
                Ok(signer) => {
                    let key = base64::engine::general_purpose::STANDARD.encode(signer.public_key());
                    print(format!("{key}\n").as_bytes())
                }
                Err(e) => {
                    eprintln!("kcache: {e}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Command::Man => {
            let mut out = Vec::new();
            return match clap_mangen::Man::new(Cli::command()).render(&mut out) {
                Ok(()) => print(&out),
                Err(e) => {
                    eprintln!("kcache: rendering the man page: {e}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
    };
    init_tracing(args.log_json);
    match actix_web::rt::System::new().block_on(serve(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("kcache: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes generated text to stdout; a reader that went away is not an error worth a panic.
fn print(text: &[u8]) -> std::process::ExitCode {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text).and_then(|()| stdout.flush()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kcache: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config_path = args.config.clone().or_else(Config::default_path);
    if let Some(path) = &config_path {
        tracing::info!(path = %path.display(), "reading configuration");
    }
    let mut cfg = Config::load(config_path.as_deref())?;
    if args.replica_id.is_some() {
        cfg.server.replica_id = args.replica_id;
    }
    if args.nats.is_some() {
        cfg.nats.url = args.nats;
    }
    if args.impersonate_nodes {
        cfg.auth.impersonate_cert_users = true;
        cfg.auth.impersonate_user_prefixes = vec!["system:node:".into()];
        cfg.auth.impersonate_groups = vec!["system:nodes".into()];
    }
    let kube_config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    // Histograms as Prometheus histograms (buckets), not summaries: they aggregate across
    // replicas. Seconds, from a millisecond to a minute.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0,
        ])?
        .install_recorder()?;
    let serving = if args.insecure_http {
        Serving::Plain
    } else {
        let host = args
            .listen
            .rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']).to_string());
        let tls = kcache::tls::server_config(
            args.tls_cert_file.as_deref(),
            args.tls_private_key_file.as_deref(),
            args.client_ca_file.as_deref(),
            &host.into_iter().collect::<Vec<_>>(),
            std::time::Duration::from_secs(args.tls_reload_interval_secs),
        )?;
        Serving::Tls(Box::new(tls))
    };
    let listeners = kcache::server::Listeners {
        api: TcpListener::bind(&args.listen)?,
        admin: match args.admin_listen.as_str() {
            "api" => None,
            addr => Some(TcpListener::bind(addr)?),
        },
    };
    kcache::server::run(
        cfg,
        kube_config,
        listeners,
        serving,
        metrics,
        shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The log filter when `KCACHE_LOG` is not set: `info`, but actix-web's HTTP/2
/// dispatcher only from `error`. It warns `Send data error: Error { kind:
/// User(InactiveStreamId) }` when a response ends (its END_STREAM frame) on a stream the
/// client already reset or whose connection it closed: nothing was lost and nothing is
/// wrong with kcache. A watch's body ends on a timeout, a 410 or a drain, and a
/// cancelled watch is only noticed at its next write (`cache.watch_keepalive_secs`), so
/// every shutdown drain logged one line per watch whose client left in the last 15 s: at
/// the end of `loadtest/coalesce.sh`, one per watch, ~64,000 lines hiding the rest of
/// the log. Its `error` level (a response body that failed) still shows.
const DEFAULT_LOG_FILTER: &str = "info,actix_http::h2::dispatcher=error";

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KCACHE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[cfg(test)]
mod tests {
    use super::DEFAULT_LOG_FILTER;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// Records the target and level of every event that passes the filter.
    struct Seen(Arc<Mutex<Vec<(String, tracing::Level)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let m = event.metadata();
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((m.target().to_string(), *m.level()));
        }
    }

    #[test]
    fn the_default_filter_drops_only_the_h2_dispatchers_warnings() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER))
            .with(Seen(seen.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "actix_http::h2::dispatcher", "Send data error");
            tracing::error!(target: "actix_http::h2::dispatcher", "Response payload stream error");
            tracing::warn!(target: "actix_http::h1::dispatcher", "other");
            tracing::warn!(target: "kcache_actors::source", "upstream request failed");
            tracing::info!(target: "kcache::server", "shutting down");
            tracing::debug!(target: "kcache::server", "detail");
        });
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let want = [
            ("actix_http::h2::dispatcher", tracing::Level::ERROR),
            ("actix_http::h1::dispatcher", tracing::Level::WARN),
            ("kcache_actors::source", tracing::Level::WARN),
            ("kcache::server", tracing::Level::INFO),
        ];
        let want: Vec<_> = want.iter().map(|(t, l)| (t.to_string(), *l)).collect();
        assert_eq!(seen, want);
    }
}
