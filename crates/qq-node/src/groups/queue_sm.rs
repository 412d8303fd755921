//! One queue group's state machine: the pure [`qq_core::queue::QueueState`] inside the shared
//! [`Shell`](super::shell::Shell), plus the message bodies.
//!
//! What it adds to the pure machine is IO, and only deterministic IO: it stores the body of an
//! accepted message under `(group, message id)` in RocksDB and deletes it when the machine says
//! the message is gone, so the in-memory state holds just headers. Effects that concern clients
//! are carried out only where this node leads the queue: deliveries go to the consumer sessions
//! registered here, at-most-once dead letters to the queue's leader actor
//! ([`crate::leader`]); followers apply the same entries and skip them.
//!
//! Snapshots carry the state plus the bodies of every live message, so a follower that catches
//! up by snapshot can serve them.
//!
//! Must not: read a clock, propose, or wait on anything another task could hold up (every send
//! from here is `try_send` on a bounded channel, and what a full channel means is written at
//! its bound).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use qq_core::queue::{Command, Delivery, Effect, MoveTask, QueueState, Receipts, Reply};
use qq_core::{ConsumerId, Message, MessageId, QueueConfig, Reason, Strategy};
use qq_raft::GroupId;
use qq_raft::snapshot::{SnapshotReader, SnapshotWriter};
use qq_raft::store::{Pinned, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tracing::warn;

use super::shell::{LogId, Machine, Refusals};
use crate::metrics;

/// What a queue log entry carries: the command, and for an enqueue the encoded message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueRequest {
    pub cmd: Command,
    /// postcard of [`Message`]; only with `Command::Enqueue`.
    #[serde(with = "serde_bytes")]
    pub message: Option<Vec<u8>>,
}

impl QueueRequest {
    /// A command without a message.
    pub fn command(cmd: Command) -> QueueRequest {
        QueueRequest { cmd, message: None }
    }
}

/// What a queue log entry carries: one command, or a batch of commands applied in order
/// (a publish stream's messages for this queue, proposed as one Raft entry).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum QueueEntry {
    One(QueueRequest),
    Batch(Vec<QueueRequest>),
}

/// Decode a queue entry and check it before it is proposed (or a forwarded proposal is
/// accepted) and again at apply, where an entry that fails is refused as a no-op
/// ([`Refusals`]): at most [`MAX_BATCH`] commands, each within [`Command::validate`]'s bounds,
/// an enqueue carrying a message that decodes (a body that could not be read back would stop
/// the group at the first Get), and no other command carrying one.
pub fn check_entry(payload: &[u8]) -> Result<QueueEntry, String> {
    let entry: QueueEntry =
        postcard::from_bytes(payload).map_err(|e| format!("not a queue entry: {e}"))?;
    let reqs = match &entry {
        QueueEntry::One(req) => std::slice::from_ref(req),
        QueueEntry::Batch(reqs) if reqs.len() > MAX_BATCH => {
            return Err(format!(
                "batch of {} commands, more than {MAX_BATCH}",
                reqs.len()
            ));
        }
        QueueEntry::Batch(reqs) => reqs.as_slice(),
    };
    for req in reqs {
        check_request(req)?;
    }
    Ok(entry)
}

fn check_request(req: &QueueRequest) -> Result<(), String> {
    req.cmd.validate()?;
    match (&req.cmd, &req.message) {
        (Command::Enqueue { .. }, Some(bytes)) => postcard::from_bytes::<Message>(bytes)
            .map(|_| ())
            .map_err(|e| format!("enqueue: the message does not decode: {e}")),
        (Command::Enqueue { .. }, None) => Err("enqueue: no message".into()),
        (_, Some(_)) => Err("a message with a command other than enqueue".into()),
        (_, None) => Ok(()),
    }
}

/// Commands in one batch entry, at most. Message ids are `raft index << 16 | position`.
pub const MAX_BATCH: usize = 1 << 15;
const BATCH_SHIFT: u32 = 16;

