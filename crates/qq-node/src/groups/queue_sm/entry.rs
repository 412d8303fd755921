//! What a queue log entry carries (a command, or a batch of them, with the message of an
//! enqueue) and the checks it passes before it is proposed and again at apply; the reply that
//! leaves the machine.

use qq_core::Message;
use qq_core::queue::{Command, Reply};
use serde::{Deserialize, Serialize};

/// What a queue log entry carries: the command, and for an enqueue the encoded message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueRequest {
    pub cmd: Command,
    /// postcard of [`Message`]; only with an enqueue ([`Command::is_enqueue`]).
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

/// [`QueueEntry`] by reference: encodes to the same bytes (same variants in the same order, a
/// slice as a `Vec`), so a proposer keeps its requests (to propose them again) without copies.
#[derive(Serialize)]
pub enum QueueEntryRef<'a> {
    One(&'a QueueRequest),
    Batch(&'a [QueueRequest]),
}

/// Decode a queue entry and check it where its bytes came from elsewhere: a forwarded
/// proposal before it is accepted, and every entry again at apply, where one that fails is
/// refused as a no-op ([`Refusals`]): [`check_requests`], and each enqueue's message decodes
/// (a body that could not be read back would stop the group at the first Get).
pub fn check_entry(payload: &[u8]) -> Result<QueueEntry, String> {
    let entry: QueueEntry =
        postcard::from_bytes(payload).map_err(|e| format!("not a queue entry: {e}"))?;
    let reqs = match &entry {
        QueueEntry::One(req) => std::slice::from_ref(req),
        QueueEntry::Batch(reqs) => reqs.as_slice(),
    };
    check_requests(reqs)?;
    for bytes in reqs.iter().filter_map(|r| r.message.as_deref()) {
        check_message(bytes).map_err(|e| format!("enqueue: the message does not decode: {e}"))?;
    }
    Ok(entry)
}

/// Whether `bytes` decode as a [`Message`], without copying its body or names out: decoded
/// as [`MessageShape`], the same fields with the same serde attributes, borrowed.
pub fn check_message(bytes: &[u8]) -> Result<(), postcard::Error> {
    postcard::from_bytes::<MessageShape>(bytes).map(|_| ())
}

/// [`Message`]'s encoding, field by field, borrowing what can be borrowed. Kept equal to it
/// by `message_shape_accepts_what_message_accepts` (groups/untrusted_entries.rs).
#[derive(Deserialize)]
#[allow(dead_code)] // decoded to be checked, never read
struct MessageShape<'a> {
    properties: qq_core::Properties,
    #[serde(borrow, with = "serde_bytes")]
    body: &'a [u8],
    exchange: &'a str,
    routing_key: &'a str,
    #[serde(default, borrow)]
    bcc: Vec<&'a str>,
}

/// The checks of requests this node built before it proposes them: at most [`MAX_BATCH`],
/// each command within [`Command::validate`]'s bounds, an enqueue carrying a message and no
/// other command carrying one. Their messages are this node's own encoding of a
/// [`Message`] (a publish routed here, a dead letter, a moved message read back), so they
/// are not decoded again here; apply checks them with the rest ([`check_entry`]).
pub fn check_requests(reqs: &[QueueRequest]) -> Result<(), String> {
    if reqs.len() > MAX_BATCH {
        return Err(format!(
            "batch of {} commands, more than {MAX_BATCH}",
            reqs.len()
        ));
    }
    for req in reqs {
        req.cmd.validate()?;
        match (req.cmd.is_enqueue(), &req.message) {
            (true, None) => return Err("enqueue: no message".into()),
            (false, Some(_)) => return Err("a message with a command other than enqueue".into()),
            _ => {}
        }
    }
    Ok(())
}

/// Commands in one batch entry, at most. Message ids are `raft index << 16 | position`.
pub const MAX_BATCH: usize = 1 << 15;
pub(super) const BATCH_SHIFT: u32 = 16;

/// The reply of a queue command as it leaves the state machine (and crosses nodes).
#[derive(Debug, Serialize, Deserialize)]
pub struct QueueReplyOut {
    pub reply: Reply,
    /// The message taken by a `Get`, read on the leader that applied it.
    pub message: Option<Message>,
    /// A `Get`'s `x-acquired-count`: not in this encoding, which release 0.1.0 decodes, but
    /// after it ([`QueueReplyOut::encode`]), where a node of that release does not look.
    #[serde(skip)]
    pub acquired_count: Option<u32>,
}

impl QueueReplyOut {
    /// The reply as it crosses nodes: the record, then the acquired count if there is one.
    pub fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut bytes = postcard::to_stdvec(self)?;
        if let Some(n) = self.acquired_count {
            bytes.extend(postcard::to_stdvec(&n)?);
        }
        Ok(bytes)
    }

    /// The reply [`QueueReplyOut::encode`] made (or a node of release 0.1.0, without the count).
    pub fn decode(bytes: &[u8]) -> Result<QueueReplyOut, postcard::Error> {
        let (mut out, rest) = postcard::take_from_bytes::<QueueReplyOut>(bytes)?;
        if !rest.is_empty() {
            out.acquired_count = Some(postcard::from_bytes(rest)?);
        }
        Ok(out)
    }
}
