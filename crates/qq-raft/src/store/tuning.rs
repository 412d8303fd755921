//! How the node's RocksDB is tuned: the database options and the column families' options,
//! each choice with its reason.
//!
//! # Background work runs below the serving threads
//!
//! Every node writes the same log, so the three replicas of a busy group fill their `log`
//! memtable (64 MiB) at the same moment, and flush it, and later compact it, together. On a
//! small machine that is a burst of CPU on every node at once: about 25 ms for a flush and
//! 45 ms for a compaction per node, measured at 6 500 msg/s on two cores. Publishes confirmed
//! in those moments waited for it; in scenario 2 of qq-bench they were most of the confirms
//! slower than the p99. So the threads of RocksDB's two pools (flushes, compactions) run at the
//! lowest CPU priority (nice 19): the scheduler gives them what the serving threads leave.
//!
//! What happens at the bound: when the machine has no CPU to spare, flushes fall behind and
//! RocksDB stops writes once the memtables are full (its usual write stall). The serving
//! threads then wait, the CPU frees up and the flush runs, so the priority delays a flush but
//! cannot starve it.

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, DBRecoveryMode, Env,
    Error, Options,
};

use super::{ALL_CFS, Closing, wal_trim};

/// Shared block cache for all column families.
const BLOCK_CACHE_BYTES: usize = 64 << 20;
/// Bound on the total WAL size: a CF that is written rarely must not pin old WAL files forever.
const MAX_TOTAL_WAL_BYTES: u64 = 256 << 20;

/// The database's options.
pub(super) fn db_options(closing: Closing) -> Result<Options, Error> {
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    db_opts.set_max_background_jobs(2);
    db_opts.set_env(&background_below_serving()?);
    db_opts.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES);
    // Old WAL files are archived, then trimmed a chunk at a time ([`wal_trim`]).
    db_opts.set_wal_ttl_seconds(wal_trim::ARCHIVE_TTL_SECS);
    // Writes stay in RocksDB's WAL buffer until the fsync thread's `flush_wal(true)`: one
    // write(2) per group commit instead of one per writer. Nothing is acknowledged before
    // that flush (appends complete from the fsync thread, votes wait on `sync`), so a
    // crash loses only what no one was told is durable.
    db_opts.set_manual_wal_flush(true);
    db_opts.set_compression_type(DBCompressionType::Lz4);
    // See "Storage faults are fail-stop" in the store's module doc for why PointInTime.
    db_opts.set_wal_recovery_mode(DBRecoveryMode::PointInTime);
    if closing == Closing::AsAKill {
        db_opts = db_opts.get_options_from_string("avoid_flush_during_shutdown=true")?;
    }
    Ok(db_opts)
}

/// RocksDB's default environment with the threads of both its pools (flushes in the high one,
/// compactions in the low one) at the lowest CPU priority (module doc). RocksDB has one default
/// environment per process, so this holds for every database the process opens.
fn background_below_serving() -> Result<Env, Error> {
    let mut env = Env::new()?;
    env.lower_high_priority_thread_pool_cpu_priority();
    env.lower_thread_pool_cpu_priority();
    Ok(env)
}

/// Every column family, sharing one block cache.
pub(super) fn column_families() -> impl Iterator<Item = ColumnFamilyDescriptor> {
    let cache = Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    ALL_CFS.into_iter().map(move |name| {
        let mut bbo = BlockBasedOptions::default();
        bbo.set_block_cache(&cache);
        let mut o = Options::default();
        o.set_compression_type(DBCompressionType::Lz4);
        o.set_block_based_table_factory(&bbo);
        ColumnFamilyDescriptor::new(name, o)
    })
}