/// Deliveries buffered for a consumer with no prefetch limit (prefetch 0), at most. A consumer
/// with a limit never has more than `prefetch` deliveries outstanding, so its buffer of
/// `prefetch + 1` never fills. When this one fills, the consumer is dropped: its session ends
/// with UNAVAILABLE once it has sent what is buffered, and its unacked messages return to the
/// queue.
pub const UNLIMITED_PREFETCH_BUFFER: usize = 65_536;

/// At-most-once dead letters waiting for the leader actor, at most. When full, the dead letter
/// is dropped (at-most-once allows it) and the drop is logged.
pub const LEADER_EVENTS_BOUND: usize = 65_536;

/// The reply of a queue command as it leaves the state machine (and crosses nodes).
#[derive(Debug, Serialize, Deserialize)]
pub struct QueueReplyOut {
    pub reply: Reply,
    /// The message taken by a `Get`, read on the leader that applied it.
    pub message: Option<Message>,
}

/// Sent to a consumer session registered on this (leader) node.
#[derive(Debug)]
pub enum ConsumerEvent {
    Deliver {
        delivery: Delivery,
        message: Message,
    },
    /// The stream must end: leadership lost or queue deleted.
    Cancelled { reason: String, unavailable: bool },
}

/// A dead letter the leader must republish (at-most-once): already gone from the state.
#[derive(Debug)]
pub struct DeadLetterJob {
    pub group: GroupId,
    pub config: QueueConfig,
    pub id: MessageId,
    pub reason: Reason,
    pub died_at_ms: u64,
    /// The consumer's `reason_detail` of a reject.
    pub detail: Option<String>,
    pub message: Message,
}

/// What the state machine hands to the queue's leader actor.
#[derive(Debug)]
pub enum LeaderEvent {
    DeadLetter(DeadLetterJob),
    /// The queue's configuration in the metadata changed: bring the queue's own log in line.
    ConfigChanged,
}

/// The queue group's state, shared by the state machine (inside openraft) and the node.
pub struct QueueMachine {
    group: GroupId,
    store: Store,
    state: Mutex<QueueState>,
    last_applied: Mutex<Option<LogId>>,
    consumers: Mutex<HashMap<ConsumerId, mpsc::Sender<ConsumerEvent>>>,
    /// The leader actor's inbox while this node leads the queue; `None` otherwise.
    /// The attached leader actor's inbox, with the number of its attachment.
    leader: Mutex<Option<(u64, mpsc::Sender<LeaderEvent>)>>,
    attachments: std::sync::atomic::AtomicU64,
    /// Bumped after every applied batch (the leader actor and waiters watch it).
    applied: watch::Sender<u64>,
    /// Body writes of the entry being applied: one RocksDB write per entry, not per message.
    pending: Mutex<PendingBodies>,
    /// At-most-once dead letters dropped at a full leader inbox (the leader actor logs them).
    dropped_dead_letters: AtomicU64,
    refusals: Refusals,
}

/// Body writes collected while an entry is applied, written when it is done
/// ([`QueueMachine::flush_bodies`]). Reads look here first.
#[derive(Default)]
struct PendingBodies {
    puts: HashMap<MessageId, Vec<u8>>,
    deletes: Vec<MessageId>,
}

/// A snapshot file's header: the state; the bodies of its live messages follow as records.
/// Its encoding is a format that nodes of other versions read (qq-core's
/// `tests/snapshot_format.rs` holds golden bytes of `(state, receipts, moves)`).
#[derive(Serialize, Deserialize)]
struct QueueSnapshotHeader {
    state: QueueState,
    /// The Get receipts ([`QueueState::receipts`]), which the state's own encoding leaves out.
    receipts: Receipts,
    /// The move tasks ([`QueueState::moves`]), likewise.
    moves: BTreeMap<u64, MoveTask>,
}

