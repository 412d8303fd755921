//! The client API, `qq.v1.Broker` (API.md). Every handler authenticates, checks permissions
//! against the local metadata replica, validates its input (naming the field), and then either
//! answers from the replica or proposes to the group concerned through [`Node::propose`].

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use base64::Engine;
use futures::{Stream, StreamExt, future::join_all};
use qq_core::meta::{MetaCommand, MetaReply, Perm, QueueMeta, hash_password};
use qq_core::queue::{Command, GET_CONSUMER, MsgHeader, Reply, SettleOutcome};
use qq_core::{Message, Strategy, policy};
use qq_proto::v1 as pb;
use qq_proto::v1::broker_server::Broker;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::instrument;

use crate::consume::{SessionIn, SessionOut, SubscribeArgs};
use crate::convert::*;
use crate::info::QueueInfoData;
use crate::node::{Node, now_ms};
use crate::queue_sm::QueueRequest;

pub struct BrokerService {
    pub node: Arc<Node>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn meta_err(e: qq_core::meta::MetaError) -> Status {
    meta_error_to_status(&e)
}

impl BrokerService {
    /// The authenticated user: Basic credentials, or `guest` without them.
    fn user<T>(&self, req: &Request<T>) -> Result<String, Status> {
        let (user, password) = match req.metadata().get("authorization") {
            None => ("guest".to_string(), "guest".to_string()),
            Some(v) => {
                let v = v
                    .to_str()
                    .map_err(|_| Status::unauthenticated("authorization: not ASCII"))?;
                let b64 = v.strip_prefix("Basic ").ok_or_else(|| {
                    Status::unauthenticated("authorization: expected 'Basic base64(user:password)'")
                })?;
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|_| Status::unauthenticated("authorization: invalid base64"))?;
                let raw = String::from_utf8(raw)
                    .map_err(|_| Status::unauthenticated("authorization: not UTF-8"))?;
                let (u, p) = raw.split_once(':').ok_or_else(|| {
                    Status::unauthenticated("authorization: expected user:password")
                })?;
                (u.to_string(), p.to_string())
            }
        };
        self.node
            .meta
            .state
            .read()
            .unwrap()
            .authenticate(&user, &password)
            .map_err(meta_err)?;
        Ok(user)
    }

    fn check(&self, user: &str, vhost: &str, perm: Perm, resource: &str) -> Result<(), Status> {
        let version = *self.node.meta.applied.borrow();
        let key = (
            user.to_string(),
            vhost.to_string(),
            perm as u8,
            resource.to_string(),
        );
        {
            let mut granted = self.node.granted.lock().unwrap();
            if granted.0 != version || granted.1.len() > 10_000 {
                *granted = (version, Default::default());
            } else if granted.1.contains(&key) {
                return Ok(());
            }
        }
        self.node
            .meta
            .state
            .read()
            .unwrap()
            .check_permission(user, vhost, perm, resource)
            .map_err(meta_err)?;
        let mut granted = self.node.granted.lock().unwrap();
        // Remember the grant only if the metadata did not move on since the version was read.
        if granted.0 == version && *self.node.meta.applied.borrow() == version {
            granted.1.insert(key);
        }
        Ok(())
    }

    fn require_admin(&self, user: &str) -> Result<(), Status> {
        let state = self.node.meta.state.read().unwrap();
        match state.user(user) {
            Some(u) if u.tags.iter().any(|t| t == "administrator") => Ok(()),
            _ => Err(Status::permission_denied(format!(
                "user '{user}' is not an administrator"
            ))),
        }
    }

    fn queue_meta(&self, vhost: &str, name: &str) -> Result<QueueMeta, Status> {
        if name.is_empty() {
            return Err(Status::invalid_argument("queue: a queue name is required"));
        }
        let state = self.node.meta.state.read().unwrap();
        if !state.vhost_exists(vhost) {
            return Err(Status::not_found(format!("vhost '{vhost}' not found")));
        }
        state.queue(vhost, name).cloned().ok_or_else(|| {
            Status::not_found(format!("queue '{name}' in vhost '{vhost}' not found"))
        })
    }

    async fn meta(&self, cmd: MetaCommand) -> Result<MetaReply, Status> {
        self.node.propose_meta(cmd).await?.map_err(meta_err)
    }

