//! The Raft RPCs of every group towards one peer, batched on one stream per node pair.
//!
//! As unary calls, thousands of groups each sending a heartbeat, a vote or a small append are
//! thousands of HTTP/2 streams (headers, a task on each side, framing each way): the failover
//! of a node that led thousands of groups drowned two cores in them. Here a call is queued to
//! the peer's [`Mux`]; one task sends whatever is queued as one `RaftCalls` message on a
//! long-lived `Internal.RaftBatch` stream, and another hands the answers, which come back as
//! they are ready and several to a message, to their callers by id.
//!
//! Bounds, per peer: at most [`MAX_IN_FLIGHT`] calls are queued or unanswered (a caller
//! beyond waits for room within its own deadline); one message carries at most
//! [`MAX_CALLS_PER_MESSAGE`] calls or about [`MAX_MESSAGE_BYTES`]. The receiving side
//! ([`serve`]) runs at most [`MAX_IN_FLIGHT`] calls of one stream at once and stops reading it
//! beyond that, so HTTP/2 flow control holds the sender; it abandons a call when its caller's
//! deadline (`timeout_ms`) has passed.
//!
//! A stream that breaks fails every call waiting on it (openraft sees the peer unreachable and
//! backs off); the next call opens a new stream. A stream that cannot be opened fails the calls
//! that come in the next pause (100 ms, doubling to 2 s) at once, without a connection attempt
//! each: a node that is down costs one attempt per pause, not one per group.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use qq_proto::internal::{RaftAnswer, RaftAnswers, RaftCall, RaftCalls, RaftReply, RaftRequest};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tonic::Streaming;
use tonic::transport::Channel;

use crate::clock::Clock;
use crate::protocol::{self, PeerClient};

/// Calls queued or waiting for an answer on one peer's stream, and calls run at once by the
/// receiver of one stream.
pub const MAX_IN_FLIGHT: usize = 8192;
/// Most calls in one `RaftCalls` (and answers in one `RaftAnswers`) message.
pub const MAX_CALLS_PER_MESSAGE: usize = 1024;
/// A message stops taking calls once their payloads reach this many bytes.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Largest payload sent on the stream; a larger one (a large append, a snapshot chunk) goes
/// as a call of its own, so that it does not hold up the small messages queued behind it.
pub const MAX_BATCHED_PAYLOAD_BYTES: usize = 64 * 1024;
/// The longest a receiver runs a call that names no deadline (or a longer one).
const MAX_CALL_TIME: Duration = Duration::from_secs(60);
/// Deadline for opening a stream (connecting included).
const OPEN_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause after a failed open, doubling up to the second value.
const OPEN_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));
/// How often the answer reader forgets calls whose callers stopped waiting.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// `RaftCalls` messages queued for the transport before the sender waits.
const OUTBOUND_MESSAGES: usize = 16;

/// Calls and messages sent on all streams of this process (the ratio is the batching).
static CALLS_SENT: AtomicU64 = AtomicU64::new(0);
static MESSAGES_SENT: AtomicU64 = AtomicU64::new(0);

/// (calls, messages) sent on batched streams since the process started.
pub fn sent() -> (u64, u64) {
    (
        CALLS_SENT.load(Ordering::Relaxed),
        MESSAGES_SENT.load(Ordering::Relaxed),
    )
}

type Answer = Result<RaftReply, String>;

struct Queued {
    request: RaftRequest,
    timeout: Duration,
    answer: oneshot::Sender<Answer>,
    room: OwnedSemaphorePermit,
}

/// Callers waiting for an answer, by call id; the permit is their room in [`MAX_IN_FLIGHT`].
type Waiting = Arc<Mutex<HashMap<u64, (oneshot::Sender<Answer>, OwnedSemaphorePermit)>>>;

/// The batched Raft stream to one peer. Dropping it ends its tasks.
pub struct Mux {
    queue: mpsc::Sender<Queued>,
    room: Arc<Semaphore>,
}

