//! `qq-node --config FILE` (or flags): run one quorumq cluster node until SIGTERM or Ctrl-C.

use clap::Parser;
use qq_node::config::{Args, Config};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = match Config::load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("qq-node: {e:#}");
            std::process::exit(2);
        }
    };
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("signal received: graceful shutdown");
    };
    qq_node::server::run(config, shutdown).await
}