    /// Validate and route one publish: either its answer already, or what to enqueue where.
    fn prepare_publish(&self, user: &str, req: pb::PublishRequest) -> Result<Prepared, Status> {
        let vhost = vhost(&req.vhost);
        self.check(user, &vhost, Perm::Write, &req.exchange)?;
        let size = req.message.as_ref().map(|m| m.body.len()).unwrap_or(0);
        if size > self.node.config.max_message_bytes {
            return Err(Status::resource_exhausted(format!(
                "message.body: {size} bytes exceeds max_message_bytes {}",
                self.node.config.max_message_bytes
            )));
        }
        let (mut properties, body) = message_from_pb(req.message.as_ref())?;
        qq_core::route::validate_sender_selected(&properties.headers).map_err(meta_err)?;
        qq_core::deadletter::strip_client_death_headers(&mut properties.headers);
        let keys = qq_core::route::routing_keys(&req.routing_key, &properties.headers);
        let targets = {
            let state = self.node.meta.state.read().unwrap();
            if let Some(x) = state.exchange(&vhost, &req.exchange) {
                if x.internal {
                    return Err(Status::permission_denied(format!(
                        "exchange: '{}' in vhost '{vhost}' is internal and cannot be published to",
                        req.exchange
                    )));
                }
            }
            state
                .route(&vhost, &req.exchange, &keys, &properties.headers)
                .map_err(meta_err)?
        };
        let seq = req.seq;
        if targets.is_empty() {
            let outcome = if req.mandatory {
                pb::PublishOutcome::Unroutable
            } else {
                pb::PublishOutcome::Confirmed
            };
            let detail = if req.mandatory {
                format!(
                    "no queue is bound to exchange '{}' for key '{}'",
                    req.exchange, req.routing_key
                )
            } else {
                String::new()
            };
            return Ok(Prepared::Done(pb::PublishResponse {
                seq,
                outcome: outcome as i32,
                detail,
            }));
        }
        let visible =
            qq_core::route::visible_routing_keys(&req.routing_key, &properties.headers).len();
        let bcc = keys[visible..].to_vec();
        qq_core::route::strip_bcc(&mut properties.headers);
        let expiration_ms = if properties.expiration.is_empty() {
            None
        } else {
            Some(parse_expiration(&properties.expiration)?)
        };
        let message = Message {
            properties,
            body,
            exchange: req.exchange,
            routing_key: req.routing_key,
            bcc,
        };
        let encoded = postcard::to_stdvec(&message)
            .map_err(|e| Status::internal(format!("encode message: {e}")))?;
        let header = MsgHeader {
            size_bytes: message.body.len() as u64,
            expiration_ms,
        };
        Ok(Prepared::Route {
            seq,
            targets: targets.into_iter().map(|q| (q.id, q.name)).collect(),
            header,
            encoded,
        })
    }

    /// The enqueue command for one routed message into one queue (a fresh idempotency key, so
    /// the node's own retries of this proposal never store it twice).
    fn enqueue_request(&self, header: &MsgHeader, encoded: &[u8]) -> QueueRequest {
        let cmd = Command::Enqueue {
            now_ms: now_ms(),
            header: header.clone(),
            publisher: None,
            dedup_key: Some(self.node.next_publish_key()),
        };
        QueueRequest {
            cmd,
            message: Some(encoded.to_vec()),
        }
    }

    /// Route and enqueue one message; answers once every routed queue committed it.
    async fn publish_one(
        &self,
        user: &str,
        req: pb::PublishRequest,
    ) -> Result<pb::PublishResponse, Status> {
        let (seq, targets, header, encoded) = match self.prepare_publish(user, req)? {
            Prepared::Done(r) => return Ok(r),
            Prepared::Route {
                seq,
                targets,
                header,
                encoded,
            } => (seq, targets, header, encoded),
        };
        let results = join_all(targets.iter().map(|(id, name)| {
            let request = self.enqueue_request(&header, &encoded);
            async move { (name.clone(), self.node.propose_queue(*id, request).await) }
        }))
        .await;
        let mut rejected = Vec::new();
        for (queue, result) in results {
            if let Some(detail) = refusal(&queue, &result?)? {
                rejected.push(detail);
            }
        }
        Ok(answer(seq, rejected))
    }

    /// Publish a batch read from one stream: validated and routed in order, then one Raft
    /// entry per target queue holding that queue's messages in stream order. Answers in order.
    async fn publish_batch(
        &self,
        user: &str,
        batch: Vec<pb::PublishRequest>,
    ) -> Result<Vec<pb::PublishResponse>, Status> {
        let mut answers: Vec<Option<pb::PublishResponse>> = Vec::with_capacity(batch.len());
        let mut rejected: Vec<Vec<String>> = Vec::with_capacity(batch.len());
        let mut per_queue: BTreeMap<u64, (String, Vec<(usize, QueueRequest)>)> = BTreeMap::new();
        let mut seqs = Vec::with_capacity(batch.len());
        for (i, req) in batch.into_iter().enumerate() {
            let seq = req.seq;
            seqs.push(seq);
            rejected.push(Vec::new());
            match self.prepare_publish(user, req) {
                Ok(Prepared::Done(r)) => answers.push(Some(r)),
                // A bad message fails its own seq, not the stream.
                Err(status) => answers.push(Some(pb::PublishResponse {
                    seq,
                    outcome: pb::PublishOutcome::Rejected as i32,
                    detail: format!("{}: {}", qq_code_name(status.code()), status.message()),
                })),
                Ok(Prepared::Route {
                    targets,
                    header,
                    encoded,
                    ..
                }) => {
                    answers.push(None);
                    for (id, name) in targets {
                        let entry = per_queue.entry(id).or_insert_with(|| (name, Vec::new()));
                        entry.1.push((i, self.enqueue_request(&header, &encoded)));
                    }
                }
            }
        }
        let results = join_all(per_queue.into_iter().map(|(id, (name, items))| async move {
            let (positions, reqs): (Vec<usize>, Vec<QueueRequest>) = items.into_iter().unzip();
            (
                name,
                positions,
                self.node.propose_queue_batch(id, reqs).await,
            )
        }))
        .await;
        for (queue, positions, result) in results {
            let replies = result?;
            for (i, out) in positions.into_iter().zip(replies) {
                if let Some(detail) = refusal(&queue, &out.reply)? {
                    rejected[i].push(detail);
                }
            }
        }
        Ok(answers
            .into_iter()
            .zip(rejected)
            .zip(seqs)
            .map(|((a, r), seq)| a.unwrap_or_else(|| answer(seq, r)))
            .collect())
    }