/// [`QueueSnapshotHeader`] by reference, encoded from the cut's copy of the state.
#[derive(Serialize)]
struct QueueSnapshotHeaderRef<'a> {
    state: &'a QueueState,
    receipts: &'a Receipts,
    moves: &'a BTreeMap<u64, MoveTask>,
}

/// A queue's snapshot cut: a copy of its state and the bodies pinned at that moment. The copy
/// costs O(1) whatever the backlog (the state's collections are persistent and share their
/// nodes until the next apply changes them, module `qq_core::queue`); the encoding and the
/// list of live ids are made from it in [`Machine::write_cut`], off the state-machine worker.
pub struct QueueCut {
    state: QueueState,
    bodies: Pinned,
}

/// Bodies read or written per step while a snapshot is written or installed.
const SNAPSHOT_PAGE_BYTES: usize = 4 << 20;

fn io_encode<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    postcard::to_stdvec(v).map_err(|e| io::Error::other(format!("encode: {e}")))
}

impl QueueMachine {
    pub fn new(group: GroupId, store: Store, config: QueueConfig) -> Arc<QueueMachine> {
        Arc::new(QueueMachine {
            group,
            store,
            state: Mutex::new(QueueState::new(config)),
            last_applied: Mutex::new(None),
            consumers: Mutex::new(HashMap::new()),
            leader: Mutex::new(None),
            attachments: std::sync::atomic::AtomicU64::new(0),
            applied: watch::channel(0).0,
            pending: Mutex::new(PendingBodies::default()),
            dropped_dead_letters: AtomicU64::new(0),
            refusals: Refusals::default(),
        })
    }

    /// Committed entries this replica refused as no-ops since it started.
    pub fn refusals(&self) -> u64 {
        self.refusals.count()
    }

    /// Read the pure state (a short lock; do not hold it across an await).
    pub fn with_state<R>(&self, f: impl FnOnce(&QueueState) -> R) -> R {
        f(&self.state.lock().unwrap())
    }

    pub fn subscribe_applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    pub fn last_applied_index(&self) -> u64 {
        self.last_applied().map(|l| l.index).unwrap_or(0)
    }

    /// Register a consumer session's inbox (this node leads the queue). The buffer holds every
    /// delivery the prefetch allows (see [`UNLIMITED_PREFETCH_BUFFER`]).
    pub fn register_consumer(
        &self,
        consumer: ConsumerId,
        prefetch: u32,
    ) -> mpsc::Receiver<ConsumerEvent> {
        let capacity = if prefetch == 0 {
            UNLIMITED_PREFETCH_BUFFER
        } else {
            prefetch as usize + 1
        };
        let (tx, rx) = mpsc::channel(capacity);
        self.consumers.lock().unwrap().insert(consumer, tx);
        rx
    }

    pub fn unregister_consumer(&self, consumer: ConsumerId) {
        self.consumers.lock().unwrap().remove(&consumer);
    }

    pub fn local_consumers(&self) -> Vec<ConsumerId> {
        self.consumers.lock().unwrap().keys().copied().collect()
    }

    /// Tell every local consumer session to end.
    pub fn cancel_consumers(&self, reason: &str, unavailable: bool) {
        let mut consumers = self.consumers.lock().unwrap();
        for (_, tx) in consumers.drain() {
            // A full inbox ends its session anyway (the sender is dropped here).
            let _ = tx.try_send(ConsumerEvent::Cancelled {
                reason: reason.to_string(),
                unavailable,
            });
        }
    }

    /// The leader actor starts: it receives the leader-only effects from now on. Returns the
    /// attachment's number (for [`QueueMachine::detach_leader`]) and the inbox.
    pub fn attach_leader(&self) -> (u64, mpsc::Receiver<LeaderEvent>) {
        let (tx, rx) = mpsc::channel(LEADER_EVENTS_BOUND);
        let n = self
            .attachments
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.leader.lock().unwrap() = Some((n, tx));
        (n, rx)
    }