impl Mux {
    /// A mux over `channel` to node `peer`; the stream opens with the first call. Needs a
    /// Tokio runtime. `clock` times the pause after a stream failed to open.
    pub fn new(channel: Channel, peer: u64, max_message_bytes: usize, clock: Clock) -> Mux {
        let (queue, rx) = mpsc::channel(MAX_IN_FLIGHT);
        let client = protocol::client(channel, max_message_bytes);
        tokio::spawn(drive(client, peer, rx, clock));
        Mux {
            queue,
            room: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        }
    }

    /// Sends `request` and waits at most `timeout` for its answer; the error says why none came.
    pub async fn call(&self, request: RaftRequest, timeout: Duration) -> Answer {
        let wait = async {
            let room = self
                .room
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| "closed".to_string())?;
            let (answer, answered) = oneshot::channel();
            self.queue
                .send(Queued {
                    request,
                    timeout,
                    answer,
                    room,
                })
                .await
                .map_err(|_| "closed".to_string())?;
            answered
                .await
                .map_err(|_| "the stream ended before the answer".to_string())?
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
    }
}

/// Opens a stream when calls come, sends them batched, and opens a new one when it breaks.
async fn drive(mut client: PeerClient, peer: u64, mut queue: mpsc::Receiver<Queued>, clock: Clock) {
    let mut pause = OPEN_BACKOFF.0;
    let mut next_id = 0u64;
    while let Some(first) = queue.recv().await {
        let (outbound, outbound_rx) = mpsc::channel::<RaftCalls>(OUTBOUND_MESSAGES);
        let inbound = match open(&mut client, peer, outbound_rx).await {
            Ok(inbound) => inbound,
            Err(why) => {
                tracing::debug!(peer, %why, "batched Raft stream did not open");
                let _ = first.answer.send(Err(why.clone()));
                let until = clock.now() + pause;
                while let Ok(Some(q)) = tokio::time::timeout_at(until, queue.recv()).await {
                    let _ = q.answer.send(Err(why.clone()));
                }
                pause = (pause * 2).min(OPEN_BACKOFF.1);
                continue;
            }
        };
        pause = OPEN_BACKOFF.0;
        let waiting: Waiting = Arc::default();
        let mut reader = tokio::spawn(read_answers(inbound, waiting.clone()));
        let mut next = Some(first);
        let why = loop {
            let q = match next.take() {
                Some(q) => q,
                None => tokio::select! {
                    q = queue.recv() => match q {
                        Some(q) => q,
                        None => {
                            reader.abort();
                            return;
                        }
                    },
                    ended = &mut reader => {
                        break ended.unwrap_or_else(|e| format!("answer reader: {e}"));
                    }
                },
            };
            let calls = batch(q, &mut queue, &waiting, &mut next_id);
            if calls.is_empty() {
                continue;
            }
            CALLS_SENT.fetch_add(calls.len() as u64, Ordering::Relaxed);
            MESSAGES_SENT.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                sent = outbound.send(RaftCalls { calls }) => if sent.is_err() {
                    break "the stream closed".to_string();
                },
                ended = &mut reader => {
                    break ended.unwrap_or_else(|e| format!("answer reader: {e}"));
                }
            }
        };
        reader.abort();
        tracing::debug!(peer, %why, "batched Raft stream ended");
        let why = format!("node {peer}: {why}");
        for (_, (answer, _)) in lock(&waiting).drain() {
            let _ = answer.send(Err(why.clone()));
        }
    }
}

/// Opens the batched stream whose requests are `outbound`: its answers, or why it did not open.
async fn open(
    client: &mut PeerClient,
    peer: u64,
    outbound: mpsc::Receiver<RaftCalls>,
) -> Result<Streaming<RaftAnswers>, String> {
    let opened = tokio::time::timeout(
        OPEN_TIMEOUT,
        client.raft_batch(tokio_stream::wrappers::ReceiverStream::new(outbound)),
    )
    .await;
    match opened {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(format!("node {peer}: {}", status.message())),
        Err(_) => Err(format!("node {peer}: no stream within {OPEN_TIMEOUT:?}")),
    }
}