    /// Bind or unbind: write on the queue, read on the exchange (as RabbitMQ).
    async fn binding(
        &self,
        request: Request<pb::BindRequest>,
        bind: bool,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let vhost = vhost(&r.vhost);
        self.check(&user, &vhost, Perm::Write, &r.queue)?;
        self.check(&user, &vhost, Perm::Read, &r.exchange)?;
        let arguments = table_from_pb("arguments", &r.arguments)?;
        let (queue, exchange, routing_key) = (r.queue, r.exchange, r.routing_key);
        let cmd = if bind {
            MetaCommand::Bind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            }
        } else {
            MetaCommand::Unbind {
                vhost,
                queue,
                exchange,
                routing_key,
                arguments,
            }
        };
        self.meta(cmd).await?;
        Ok(Response::new(pb::Empty {}))
    }

    fn queue_info_pb(&self, qm: &QueueMeta, data: Option<QueueInfoData>) -> pb::QueueInfo {
        let c = &qm.config;
        let effective = pb::EffectiveConfig {
            dead_letter_exchange: c.dead_letter_exchange.clone().unwrap_or_default(),
            has_dead_letter_exchange: c.dead_letter_exchange.is_some(),
            dead_letter_routing_key: c.dead_letter_routing_key.clone().unwrap_or_default(),
            dead_letter_strategy: c.dead_letter_strategy.as_str().to_string(),
            overflow: policy::overflow_name(c.overflow).to_string(),
            max_length: c.max_length,
            max_length_bytes: c.max_length_bytes,
            message_ttl_ms: c.message_ttl_ms,
            expires_ms: c.expires_ms,
            delivery_limit: c.delivery_limit,
            single_active_consumer: c.single_active_consumer,
            note: c.note.clone().unwrap_or_default(),
        };
        let mut info = pb::QueueInfo {
            name: qm.name.clone(),
            vhost: qm.vhost.clone(),
            arguments: table_to_pb(&qm.arguments),
            policy: c.policy.clone().unwrap_or_default(),
            effective: Some(effective),
            members: qm.members.clone(),
            id: qm.id,
            ..Default::default()
        };
        if let Some(d) = data {
            info.messages = d.counts.ready + d.counts.unacked + d.counts.held;
            info.messages_ready = d.counts.ready;
            info.messages_unacked = d.counts.unacked;
            info.messages_dead_letter_held = d.counts.held;
            info.consumers = d.counts.consumers;
            info.leader = d.leader;
            info.raft_term = d.term;
            info.commit_index = d.commit_index;
            info.last_applied = d.last_applied;
            info.state_digest = d.digest;
        }
        info
    }

    fn vhost_queues(&self, vhost: &str) -> Result<Vec<QueueMeta>, Status> {
        let state = self.node.meta.state.read().unwrap();
        if !state.vhost_exists(vhost) {
            return Err(Status::not_found(format!("vhost '{vhost}' not found")));
        }
        Ok(state
            .queues()
            .filter(|q| q.vhost == vhost)
            .cloned()
            .collect())
    }
}

/// What `prepare_publish` decided.
enum Prepared {
    Done(pb::PublishResponse),
    Route {
        seq: u64,
        targets: Vec<(u64, String)>,
        header: MsgHeader,
        encoded: Vec<u8>,
    },
}

/// `Some(detail)` when the queue refused the message (reject-publish limits).
fn refusal(queue: &str, reply: &Reply) -> Result<Option<String>, Status> {
    match reply {
        Reply::Enqueued { .. } | Reply::Duplicate => Ok(None),
        Reply::Rejected { detail } | Reply::RejectedDeadLettered { detail, .. } => {
            Ok(Some(detail.clone()))
        }
        other => Err(Status::internal(format!(
            "queue '{queue}': unexpected reply {other:?}"
        ))),
    }
}

