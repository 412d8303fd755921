//! The openraft state machine of one queue group: a thin shell around the pure
//! [`qq_core::queue::QueueState`].
//!
//! What it adds to the pure machine is IO, and only deterministic IO: it stores the body of an
//! accepted message under `(group, message id)` in RocksDB and deletes it when the machine says
//! the message is gone, so the in-memory state holds just headers. Effects that concern clients
//! (deliveries, at-most-once dead letters) are carried out only on the leader, where the
//! consumers' streams are registered; followers apply the same entries and ignore them.
//!
//! Snapshots carry the state plus the bodies of every live message, so a follower that catches
//! up by snapshot can serve them. Snapshots are persisted; the in-memory state is rebuilt on
//! restart from the last snapshot plus the log (openraft re-applies from the snapshot).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use openraft::EntryPayload;
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use qq_core::queue::{Command, Delivery, Effect, QueueState, Reply};
use qq_core::{ConsumerId, Message, MessageId, QueueConfig, Reason, Strategy};
use qq_raft::store::Store;
use qq_raft::{GroupId, Response, TypeConfig};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tracing::warn;

/// What a queue log entry carries: the command, and for an enqueue the encoded message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueRequest {
    pub cmd: Command,
    /// postcard of [`Message`]; only with `Command::Enqueue`.
    #[serde(with = "serde_bytes")]
    pub message: Option<Vec<u8>>,
}

/// What a queue log entry carries: one command, or a batch of commands applied in order
/// (a publish stream's messages for this queue, proposed as one Raft entry).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum QueueEntry {
    One(QueueRequest),
    Batch(Vec<QueueRequest>),
}

/// Commands in one batch entry, at most. Message ids are `raft index << 16 | position`.
pub const MAX_BATCH: usize = 1 << 15;
const BATCH_SHIFT: u32 = 16;

/// The reply of a queue command as it leaves the state machine (and crosses nodes).
#[derive(Debug, Serialize, Deserialize)]
pub struct QueueReplyOut {
    pub reply: Reply,
    /// The message taken by a `Get`, read on the leader that applied it.
    pub message: Option<Message>,
}

/// Sent to a consumer stream registered on this (leader) node.
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
    pub message: Message,
}

/// State shared between the state machine (inside openraft) and the node.
pub struct QueueShared {
    pub group: GroupId,
    pub store: Store,
    pub state: Mutex<QueueState>,
    pub last_applied: Mutex<Option<LogIdOf<TypeConfig>>>,
    pub consumers: Mutex<HashMap<ConsumerId, mpsc::UnboundedSender<ConsumerEvent>>>,
    pub is_leader: AtomicBool,
    /// Bumped after every applied batch (timers and waiters watch it).
    pub applied: watch::Sender<u64>,
    pub dead_letters: mpsc::UnboundedSender<DeadLetterJob>,
    /// Body writes of the entry being applied: one RocksDB write per entry, not per message.
    pending: Mutex<PendingBodies>,
}

/// Body writes collected while an entry is applied, written when it is done
/// ([`QueueShared::flush_bodies`]). Reads look here first.
#[derive(Default)]
struct PendingBodies {
    puts: HashMap<MessageId, Vec<u8>>,
    deletes: Vec<MessageId>,
}