    /// The actor of attachment `n` ended. A later attachment stays: the machine outlives a
    /// replica's Raft instance (unloaded and loaded again), and the watcher of the old instance
    /// may end after the new one attached its actor.
    pub fn detach_leader(&self, n: u64) {
        let mut leader = self.leader.lock().unwrap();
        if leader.as_ref().is_some_and(|(current, _)| *current == n) {
            *leader = None;
        }
    }

    /// Tell the leader actor, if any, that the metadata changed the queue's configuration.
    pub fn notify_config_changed(&self) {
        if let Some((_, tx)) = self.leader.lock().unwrap().as_ref() {
            // Full: the actor is busy; it compares configurations again on its retry timer.
            let _ = tx.try_send(LeaderEvent::ConfigChanged);
        }
    }

    fn is_leader(&self) -> bool {
        self.leader.lock().unwrap().is_some()
    }

    fn put_body(&self, id: MessageId, body: Vec<u8>) {
        self.pending.lock().unwrap().puts.insert(id, body);
    }

    fn delete_body(&self, id: MessageId) {
        let mut pending = self.pending.lock().unwrap();
        // Ids are never reused: a body put by this entry is not on disk yet.
        if pending.puts.remove(&id).is_none() {
            pending.deletes.push(id);
        }
    }

    /// Write the bodies put and deleted by the entry just applied.
    fn flush_bodies(&self) -> io::Result<()> {
        let PendingBodies { puts, deletes } = std::mem::take(&mut *self.pending.lock().unwrap());
        if !puts.is_empty() {
            let mut bodies: Vec<(u64, &[u8])> =
                puts.iter().map(|(id, b)| (*id, b.as_slice())).collect();
            bodies.sort_unstable_by_key(|(id, _)| *id);
            self.store.put_bodies(self.group, &bodies)?;
        }
        if !deletes.is_empty() {
            self.store.delete_bodies(self.group, &deletes)?;
        }
        Ok(())
    }

    pub fn read_message(&self, id: MessageId) -> io::Result<Message> {
        let pending = self.pending.lock().unwrap().puts.get(&id).cloned();
        let bytes = match pending {
            Some(b) => Some(b),
            None => self.store.get_body(self.group, id)?,
        };
        let bytes = bytes.ok_or_else(|| {
            io::Error::other(format!(
                "queue group {}: body of message {id} is missing",
                self.group
            ))
        })?;
        postcard::from_bytes(&bytes).map_err(|e| {
            io::Error::other(format!(
                "queue group {}: decode message {id}: {e}",
                self.group
            ))
        })
    }

    /// Apply one command at sub-index `index` (raft index << 16 | position in the entry).
    fn apply_one(&self, index: u64, req: QueueRequest) -> io::Result<QueueReplyOut> {
        let QueueRequest { cmd, message: body } = req;
        let (reply, effects) = self.state.lock().unwrap().apply(index, cmd);
        // A Get's message is read before effects run (auto-ack deletes its body).
        let message = match &reply {
            Reply::Got {
                delivery: Some(d), ..
            } => Some(self.read_message(d.id)?),
            _ => None,
        };
        match &reply {
            Reply::Enqueued { id } | Reply::RejectedDeadLettered { id, .. } => {
                self.put_body(*id, body.unwrap_or_default());
            }
            _ => {}
        }
        self.carry_out(effects);
        Ok(QueueReplyOut { reply, message })
    }

    /// Carries out the effects of one command; body writes are collected for the entry.
    fn carry_out(&self, effects: Vec<Effect>) {
        let leader = self.is_leader();
        for effect in effects {
            if leader
                && let Effect::DeadLetter {
                    reason, strategy, ..
                } = &effect
            {
                metrics::dead_lettered(*reason, *strategy);
            }
            match effect {
                Effect::Deliver(delivery) if leader => self.deliver(delivery),
                Effect::Deliver(_) => {}
                Effect::DeleteBody { id } => self.delete_body(id),
                Effect::DeadLetter {
                    id,
                    reason,
                    strategy,
                    died_at_ms,
                    detail,
                } => match strategy {
                    Strategy::AtLeastOnce => {} // held in the state until DeadLetterSettle
                    Strategy::Disabled => self.delete_body(id),
                    Strategy::AtMostOnce => {
                        if leader {
                            self.hand_dead_letter(id, reason, died_at_ms, detail);
                        }
                        self.delete_body(id);
                    }
                },
            }
        }
    }