fn answer(seq: u64, rejected: Vec<String>) -> pb::PublishResponse {
    if rejected.is_empty() {
        pb::PublishResponse {
            seq,
            outcome: pb::PublishOutcome::Confirmed as i32,
            detail: String::new(),
        }
    } else {
        pb::PublishResponse {
            seq,
            outcome: pb::PublishOutcome::Rejected as i32,
            detail: rejected.join("; "),
        }
    }
}

fn qq_code_name(code: tonic::Code) -> String {
    format!("{code:?}")
}

fn settle_outcome(v: i32, field: &str) -> Result<SettleOutcome, Status> {
    match pb::SettleOutcome::try_from(v) {
        Ok(pb::SettleOutcome::Ack) => Ok(SettleOutcome::Ack),
        Ok(pb::SettleOutcome::Requeue) => Ok(SettleOutcome::Requeue),
        Ok(pb::SettleOutcome::Reject) => Ok(SettleOutcome::Reject),
        _ => Err(Status::invalid_argument(format!(
            "{field}: must be ACK, REQUEUE or REJECT"
        ))),
    }
}

fn delivery_pb(tag: u64, receipt: String, redelivered: bool, m: &Message) -> pb::Delivery {
    pb::Delivery {
        delivery_tag: tag,
        receipt,
        redelivered,
        exchange: m.exchange.clone(),
        routing_key: m.routing_key.clone(),
        message: Some(message_to_pb(m)),
    }
}