impl QueueShared {
    pub fn new(
        group: GroupId,
        store: Store,
        config: QueueConfig,
        dead_letters: mpsc::UnboundedSender<DeadLetterJob>,
    ) -> Arc<QueueShared> {
        Arc::new(QueueShared {
            group,
            store,
            state: Mutex::new(QueueState::new(config)),
            last_applied: Mutex::new(None),
            consumers: Mutex::new(HashMap::new()),
            is_leader: AtomicBool::new(false),
            applied: watch::channel(0).0,
            dead_letters,
            pending: Mutex::new(PendingBodies::default()),
        })
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

    /// Tell every local consumer stream to end.
    pub fn cancel_consumers(&self, reason: &str, unavailable: bool) {
        let mut consumers = self.consumers.lock().unwrap();
        for (_, tx) in consumers.drain() {
            let _ = tx.send(ConsumerEvent::Cancelled {
                reason: reason.to_string(),
                unavailable,
            });
        }
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
        let leader = self.is_leader.load(Ordering::Acquire);
        for effect in effects {
            match effect {
                Effect::Deliver(delivery) => {
                    if !leader {
                        continue;
                    }
                    let tx = self
                        .consumers
                        .lock()
                        .unwrap()
                        .get(&delivery.consumer)
                        .cloned();
                    if let Some(tx) = tx {
                        match self.read_message(delivery.id) {
                            Ok(message) => {
                                let _ = tx.send(ConsumerEvent::Deliver { delivery, message });
                            }
                            Err(e) => warn!(group = self.group, "cannot deliver: {e}"),
                        }
                    }
                }
                Effect::DeleteBody { id } => self.delete_body(id),
                Effect::DeadLetter {
                    id,
                    reason,
                    strategy,
                    died_at_ms,
                } => match strategy {
                    Strategy::AtLeastOnce => {} // held in the state until DeadLetterSettle
                    Strategy::Disabled => self.delete_body(id),
                    Strategy::AtMostOnce => {
                        if leader {
                            match self.read_message(id) {
                                Ok(message) => {
                                    let config = self.state.lock().unwrap().config().clone();
                                    let _ = self.dead_letters.send(DeadLetterJob {
                                        group: self.group,
                                        config,
                                        id,
                                        reason,
                                        died_at_ms,
                                        message,
                                    });
                                }
                                Err(e) => {
                                    warn!(group = self.group, "dead letter {id} lost its body: {e}")
                                }
                            }
                        }
                        self.delete_body(id);
                    }
                },
            }
        }
    }
}

/// Snapshot contents: the state and the bodies of its live messages.
#[derive(Serialize, Deserialize)]
struct QueueSnapshot {
    state: QueueState,
    bodies: Vec<(MessageId, serde_bytes::ByteBuf)>,
}

/// What is persisted for the current snapshot.
#[derive(Serialize, Deserialize)]
pub struct StoredSnapshot {
    pub meta: SnapshotMetaOf<TypeConfig>,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

pub struct QueueSm {
    pub shared: Arc<QueueShared>,
    membership: StoredMembershipOf<TypeConfig>,
}

impl QueueSm {
    pub fn new(shared: Arc<QueueShared>) -> QueueSm {
        QueueSm {
            shared,
            membership: Default::default(),
        }
    }
}

pub(crate) fn encode<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    postcard::to_stdvec(v).map_err(|e| io::Error::other(format!("encode: {e}")))
}

impl RaftStateMachine<TypeConfig> for QueueSm {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = QueueSnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>), io::Error> {
        Ok((
            *self.shared.last_applied.lock().unwrap(),
            self.membership.clone(),
        ))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + Send,
    {
        let shared = self.shared.clone();
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let index = entry.log_id.index;
            let mut payload = Vec::new();
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), m);
                }
                EntryPayload::Normal(req) => {
                    let decoded: QueueEntry = postcard::from_bytes(&req.payload).map_err(|e| {
                        io::Error::other(format!(
                            "queue group {}: decode entry {index}: {e}",
                            shared.group
                        ))
                    })?;
                    payload = match decoded {
                        QueueEntry::One(req) => {
                            encode(&shared.apply_one(index << BATCH_SHIFT, req)?)?
                        }
                        QueueEntry::Batch(reqs) => {
                            if reqs.len() > MAX_BATCH {
                                return Err(io::Error::other(format!(
                                    "entry {index}: batch of {} commands",
                                    reqs.len()
                                )));
                            }
                            let mut replies = Vec::with_capacity(reqs.len());
                            for (k, req) in reqs.into_iter().enumerate() {
                                replies.push(
                                    shared.apply_one((index << BATCH_SHIFT) | k as u64, req)?,
                                );
                            }
                            encode(&replies)?
                        }
                    };
                    shared.flush_bodies()?;
                }
            }
            *shared.last_applied.lock().unwrap() = Some(entry.log_id);
            if let Some(responder) = responder {
                responder.send(Response { payload });
            }
        }
        shared.applied.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> QueueSnapshotBuilder {
        // Capture the view here, in the state-machine worker, so later applies do not change it.
        let state = self.shared.state.lock().unwrap().clone();
        let last_applied = *self.shared.last_applied.lock().unwrap();
        QueueSnapshotBuilder {
            shared: self.shared.clone(),
            membership: self.membership.clone(),
            state,
            last_applied,
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let snap: QueueSnapshot = postcard::from_bytes(&snapshot).map_err(|e| {
            io::Error::other(format!(
                "queue group {}: decode snapshot: {e}",
                self.shared.group
            ))
        })?;
        // Bodies: drop those of messages the snapshot no longer has, write the snapshot's.
        let old_ids = self.shared.state.lock().unwrap().message_ids();
        let keep: std::collections::BTreeSet<MessageId> =
            snap.bodies.iter().map(|(id, _)| *id).collect();
        let stale: Vec<MessageId> = old_ids
            .into_iter()
            .filter(|id| !keep.contains(id))
            .collect();
        self.shared.store.delete_bodies(self.shared.group, &stale)?;
        let bodies: Vec<(MessageId, &[u8])> = snap
            .bodies
            .iter()
            .map(|(id, b)| (*id, b.as_ref()))
            .collect();
        self.shared.store.put_bodies(self.shared.group, &bodies)?;
        *self.shared.state.lock().unwrap() = snap.state;
        *self.shared.last_applied.lock().unwrap() = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        save_snapshot(
            &self.shared.store,
            self.shared.group,
            meta.clone(),
            snapshot,
        )
        .await?;
        self.shared.applied.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Vec<u8>>>, io::Error> {
        current_snapshot(&self.shared.store, self.shared.group)
    }
}

/// Persist `data` as the group's current snapshot (durably, through the fsync thread) and hand
/// it back in openraft's form. Used when building and when installing a snapshot.
pub async fn save_snapshot(
    store: &Store,
    group: GroupId,
    meta: SnapshotMetaOf<TypeConfig>,
    data: Vec<u8>,
) -> io::Result<SnapshotOf<TypeConfig, Vec<u8>>> {
    let stored = StoredSnapshot { meta, data };
    store.put_snapshot(group, &encode(&stored)?).await?;
    Ok(SnapshotOf::<TypeConfig, Vec<u8>> {
        meta: stored.meta,
        snapshot: stored.data,
    })
}

pub fn current_snapshot(
    store: &Store,
    group: GroupId,
) -> io::Result<Option<SnapshotOf<TypeConfig, Vec<u8>>>> {
    let Some(bytes) = store.get_snapshot(group)? else {
        return Ok(None);
    };
    let stored: StoredSnapshot = postcard::from_bytes(&bytes)
        .map_err(|e| io::Error::other(format!("group {group}: decode stored snapshot: {e}")))?;
    Ok(Some(SnapshotOf::<TypeConfig, Vec<u8>> {
        meta: stored.meta,
        snapshot: stored.data,
    }))
}

pub struct QueueSnapshotBuilder {
    shared: Arc<QueueShared>,
    membership: StoredMembershipOf<TypeConfig>,
    state: QueueState,
    last_applied: Option<LogIdOf<TypeConfig>>,
}

impl RaftSnapshotBuilder<TypeConfig> for QueueSnapshotBuilder {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        let state = self.state.clone();
        let last_applied = self.last_applied;
        // A body missing here belonged to a message removed by an entry after this snapshot;
        // that entry stays in the log and removes it on the receiver too.
        let mut bodies = Vec::new();
        for id in state.message_ids() {
            if let Some(b) = self.shared.store.get_body(self.shared.group, id)? {
                bodies.push((id, serde_bytes::ByteBuf::from(b)));
            }
        }
        let data = encode(&QueueSnapshot { state, bodies })?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: last_applied,
            last_membership: self.membership.clone(),
        };
        save_snapshot(&self.shared.store, self.shared.group, meta, data).await
    }
}