    fn deliver(&self, delivery: Delivery) {
        let consumer = delivery.consumer;
        let mut consumers = self.consumers.lock().unwrap();
        let Some(tx) = consumers.get(&consumer) else {
            return;
        };
        let message = match self.read_message(delivery.id) {
            Ok(m) => m,
            Err(e) => {
                warn!(group = self.group, "cannot deliver: {e}");
                return;
            }
        };
        if let Err(mpsc::error::TrySendError::Full(_)) =
            tx.try_send(ConsumerEvent::Deliver { delivery, message })
        {
            // See UNLIMITED_PREFETCH_BUFFER: the session ends, the new leader-side clean-up
            // returns what it held.
            warn!(
                group = self.group,
                "consumer's delivery buffer is full ({UNLIMITED_PREFETCH_BUFFER}): dropping the consumer"
            );
            consumers.remove(&consumer);
        }
    }

    /// At-most-once dead letters dropped so far because the leader actor's inbox was full
    /// ([`LEADER_EVENTS_BOUND`]); a running count since this machine started.
    pub fn dropped_dead_letters(&self) -> u64 {
        self.dropped_dead_letters.load(Ordering::Relaxed)
    }

    fn hand_dead_letter(
        &self,
        id: MessageId,
        reason: Reason,
        died_at_ms: u64,
        detail: Option<String>,
    ) {
        let message = match self.read_message(id) {
            Ok(m) => m,
            Err(e) => {
                warn!(group = self.group, "dead letter {id} lost its body: {e}");
                return;
            }
        };
        let config = self.state.lock().unwrap().config().clone();
        let job = DeadLetterJob {
            group: self.group,
            config,
            id,
            reason,
            died_at_ms,
            detail,
            message,
        };
        if let Some((_, tx)) = self.leader.lock().unwrap().as_ref() {
            if tx.try_send(LeaderEvent::DeadLetter(job)).is_err() {
                // Counted here; the leader actor logs the count, rate-limited (no clock here).
                self.dropped_dead_letters.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Machine for QueueMachine {
    /// The state as of the snapshot's index, and a pinned view of the bodies at that moment
    /// (a consistent cut: bodies removed by later entries are still in it).
    type Cut = QueueCut;

    fn group(&self) -> GroupId {
        self.group
    }

    fn store(&self) -> &Store {
        &self.store
    }

    fn apply_payload(&self, index: u64, payload: &[u8]) -> io::Result<Vec<u8>> {
        let decoded = match check_entry(payload) {
            Ok(entry) => entry,
            Err(why) => {
                let why = format!("entry {index}: {why}");
                self.refusals.record(self.group, index, &why);
                return io_encode(&QueueReplyOut {
                    reply: Reply::Error { detail: why },
                    message: None,
                });
            }
        };
        let reply = match decoded {
            QueueEntry::One(req) => io_encode(&self.apply_one(index << BATCH_SHIFT, req)?)?,
            QueueEntry::Batch(reqs) => {
                let mut replies = Vec::with_capacity(reqs.len());
                for (k, req) in reqs.into_iter().enumerate() {
                    replies.push(self.apply_one((index << BATCH_SHIFT) | k as u64, req)?);
                }
                io_encode(&replies)?
            }
        };
        self.flush_bodies()?;
        Ok(reply)
    }

    fn applied_batch(&self) {
        self.applied.send_modify(|n| *n += 1);
    }

    fn last_applied(&self) -> Option<LogId> {
        *self.last_applied.lock().unwrap()
    }

    fn set_last_applied(&self, log_id: Option<LogId>) {
        *self.last_applied.lock().unwrap() = log_id;
    }

    fn cut(&self) -> QueueCut {
        // Taken in the state-machine worker between two applies, after the previous apply's
        // bodies were written (`flush_bodies`): the state and the pinned bodies agree. Both
        // are O(1): a clone of the persistent state and a RocksDB snapshot.
        let state = self.state.lock().unwrap();
        QueueCut {
            state: state.clone(),
            bodies: self.store.pin(),
        }
    }

    fn write_cut(&self, cut: QueueCut, out: &mut SnapshotWriter) -> io::Result<()> {
        let QueueCut { state, bodies } = cut;
        out.header(&io_encode(&QueueSnapshotHeaderRef {
            state: &state,
            receipts: state.receipts(),
            moves: state.moves(),
        })?)?;
        // Both in id order: a merge of the live ids with the pinned bodies, page by page.
        let mut live = state.live_ids().peekable();
        let mut missing = 0u64;
        let mut from = 0u64;
        loop {
            let page = bodies.scan_bodies(self.group, from, SNAPSHOT_PAGE_BYTES)?;
            let Some(&(last, _)) = page.last() else {
                break;
            };
            for (id, body) in page {
                while live.next_if(|l| *l < id).is_some() {
                    missing += 1;
                }
                if live.next_if_eq(&id).is_some() {
                    out.body(id, &body)?;
                }
            }
            from = last + 1;
        }
        missing += live.count() as u64;
        if missing > 0 {
            warn!(
                group = self.group,
                missing, "snapshot written without the bodies of live messages it could not find"
            );
        }
        Ok(())
    }

    fn install(&self, snapshot: &mut SnapshotReader) -> io::Result<()> {
        let header: QueueSnapshotHeader =
            postcard::from_bytes(&snapshot.header()?).map_err(|e| {
                io::Error::other(format!("queue group {}: decode snapshot: {e}", self.group))
            })?;
        // Bodies: drop those of messages the snapshot no longer has, write the snapshot's.
        let keep: std::collections::BTreeSet<MessageId> =
            header.state.message_ids().into_iter().collect();
        let stale: Vec<MessageId> = self
            .state
            .lock()
            .unwrap()
            .message_ids()
            .into_iter()
            .filter(|id| !keep.contains(id))
            .collect();
        drop(keep);
        for ids in stale.chunks(65_536) {
            self.store.delete_bodies(self.group, ids)?;
        }
        let mut page: Vec<(MessageId, Vec<u8>)> = Vec::new();
        let mut page_bytes = 0usize;
        loop {
            let next = snapshot.next_body()?;
            let end = next.is_none();
            if let Some((id, body)) = next {
                page_bytes += body.len();
                page.push((id, body));
            }
            if page_bytes >= SNAPSHOT_PAGE_BYTES || (end && !page.is_empty()) {
                let refs: Vec<(MessageId, &[u8])> =
                    page.iter().map(|(id, b)| (*id, b.as_slice())).collect();
                self.store.put_bodies(self.group, &refs)?;
                page.clear();
                page_bytes = 0;
            }
            if end {
                break;
            }
        }
        let QueueSnapshotHeader {
            mut state,
            receipts,
            moves,
        } = header;
        state.restore_receipts(receipts);
        state.restore_moves(moves);
        *self.state.lock().unwrap() = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use qq_core::Properties;
    use qq_core::queue::Receipt;

    use super::*;

    fn enqueue(body: &[u8]) -> QueueRequest {
        let message = Message {
            properties: Properties::default(),
            body: body.to_vec().into(),
            exchange: String::new(),
            routing_key: "q".into(),
            bcc: Vec::new(),
        };
        QueueRequest {
            cmd: Command::Enqueue {
                now_ms: 1_000,
                header: qq_core::queue::MsgHeader {
                    size_bytes: body.len() as u64,
                    expiration_ms: None,
                },
                publish_key: None,
                dedup_key: None,
            },
            message: Some(postcard::to_stdvec(&message).unwrap()),
        }
    }

    fn apply(m: &QueueMachine, index: u64, req: QueueRequest) {
        let entry = postcard::to_stdvec(&QueueEntry::One(req)).unwrap();
        m.apply_payload(index, &entry).unwrap();
    }

    fn snapshot_of(m: &QueueMachine, cut: QueueCut) -> qq_raft::snapshot::SnapshotFile {
        let mut out = m.store.snapshots().writer(m.group, None).unwrap();
        m.write_cut(cut, &mut out).unwrap();
        out.finish().unwrap()
    }

    /// The watcher of an unloaded instance can end after the next instance's watcher attached
    /// its leader actor: its detach must leave the newer attachment in place (else the new
    /// actor hears no config change and no at-most-once dead letter).
    #[test]
    fn a_stale_detach_leaves_the_newer_leader_attached() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let m = QueueMachine::new(5, store, QueueConfig::new("/", "q"));
        let (old, _old_inbox) = m.attach_leader();
        let (new, mut inbox) = m.attach_leader();
        m.detach_leader(old);
        assert!(m.is_leader());
        m.notify_config_changed();
        assert!(matches!(inbox.try_recv(), Ok(LeaderEvent::ConfigChanged)));
        m.detach_leader(new);
        assert!(!m.is_leader());
    }

    /// A snapshot is the state and bodies as of its cut, whatever is applied while it is
    /// written; installed elsewhere it brings the state (receipts, move tasks included) and
    /// every live body, and removes the bodies of messages it does not have.
    #[test]
    fn a_snapshot_is_a_consistent_cut_and_installs_state_and_bodies() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let m = QueueMachine::new(5, store, QueueConfig::new("/", "q"));
        for i in 1..=300u64 {
            apply(&m, i, enqueue(&vec![i as u8; 3000]));
        }
        // One leased with a receipt, and a move task.
        let receipt = Receipt {
            token: [9; 16],
            user: "alice".into(),
        };
        apply(
            &m,
            301,
            QueueRequest::command(Command::GetWithReceipt {
                now_ms: 1_000,
                lease_ms: 60_000,
                receipt,
            }),
        );
        apply(
            &m,
            302,
            QueueRequest::command(Command::StartMove {
                now_ms: 1_000,
                destination: "elsewhere".into(),
                max_messages: 1,
                max_per_second: 5,
            }),
        );
        let at_cut = m.with_state(|s| s.clone());
        let cut = m.cut();
        // After the cut, every ready message is purged: their bodies go from RocksDB.
        apply(&m, 303, QueueRequest::command(Command::Purge));
        assert_eq!(
            m.with_state(|s| s.message_ids().len()),
            1,
            "the leased one stays"
        );
        let file = snapshot_of(&m, cut);

        // Installed on another node, over a machine with messages of its own.
        let dir2 = tempfile::tempdir().unwrap();
        let store2 = Store::open(dir2.path()).unwrap();
        let other = QueueMachine::new(5, store2.clone(), QueueConfig::new("/", "q"));
        apply(&other, 1 << 20, enqueue(b"stale"));
        let stale_id = other.with_state(|s| s.message_ids())[0];
        other.install(&mut file.reader().unwrap()).unwrap();
        let installed = other.with_state(|s| s.clone());
        assert_eq!(installed, at_cut);
        assert_eq!(installed.receipts().len(), 1);
        assert_eq!(installed.moves().len(), 1);
        installed.check_invariants().unwrap();
        let ids = installed.message_ids();
        assert_eq!(ids.len(), 300, "all 300 were live at the cut");
        for id in ids {
            let message = other.read_message(id).unwrap();
            assert_eq!(message.body.len(), 3000);
        }
        assert_eq!(
            store2.get_body(5, stale_id).unwrap(),
            None,
            "stale body removed"
        );
    }
}