/// One message's calls: `first` and those queued behind it, within [`MAX_CALLS_PER_MESSAGE`]
/// and about [`MAX_MESSAGE_BYTES`]; calls whose callers stopped waiting are dropped. Each call
/// gets the next id and its caller a place in `waiting`.
fn batch(
    first: Queued,
    queue: &mut mpsc::Receiver<Queued>,
    waiting: &Waiting,
    next_id: &mut u64,
) -> Vec<RaftCall> {
    let mut calls = Vec::new();
    let mut bytes = 0;
    let mut item = Some(first);
    while let Some(q) = item.take() {
        if !q.answer.is_closed() {
            *next_id += 1;
            bytes += q.request.payload.len();
            calls.push(RaftCall {
                id: *next_id,
                request: Some(q.request),
                timeout_ms: u32::try_from(q.timeout.as_millis()).unwrap_or(u32::MAX),
            });
            lock(waiting).insert(*next_id, (q.answer, q.room));
        }
        if calls.len() < MAX_CALLS_PER_MESSAGE && bytes < MAX_MESSAGE_BYTES {
            item = queue.try_recv().ok();
        }
    }
    calls
}

/// Hands answers to their callers until the stream ends; returns why it ended.
async fn read_answers(mut inbound: Streaming<RaftAnswers>, waiting: Waiting) -> String {
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(m)) => {
                    for a in m.answers {
                        let Some((answer, _room)) = lock(&waiting).remove(&a.id) else {
                            continue;
                        };
                        let _ = answer.send(a.reply.ok_or_else(|| "empty answer".to_string()));
                    }
                }
                Ok(None) => return "closed by the peer".to_string(),
                Err(status) => return status.message().to_string(),
            },
            _ = sweep.tick() => lock(&waiting).retain(|_, (answer, _)| !answer.is_closed()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The receiving side of one `RaftBatch` stream: runs each call with `handle` (at most
/// [`MAX_IN_FLIGHT`] at once, each no longer than its caller waits) and streams the answers
/// back as they are ready, several to a message.
pub fn serve<H, F>(
    inbound: Streaming<RaftCalls>,
    handle: H,
) -> impl Stream<Item = Result<RaftAnswers, tonic::Status>> + Send + 'static
where
    H: Fn(RaftRequest) -> F + Send + Sync + 'static,
    F: Future<Output = RaftReply> + Send + 'static,
{
    // Each answer keeps its permit until it is taken off the channel: never more than
    // MAX_IN_FLIGHT in it, so a sender never waits on it.
    let (answers, answers_rx) = mpsc::channel::<(RaftAnswer, OwnedSemaphorePermit)>(MAX_IN_FLIGHT);
    tokio::spawn(async move {
        let room = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let mut inbound = inbound;
        while let Ok(Some(message)) = inbound.message().await {
            for call in message.calls {
                let Ok(permit) = room.clone().acquire_owned().await else {
                    return;
                };
                let answers = answers.clone();
                let run = call.request.map(&handle);
                let limit = match call.timeout_ms {
                    0 => MAX_CALL_TIME,
                    ms => Duration::from_millis(ms.into()).min(MAX_CALL_TIME),
                };
                tokio::spawn(async move {
                    let reply = match run {
                        None => error_reply("request: missing".to_string()),
                        Some(run) => tokio::time::timeout(limit, run).await.unwrap_or_else(|_| {
                            error_reply(format!(
                                "abandoned after {limit:?}: the caller no longer waits"
                            ))
                        }),
                    };
                    let answer = RaftAnswer {
                        id: call.id,
                        reply: Some(reply),
                    };
                    let _ = answers.send((answer, permit)).await;
                });
            }
        }
    });
    futures::stream::unfold(answers_rx, |mut rx| async move {
        let (first, _room) = rx.recv().await?;
        let mut answers = vec![first];
        while answers.len() < MAX_CALLS_PER_MESSAGE {
            match rx.try_recv() {
                Ok((a, _room)) => answers.push(a),
                Err(_) => break,
            }
        }
        Some((Ok(RaftAnswers { answers }), rx))
    })
}

fn error_reply(error: String) -> RaftReply {
    RaftReply {
        payload: Default::default(),
        error,
    }
}
