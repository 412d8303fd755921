//! Move tasks (redrive): `StartMoveTask`, `GetMoveTask`, `ListMoveTasks`, `CancelMoveTask`.
//!
//! A task lives in its source queue's replicated state; its id is `{source queue id}.{task
//! number}`, so any node finds the queue that holds it. Starting validates the arguments
//! (naming the field) and proposes `StartMove` to the source; reads ask the source's leader
//! (the queue-info read); cancelling proposes `EndMove`. The work itself is the source
//! leader's ([`crate::moves`]).
//!
//! Permissions: `read` on the source (the messages leave it), `write` on a named destination
//! (as a bind's queue side). Moving back by `x-first-death-queue` checks no destination: the
//! messages return to the queues they came from.

use qq_core::meta::{Perm, QueueMeta};
use qq_core::queue::{Command, MoveState, MoveTask, Reply};
use qq_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::Api;
use super::auth::Caller;
use super::convert::vhost;
use super::guard::{self, bounded, shown};
use crate::groups::queue_sm::QueueRequest;

pub async fn start(
    api: &Api,
    request: Request<pb::StartMoveTaskRequest>,
) -> Result<Response<pb::StartMoveTaskResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    bounded(&[
        ("vhost", &r.vhost),
        ("source", &r.source),
        ("destination", &r.destination),
    ])?;
    let vhost = vhost(&r.vhost);
    if r.source.is_empty() {
        return Err(Status::invalid_argument(
            "source: a source queue name is required",
        ));
    }
    api.auth.check(&caller, &vhost, Perm::Read, &r.source)?;
    let source = api.queue_meta(&vhost, &r.source)?;
    if !r.destination.is_empty() {
        if r.destination == r.source {
            return Err(Status::invalid_argument(
                "destination: the destination is the source queue",
            ));
        }
        api.auth
            .check(&caller, &vhost, Perm::Write, &r.destination)?;
        api.queue_meta(&vhost, &r.destination)?;
    }
    let cmd = Command::StartMove {
        now_ms: api.node.clock().now_ms(),
        destination: r.destination,
        max_messages: r.max_messages,
        max_per_second: r.max_per_second,
    };
    cmd.validate().map_err(Status::invalid_argument)?;
    match api
        .node
        .proposer()
        .propose_queue(source.id, QueueRequest::command(cmd))
        .await?
    {
        Reply::MoveStarted { task } => Ok(Response::new(pb::StartMoveTaskResponse {
            task_id: task_id(&source, task),
        })),
        Reply::Error { detail } => Err(Status::failed_precondition(detail)),
        other => Err(Status::internal(format!("unexpected reply {other:?}"))),
    }
}

pub async fn get(
    api: &Api,
    request: Request<pb::GetMoveTaskRequest>,
) -> Result<Response<pb::MoveTask>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    let (source, task) = find(api, &caller, &r.task_id)?;
    let info = api.node.proposer().queue_info(source.id).await?;
    info.moves
        .iter()
        .find(|t| t.task == task)
        .map(|t| Response::new(task_pb(&source, t)))
        .ok_or_else(|| not_found(&r.task_id))
}

pub async fn list(
    api: &Api,
    request: Request<pb::ListMoveTasksRequest>,
) -> Result<Response<pb::ListMoveTasksResponse>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    let vhost = vhost(&r.vhost);
    // PERMISSION_DENIED for a vhost the caller may not see, whether it exists or not.
    api.auth.require_visible(&caller, &vhost)?;
    let state = api.node.view().current();
    let queues: Vec<QueueMeta> = state
        .queues()
        .filter(|q| q.vhost == vhost)
        .filter(|q| api.auth.check(&caller, &vhost, Perm::Read, &q.name).is_ok())
        .cloned()
        .collect();
    let mut tasks = Vec::new();
    for q in queues {
        // A queue whose leader cannot be reached now is left out of the list.
        if let Ok(info) = api.node.proposer().queue_info(q.id).await {
            tasks.extend(info.moves.iter().map(|t| task_pb(&q, t)));
        }
    }
    Ok(Response::new(pb::ListMoveTasksResponse { tasks }))
}

pub async fn cancel(
    api: &Api,
    request: Request<pb::CancelMoveTaskRequest>,
) -> Result<Response<pb::Empty>, Status> {
    let caller = api.auth.caller(&request).await?;
    let r = request.into_inner();
    let (source, task) = find(api, &caller, &r.task_id)?;
    let cmd = Command::EndMove {
        task,
        state: MoveState::Cancelled,
        detail: format!("cancelled by '{}'", caller.user),
    };
    cmd.validate().map_err(Status::invalid_argument)?;
    match api
        .node
        .proposer()
        .propose_queue(source.id, QueueRequest::command(cmd))
        .await?
    {
        Reply::Ok => Ok(Response::new(pb::Empty {})),
        Reply::Error { .. } => Err(not_found(&r.task_id)),
        other => Err(Status::internal(format!("unexpected reply {other:?}"))),
    }
}

fn task_id(source: &QueueMeta, task: u64) -> String {
    format!("{}.{task}", source.id)
}

fn not_found(task_id: &str) -> Status {
    Status::not_found(format!("move task '{}' not found", shown(task_id)))
}

/// The source queue and task number of a task id; the caller needs `read` on the source.
fn find(api: &Api, caller: &Caller, task_id: &str) -> Result<(QueueMeta, u64), Status> {
    let parsed = task_id
        .split_once('.')
        .and_then(|(q, t)| Some((q.parse::<u64>().ok()?, t.parse::<u64>().ok()?)));
    let Some((queue, task)) = parsed else {
        return Err(Status::invalid_argument(format!(
            "task_id: '{}' is not a move task id (QUEUE.TASK)",
            shown(task_id)
        )));
    };
    // A task of a queue in a vhost the caller may not see answers as one that does not exist.
    let source = guard::queue_by_id(api, caller, queue, Perm::Read, || not_found(task_id))?;
    Ok((source, task))
}

fn task_pb(source: &QueueMeta, t: &MoveTask) -> pb::MoveTask {
    let state = match t.state {
        MoveState::Running => "RUNNING",
        MoveState::Done => "DONE",
        MoveState::Cancelled => "CANCELLED",
        MoveState::Failed => "FAILED",
    };
    pb::MoveTask {
        task_id: task_id(source, t.task),
        vhost: source.vhost.clone(),
        source: source.name.clone(),
        destination: t.destination.clone(),
        state: state.into(),
        moved: t.moved,
        remaining: t.remaining(),
        detail: t.detail.clone(),
        max_per_second: t.max_per_second,
        started_at_ms: t.started_ms,
    }
}
