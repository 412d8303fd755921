//! `qq-node --config FILE` (or flags): run one quorumq cluster node until SIGTERM or Ctrl-C.
//! `qq-node certs ...`: create the cluster CA and a node certificate (see `qq_node::certs`).

use qq_node::config::{Args, Command, Config, LogFormat};
use tracing_subscriber::EnvFilter;

/// jemalloc rather than glibc's malloc: a message's bodies, entries and frames are allocated
/// and freed on different threads by the thousand per second, and glibc spent 17 % of an AMQP
/// leader's CPU on it (docs/benchmarks.md, "The allocator"). RocksDB's own C++ allocations
/// stay with glibc. [`qq_node::alarms::release_free_heap`] hands both allocators' free pages
/// back.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    tune_glibc_allocator();
    // First: rustls panics at the first TLS config when it cannot tell which crypto provider
    // to use (both or neither of ring/aws-lc enabled by the dependency graph); say it is ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse_with_env_help();
    if let Some(Command::Certs(certs)) = &args.command {
        init_logs(LogFormat::Text);
        if let Err(e) = qq_node::certs::run(certs) {
            eprintln!("qq-node certs: {e:#}");
            std::process::exit(1);
        }
        return Ok(());
    }
    let vars = match qq_node::config::env::process_env() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("qq-node: {e:#}");
            std::process::exit(2);
        }
    };
    let config = match Config::load(&args, &vars) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("qq-node: {e:#}");
            std::process::exit(2);
        }
    };
    init_logs(config.log_format);
    for name in qq_node::config::env::unknown_vars(&vars) {
        tracing::warn!(
            "{name}: no configuration key has this variable; ignored (see qq-node --help)"
        );
    }
    // Built once the configuration is read: `worker_threads` sizes it.
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(n) = config.worker_threads {
        runtime.worker_threads(n);
    }
    runtime.build()?.block_on(serve(config))
}

/// Run the node until a signal asks it to stop.
async fn serve(config: Config) -> anyhow::Result<()> {
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("signal received: graceful shutdown");
    };
    // A node that cannot start (or stops on an error) exits at once with status 1, without
    // waiting for background work the failed start may have left behind.
    // Time, the network and the disk are inputs: the real ones here, a simulator's in one.
    let seams = qq_node::node::Seams {
        clock: qq_node::clock::Clock::system(),
        transport: std::sync::Arc::new(qq_raft::transport::TcpTransport),
        clients: std::sync::Arc::new(qq_raft::transport::TcpTransport),
        disk: qq_raft::store::Disk::real(),
    };
    if let Err(e) = qq_node::server::run(config, seams, shutdown).await {
        tracing::error!("{e:#}");
        eprintln!("qq-node: {e:#}");
        std::process::exit(1);
    }
    Ok(())
}

/// Allocations of at least this many bytes get a mapping of their own, unmapped when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 16 << 20;

/// Free memory at the top of a glibc arena is handed back to the kernel only beyond this many
/// bytes. At glibc's default (128 KiB, which a fixed [`MMAP_THRESHOLD`] keeps) RocksDB's
/// compaction gave back the buffer of each Raft entry it decompressed (a combined entry of
/// 1 KiB messages is 50-600 KiB) and faulted fresh zeroed pages in for the next: under
/// scenario 1 over AMQP the compaction threads took 7.5 % of the machine's CPU, mostly in page
/// faults; with 8 MiB they took 1.1-1.4 % (docs/benchmarks.md, "The allocator's trim
/// threshold, the client's allocator, and an AMQP channel's commit batch"). The cost is at
/// most 8 MiB kept per arena in use; a memory alarm still hands it all back
/// ([`qq_node::alarms::release_free_heap`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 8 << 20;

/// Fix glibc's mmap threshold at [`MMAP_THRESHOLD`] (and its trim threshold at
/// [`TRIM_THRESHOLD`]). glibc raises the mmap threshold by itself to the size of the largest
/// mapped block freed so far (up to 32 MiB) and its heap trim threshold to twice
/// that: once the first password verify's Argon2id block (19 MiB) is freed, the next ones come
/// from the arena of the blocking thread that runs them, and a free of 19 MiB no longer reaches
/// the trim threshold, so they stay resident. A node that had served 1 000 declares from 16
/// logging-in clients kept 150-290 MiB of them in two runs out of four. A fixed threshold turns
/// that adjustment off; the trim threshold is then set on its own.
///
/// Since the node allocates with jemalloc ([`ALLOCATOR`]), the Argon2id blocks no longer come
/// from glibc; what still does is RocksDB's C++ code, whose large blocks (memtable arenas) the
/// same adjustment would keep resident. The setting stays for them.
fn tune_glibc_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets tuning parameters of glibc's allocator (both within their
    // bounds: the mmap threshold at most 32 MiB, the trim threshold any size).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Log lines on stderr, as text or one JSON object per line (`log_format`); `RUST_LOG` picks
/// the level (default: info, and only openraft's errors). openraft warns per group and per
/// attempt: a dead follower costs every group it is in a line per heartbeat interval, and the
/// failover of a node that led 3 000 groups wrote 10 000 lines a second (CPU the elections
/// needed). The node's own lines say the same once per peer (`peer::liveness`).
fn init_logs(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=error"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        // The span's fields (group, queue) go on each line beside the event's own.
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}