#[tonic::async_trait]
impl Broker for BrokerService {
    #[instrument(skip_all, fields(exchange = %request.get_ref().name))]
    async fn declare_exchange(
        &self,
        request: Request<pb::DeclareExchangeRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let vhost = vhost(&r.vhost);
        self.check(&user, &vhost, Perm::Configure, &r.name)?;
        let arguments = table_from_pb("arguments", &r.arguments)?;
        if r.passive {
            let state = self.node.meta.state.read().unwrap();
            return match state.exchange(&vhost, &r.name) {
                Some(_) => Ok(Response::new(pb::Empty {})),
                None => Err(Status::not_found(format!(
                    "exchange '{}' in vhost '{vhost}' not found",
                    r.name
                ))),
            };
        }
        self.meta(MetaCommand::DeclareExchange {
            vhost,
            name: r.name,
            kind: r.r#type,
            durable: r.durable,
            auto_delete: r.auto_delete,
            internal: r.internal,
            arguments,
            passive: false,
        })
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn delete_exchange(
        &self,
        request: Request<pb::DeleteExchangeRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let vhost = vhost(&r.vhost);
        self.check(&user, &vhost, Perm::Configure, &r.name)?;
        self.meta(MetaCommand::DeleteExchange {
            vhost,
            name: r.name,
            if_unused: r.if_unused,
        })
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().name))]
    async fn declare_queue(
        &self,
        request: Request<pb::DeclareQueueRequest>,
    ) -> Result<Response<pb::DeclareQueueResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let vhost = vhost(&r.vhost);
        if r.name.is_empty() {
            return Err(Status::invalid_argument(
                "name: a queue name is required (quorum queues cannot be server-named)",
            ));
        }
        self.check(&user, &vhost, Perm::Configure, &r.name)?;
        let arguments = table_from_pb("arguments", &r.arguments)?;
        if let Some(dlx) = arguments.get("x-dead-letter-exchange") {
            self.check(&user, &vhost, Perm::Read, &r.name)?;
            if let Some(dlx) = dlx.as_str() {
                self.check(&user, &vhost, Perm::Write, dlx)?;
            }
        }
        let qm = if r.passive {
            self.queue_meta(&vhost, &r.name)?
        } else {
            match self
                .meta(MetaCommand::DeclareQueue {
                    vhost: vhost.clone(),
                    name: r.name.clone(),
                    arguments,
                    passive: false,
                    nodes: self.node.peers.ids(),
                })
                .await?
            {
                MetaReply::QueueDeclared { queue, .. } => queue,
                other => return Err(Status::internal(format!("unexpected reply {other:?}"))),
            }
        };
        // Wait until the queue's group has a leader, so the queue is usable when we answer.
        let data = self.node.queue_info(qm.id).await?;
        Ok(Response::new(pb::DeclareQueueResponse {
            name: qm.name,
            message_count: data.counts.ready,
            consumer_count: data.counts.consumers,
        }))
    }

    async fn delete_queue(
        &self,
        request: Request<pb::DeleteQueueRequest>,
    ) -> Result<Response<pb::DeleteQueueResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let vhost = vhost(&r.vhost);
        self.check(&user, &vhost, Perm::Configure, &r.name)?;
        let qm = self.queue_meta(&vhost, &r.name)?;
        let data = self.node.queue_info(qm.id).await.ok();
        let messages = data
            .as_ref()
            .map(|d| d.counts.ready + d.counts.unacked + d.counts.held)
            .unwrap_or(0);
        if r.if_unused && data.as_ref().map(|d| d.counts.consumers).unwrap_or(0) > 0 {
            return Err(Status::failed_precondition(format!(
                "queue '{}' in vhost '{vhost}' has consumers (if_unused)",
                r.name
            )));
        }
        if r.if_empty && messages > 0 {
            return Err(Status::failed_precondition(format!(
                "queue '{}' in vhost '{vhost}' has {messages} messages (if_empty)",
                r.name
            )));
        }
        self.meta(MetaCommand::DeleteQueue {
            vhost,
            name: r.name,
        })
        .await?;
        Ok(Response::new(pb::DeleteQueueResponse {
            message_count: messages,
        }))
    }

    async fn purge_queue(
        &self,
        request: Request<pb::PurgeQueueRequest>,
    ) -> Result<Response<pb::PurgeQueueResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let vhost = vhost(&r.vhost);
        self.check(&user, &vhost, Perm::Read, &r.name)?;
        let qm = self.queue_meta(&vhost, &r.name)?;
        match self
            .node
            .propose_queue(
                qm.id,
                QueueRequest {
                    cmd: Command::Purge,
                    message: None,
                },
            )
            .await?
        {
            Reply::Purged { count } => Ok(Response::new(pb::PurgeQueueResponse {
                message_count: count,
            })),
            other => Err(Status::internal(format!("unexpected reply {other:?}"))),
        }
    }

    async fn bind_queue(
        &self,
        request: Request<pb::BindRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.binding(request, true).await
    }

    async fn unbind_queue(
        &self,
        request: Request<pb::BindRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        self.binding(request, false).await
    }

    async fn publish(
        &self,
        request: Request<pb::PublishRequest>,
    ) -> Result<Response<pb::PublishResponse>, Status> {
        let user = self.user(&request)?;
        Ok(Response::new(
            self.publish_one(&user, request.into_inner()).await?,
        ))
    }

    type PublishStreamStream = BoxStream<pb::PublishResponse>;

    async fn publish_stream(
        &self,
        request: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        use futures::FutureExt;
        let user = self.user(&request)?;
        let mut input = request.into_inner();
        let (tx, rx) = mpsc::channel(4096);
        // One batch in flight at a time keeps the stream's order; a batch is everything that
        // arrived while the previous one was being committed (bounded).
        let max_batch = self
            .node
            .config
            .max_inflight_publishes
            .min(crate::queue_sm::MAX_BATCH);
        let service = BrokerService {
            node: self.node.clone(),
        };
        tokio::spawn(async move {
            loop {
                let first = match input.next().await {
                    Some(Ok(r)) => r,
                    Some(Err(_)) | None => return,
                };
                let mut batch = vec![first];
                let mut closed = false;
                while batch.len() < max_batch {
                    match input.next().now_or_never() {
                        Some(Some(Ok(r))) => batch.push(r),
                        Some(Some(Err(_))) | Some(None) => {
                            closed = true;
                            break;
                        }
                        None => break,
                    }
                }
                match service.publish_batch(&user, batch).await {
                    Ok(answers) => {
                        for a in answers {
                            if tx.send(Ok(a)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                }
                if closed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let vhost = vhost(&r.vhost);
        self.check(&user, &vhost, Perm::Read, &r.queue)?;
        let qm = self.queue_meta(&vhost, &r.queue)?;
        let lease_ms = if r.lease_ms == 0 { 30_000 } else { r.lease_ms };
        let cmd = Command::Get {
            now_ms: now_ms(),
            lease_ms,
            auto_ack: r.auto_ack,
        };
        let out = self
            .node
            .propose_queue_full(qm.id, QueueRequest { cmd, message: None })
            .await?;
        match out.reply {
            Reply::Got {
                delivery,
                message_count,
            } => {
                let delivery = match (delivery, out.message) {
                    (Some(d), Some(mut m)) => {
                        if d.delivery_count > 0 {
                            m.properties.headers.insert(
                                "x-delivery-count".into(),
                                qq_core::Value::Long(d.delivery_count as i64),
                            );
                        }
                        let receipt = if r.auto_ack {
                            String::new()
                        } else {
                            format!("{}-{}", qm.id, d.id)
                        };
                        Some(delivery_pb(0, receipt, d.redelivered, &m))
                    }
                    _ => None,
                };
                Ok(Response::new(pb::GetResponse {
                    delivery,
                    message_count,
                }))
            }
            other => Err(Status::internal(format!("unexpected reply {other:?}"))),
        }
    }

    async fn settle(
        &self,
        request: Request<pb::SettleRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let outcome = settle_outcome(r.outcome, "outcome")?;
        let mut by_group: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for receipt in &r.receipts {
            let parsed = receipt
                .split_once('-')
                .and_then(|(g, m)| Some((g.parse::<u64>().ok()?, m.parse::<u64>().ok()?)));
            let (group, id) = parsed.ok_or_else(|| {
                Status::invalid_argument(format!("receipts: '{receipt}' is not a receipt from Get"))
            })?;
            by_group.entry(group).or_default().push(id);
        }
        for (group, ids) in by_group {
            let qm = self
                .node
                .meta
                .state
                .read()
                .unwrap()
                .queue_by_id(group)
                .cloned()
                .ok_or_else(|| {
                    Status::not_found(format!(
                        "receipts: the queue of receipt group {group} no longer exists"
                    ))
                })?;
            self.check(&user, &qm.vhost, Perm::Read, &qm.name)?;
            let cmd = Command::Settle {
                now_ms: now_ms(),
                consumer: GET_CONSUMER,
                ids,
                outcome,
            };
            match self
                .node
                .propose_queue(group, QueueRequest { cmd, message: None })
                .await?
            {
                Reply::Error { detail } => {
                    return Err(Status::not_found(format!("receipts: {detail}")));
                }
                _ => {}
            }
        }
        Ok(Response::new(pb::Empty {}))
    }

    type ConsumeStream = BoxStream<pb::ConsumeResponse>;

    async fn consume(
        &self,
        request: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        use pb::consume_request::Request as Req;
        let user = self.user(&request)?;
        let mut input = request.into_inner();
        let first = input.next().await.ok_or_else(|| {
            Status::invalid_argument("subscribe: the first request must be subscribe")
        })??;
        let Some(Req::Subscribe(sub)) = first.request else {
            return Err(Status::invalid_argument(
                "subscribe: the first request must be subscribe",
            ));
        };
        let vhost = vhost(&sub.vhost);
        self.check(&user, &vhost, Perm::Read, &sub.queue)?;
        let qm = self.queue_meta(&vhost, &sub.queue)?;
        if sub.prefetch_count > self.node.config.max_prefetch {
            return Err(Status::resource_exhausted(format!(
                "prefetch_count: {} exceeds the node's max_prefetch {}",
                sub.prefetch_count, self.node.config.max_prefetch
            )));
        }
        let consumer_tag = if sub.consumer_tag.is_empty() {
            format!("ctag-{}", self.node.next_consumer_id())
        } else {
            sub.consumer_tag
        };
        let args = SubscribeArgs {
            group: qm.id,
            consumer_tag,
            prefetch: sub.prefetch_count,
            auto_ack: sub.auto_ack,
        };

        // Client requests → session input.
        let (in_tx, in_rx) = mpsc::channel::<SessionIn>(256);
        tokio::spawn(async move {
            while let Some(Ok(req)) = input.next().await {
                let msg = match req.request {
                    Some(Req::Settle(s)) => match settle_outcome(s.outcome, "settle.outcome") {
                        Ok(outcome) => SessionIn::Settle {
                            tags: s.delivery_tags,
                            multiple: s.multiple,
                            outcome,
                        },
                        Err(_) => SessionIn::Cancel,
                    },
                    Some(Req::Cancel(_)) => SessionIn::Cancel,
                    Some(Req::Subscribe(_)) | None => SessionIn::Subscribe(SubscribeArgs {
                        group: 0,
                        consumer_tag: String::new(),
                        prefetch: 0,
                        auto_ack: false,
                    }),
                };
                if in_tx.send(msg).await.is_err() {
                    return;
                }
            }
        });
        let (out_tx, mut out_rx) = mpsc::channel::<SessionOut>(256);
        crate::relay::start_session(self.node.clone(), args, in_rx, out_tx).await?;
        let stream = async_stream_from(
            move |tx: mpsc::Sender<Result<pb::ConsumeResponse, Status>>| async move {
                use pb::consume_response::Response as R;
                while let Some(out) = out_rx.recv().await {
                    let item = match out {
                        SessionOut::Subscribed { consumer_tag } => Ok(pb::ConsumeResponse {
                            response: Some(R::Subscribed(pb::Subscribed { consumer_tag })),
                        }),
                        SessionOut::Delivery {
                            tag,
                            redelivered,
                            message,
                        } => Ok(pb::ConsumeResponse {
                            response: Some(R::Delivery(delivery_pb(
                                tag,
                                String::new(),
                                redelivered,
                                &message,
                            ))),
                        }),
                        SessionOut::Cancelled { reason } => Ok(pb::ConsumeResponse {
                            response: Some(R::Cancelled(pb::Cancelled { reason })),
                        }),
                        SessionOut::Error { code, message } => {
                            Err(Status::new(tonic::Code::from_i32(code), message))
                        }
                    };
                    let end = item.is_err();
                    if tx.send(item).await.is_err() || end {
                        return;
                    }
                }
            },
        );
        Ok(Response::new(stream))
    }

    async fn set_policy(
        &self,
        request: Request<pb::SetPolicyRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        self.require_admin(&user)?;
        let r = request.into_inner();
        let definition = table_from_pb("definition", &r.definition)?;
        let apply_to = if r.apply_to.is_empty() {
            "all".to_string()
        } else {
            r.apply_to
        };
        self.meta(MetaCommand::SetPolicy {
            vhost: vhost(&r.vhost),
            name: r.name,
            pattern: r.pattern,
            apply_to,
            priority: r.priority,
            definition,
        })
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn clear_policy(
        &self,
        request: Request<pb::ClearPolicyRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        self.require_admin(&user)?;
        let r = request.into_inner();
        self.meta(MetaCommand::ClearPolicy {
            vhost: vhost(&r.vhost),
            name: r.name,
        })
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn list_policies(
        &self,
        request: Request<pb::ListPoliciesRequest>,
    ) -> Result<Response<pb::ListPoliciesResponse>, Status> {
        self.user(&request)?;
        let v = vhost(&request.get_ref().vhost);
        let state = self.node.meta.state.read().unwrap();
        if !state.vhost_exists(&v) {
            return Err(Status::not_found(format!("vhost '{v}' not found")));
        }
        let policies = state
            .policies(&v)
            .map(|p| pb::Policy {
                vhost: v.clone(),
                name: p.name.clone(),
                pattern: p.pattern.clone(),
                apply_to: p.apply_to.clone(),
                priority: p.priority,
                definition: table_to_pb(&p.definition),
            })
            .collect();
        Ok(Response::new(pb::ListPoliciesResponse { policies }))
    }

    async fn list_queues(
        &self,
        request: Request<pb::ListQueuesRequest>,
    ) -> Result<Response<pb::ListQueuesResponse>, Status> {
        self.user(&request)?;
        let queues = self.vhost_queues(&vhost(&request.get_ref().vhost))?;
        let infos = join_all(queues.iter().map(|q| self.node.queue_info(q.id))).await;
        let queues = queues
            .iter()
            .zip(infos)
            .map(|(q, d)| self.queue_info_pb(q, d.ok()))
            .collect();
        Ok(Response::new(pb::ListQueuesResponse { queues }))
    }

    async fn get_queue(
        &self,
        request: Request<pb::GetQueueRequest>,
    ) -> Result<Response<pb::QueueInfo>, Status> {
        self.user(&request)?;
        let r = request.into_inner();
        let qm = self.queue_meta(&vhost(&r.vhost), &r.name)?;
        let data = self.node.queue_info(qm.id).await?;
        Ok(Response::new(self.queue_info_pb(&qm, Some(data))))
    }

    async fn list_exchanges(
        &self,
        request: Request<pb::ListExchangesRequest>,
    ) -> Result<Response<pb::ListExchangesResponse>, Status> {
        self.user(&request)?;
        let v = vhost(&request.get_ref().vhost);
        let state = self.node.meta.state.read().unwrap();
        if !state.vhost_exists(&v) {
            return Err(Status::not_found(format!("vhost '{v}' not found")));
        }
        let exchanges = state
            .exchanges(&v)
            .map(|x| pb::ExchangeInfo {
                vhost: v.clone(),
                name: x.name.clone(),
                r#type: x.kind.as_str().to_string(),
                durable: x.durable,
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: table_to_pb(&x.arguments),
            })
            .collect();
        Ok(Response::new(pb::ListExchangesResponse { exchanges }))
    }

    async fn list_bindings(
        &self,
        request: Request<pb::ListBindingsRequest>,
    ) -> Result<Response<pb::ListBindingsResponse>, Status> {
        self.user(&request)?;
        let v = vhost(&request.get_ref().vhost);
        let state = self.node.meta.state.read().unwrap();
        if !state.vhost_exists(&v) {
            return Err(Status::not_found(format!("vhost '{v}' not found")));
        }
        let bindings = state
            .bindings(&v)
            .map(|b| pb::BindingInfo {
                vhost: v.clone(),
                exchange: b.source.clone(),
                queue: b.destination.clone(),
                routing_key: b.routing_key.clone(),
                arguments: table_to_pb(&b.arguments),
            })
            .collect();
        Ok(Response::new(pb::ListBindingsResponse { bindings }))
    }

    async fn put_user(
        &self,
        request: Request<pb::PutUserRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        self.require_admin(&user)?;
        let r = request.into_inner();
        if r.name.is_empty() {
            return Err(Status::invalid_argument("name: a user name is required"));
        }
        if r.password.is_empty() {
            return Err(Status::invalid_argument("password: must not be empty"));
        }
        let salt = format!(
            "{}-{}-{}",
            self.node.id,
            now_ms(),
            self.node.next_consumer_id()
        )
        .into_bytes();
        let password_hash = hash_password(&r.password, &salt);
        self.meta(MetaCommand::PutUser {
            name: r.name,
            password_hash,
            salt,
            tags: r.tags,
        })
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn delete_user(
        &self,
        request: Request<pb::DeleteUserRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        self.require_admin(&user)?;
        self.meta(MetaCommand::DeleteUser {
            name: request.into_inner().name,
        })
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn set_permissions(
        &self,
        request: Request<pb::SetPermissionsRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        self.require_admin(&user)?;
        let r = request.into_inner();
        self.meta(MetaCommand::SetPermissions {
            user: r.user,
            vhost: vhost(&r.vhost),
            configure: r.configure,
            write: r.write,
            read: r.read,
        })
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn put_vhost(
        &self,
        request: Request<pb::PutVhostRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        self.require_admin(&user)?;
        let name = request.into_inner().name;
        if name.is_empty() {
            return Err(Status::invalid_argument("name: a vhost name is required"));
        }
        self.meta(MetaCommand::PutVhost { name }).await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn delete_vhost(
        &self,
        request: Request<pb::DeleteVhostRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let user = self.user(&request)?;
        self.require_admin(&user)?;
        self.meta(MetaCommand::DeleteVhost {
            name: request.into_inner().name,
        })
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn cluster_status(
        &self,
        request: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        self.user(&request)?;
        let node = &self.node;
        let reach = join_all(node.peers.ids().into_iter().map(|id| async move {
            if id == node.id {
                return (id, true);
            }
            let Some(mut client) = node.peers.client(id) else {
                return (id, false);
            };
            let mut req = tonic::Request::new(qq_proto::internal::QueueInfoRequest { group: 0 });
            req.set_timeout(std::time::Duration::from_millis(800));
            (id, client.queue_info(req).await.is_ok())
        }))
        .await;
        let nodes = reach
            .into_iter()
            .map(|(id, reachable)| pb::NodeStatus {
                id,
                address: node.peers.address(id).unwrap_or_default().to_string(),
                reachable,
            })
            .collect();
        let metas: Vec<QueueMeta> = node.meta.state.read().unwrap().queues().cloned().collect();
        let queues = metas
            .iter()
            .map(|q| {
                let local = node.local_queue_info(q.id, false);
                pb::QueueLeader {
                    vhost: q.vhost.clone(),
                    name: q.name.clone(),
                    leader: node.known_leader(q.id).unwrap_or(0),
                    members: q.members.clone(),
                    local_member: local.is_some(),
                    local_last_applied: local.as_ref().map(|l| l.last_applied).unwrap_or(0),
                    local_state_digest: local.as_ref().map(|l| l.digest).unwrap_or(0),
                    local_term: local.as_ref().map(|l| l.term).unwrap_or(0),
                }
            })
            .collect();
        Ok(Response::new(pb::ClusterStatusResponse {
            nodes,
            metadata_leader: node.known_leader(0).unwrap_or(0),
            queues,
            node_id: node.id,
        }))
    }

    async fn overview(
        &self,
        request: Request<pb::OverviewRequest>,
    ) -> Result<Response<pb::OverviewResponse>, Status> {
        self.user(&request)?;
        let metas: Vec<QueueMeta> = self
            .node
            .meta
            .state
            .read()
            .unwrap()
            .queues()
            .cloned()
            .collect();
        let infos = join_all(metas.iter().map(|q| self.node.queue_info(q.id))).await;
        let mut o = pb::OverviewResponse {
            queues: metas.len() as u64,
            node_id: self.node.id,
            ..Default::default()
        };
        let mut dl: BTreeMap<(&'static str, &'static str), u64> = BTreeMap::new();
        for reason in qq_core::Reason::ALL {
            for strategy in [
                Strategy::Disabled,
                Strategy::AtMostOnce,
                Strategy::AtLeastOnce,
            ] {
                dl.insert((reason.as_str(), strategy.as_str()), 0);
            }
        }
        for d in infos.into_iter().flatten() {
            o.messages += d.counts.ready + d.counts.unacked + d.counts.held;
            o.messages_ready += d.counts.ready;
            o.messages_unacked += d.counts.unacked;
            o.consumers += d.counts.consumers;
            for (reason, strategy, n) in d.stats.dead_lettered_all() {
                *dl.entry((reason.as_str(), strategy.as_str())).or_default() += n;
            }
            o.messages_dead_lettered_confirmed_total += d.stats.dead_lettered_confirmed;
        }
        o.messages_dead_lettered_total = dl
            .into_iter()
            .map(|((reason, strategy), count)| pb::DeadLetterCount {
                reason: reason.into(),
                strategy: strategy.into(),
                count,
            })
            .collect();
        Ok(Response::new(o))
    }
}

/// A response stream fed by a task.
fn async_stream_from<T, F, Fut>(f: F) -> BoxStream<T>
where
    T: Send + 'static,
    F: FnOnce(mpsc::Sender<Result<T, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(f(tx));
    Box::pin(ReceiverStream::new(rx))
}
