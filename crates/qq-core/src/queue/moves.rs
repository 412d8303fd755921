//! Move tasks (redrive): a queue moves ready messages to another queue, one task at a time.
//! While a task runs the queue delivers nothing, so the messages it takes stay ready until
//! [`super::Command::MoveDone`] removes them; [`super::Command::EndMove`] ends it early. The
//! running task and the last [`MAX_ENDED_MOVES`] ended ones live beside the state's encoding
//! (a snapshot carries them, [`QueueState::moves`] and [`QueueState::restore_moves`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Effect, Place, QueueState, Reply};
use crate::types::MessageId;

/// Where a move task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveState {
    Running,
    Done,
    Cancelled,
    Failed,
}

/// A move task (redrive) out of a queue, kept in the queue's replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveTask {
    /// The log index of its `StartMove`.
    pub task: u64,
    /// Empty: each message to the queue named by its `x-first-death-queue` header.
    pub destination: String,
    /// 0: no limit.
    pub max_per_second: u32,
    /// How many messages it moves: `max_messages` (0: all), at most what was ready at start.
    pub total: u64,
    pub moved: u64,
    pub state: MoveState,
    /// Why it failed or was cancelled; empty otherwise.
    pub detail: String,
    pub started_ms: u64,
}

impl MoveTask {
    /// Messages still to move (0 once it ended).
    pub fn remaining(&self) -> u64 {
        if self.state == MoveState::Running {
            self.total.saturating_sub(self.moved)
        } else {
            0
        }
    }
}

/// Ended move tasks a queue remembers (the oldest is forgotten first).
pub const MAX_ENDED_MOVES: usize = 16;
/// Longest move destination name, in bytes (a queue name's bound).
pub const MAX_MOVE_DESTINATION_BYTES: usize = 255;

impl QueueState {
    /// Every move task the queue remembers, by task number.
    pub fn moves(&self) -> &BTreeMap<u64, MoveTask> {
        &self.moves
    }

    /// The running move task, if any.
    pub fn running_move(&self) -> Option<&MoveTask> {
        self.moves.values().find(|t| t.state == MoveState::Running)
    }

    /// Puts back the move tasks a snapshot carried.
    pub fn restore_moves(&mut self, moves: BTreeMap<u64, MoveTask>) {
        self.moves = moves;
    }

    pub(super) fn start_move(
        &mut self,
        index: u64,
        now: u64,
        destination: String,
        max_messages: u64,
        max_per_second: u32,
    ) -> Reply {
        if let Some(t) = self.running_move() {
            return Reply::Error {
                detail: format!(
                    "queue '{}' already has a running move task ({})",
                    self.config.name, t.task
                ),
            };
        }
        let ready = self.ready_len();
        let total = if max_messages == 0 {
            ready
        } else {
            max_messages.min(ready)
        };
        self.moves.insert(
            index,
            MoveTask {
                task: index,
                destination,
                max_per_second,
                total,
                moved: 0,
                state: MoveState::Running,
                detail: String::new(),
                started_ms: now,
            },
        );
        Reply::MoveStarted { task: index }
    }

    /// Ready messages named leave (their copies are committed in the destination); the rest
    /// (already gone, or taken after a cancel) are left alone.
    pub(super) fn move_done(
        &mut self,
        task: u64,
        ids: &[MessageId],
        fx: &mut Vec<Effect>,
    ) -> Reply {
        if !self.moves.contains_key(&task) {
            return Reply::Error {
                detail: format!("no move task {task}"),
            };
        }
        let mut moved = 0u64;
        for &id in ids {
            if matches!(
                self.msgs.get(&id).map(|m| &m.place),
                Some(Place::Ready { .. })
            ) {
                self.detach_ready(id);
                self.forget(&id);
                fx.push(Effect::DeleteBody { id });
                moved += 1;
            }
        }
        let t = self.moves.get_mut(&task).expect("task exists");
        t.moved += moved;
        Reply::Ok
    }

    pub(super) fn end_move(&mut self, task: u64, state: MoveState, detail: String) -> Reply {
        let Some(t) = self.moves.get_mut(&task) else {
            return Reply::Error {
                detail: format!("no move task {task}"),
            };
        };
        if matches!(state, MoveState::Running | MoveState::Done) {
            return Reply::Error {
                detail: format!("a move task cannot be ended as {state:?}"),
            };
        }
        if t.state == MoveState::Running {
            t.state = state;
            t.detail = detail;
        }
        Reply::Ok
    }

    /// A running task is done once it moved its total or nothing is ready any more; only the
    /// last [`MAX_ENDED_MOVES`] ended tasks are kept.
    pub(super) fn finish_moves(&mut self) {
        let ready = self.ready_len();
        for t in self.moves.values_mut() {
            if t.state == MoveState::Running && (t.moved >= t.total || ready == 0) {
                t.state = MoveState::Done;
            }
        }
        while self
            .moves
            .values()
            .filter(|t| t.state != MoveState::Running)
            .count()
            > MAX_ENDED_MOVES
        {
            let oldest = self
                .moves
                .values()
                .find(|t| t.state != MoveState::Running)
                .map(|t| t.task)
                .expect("an ended task exists");
            self.moves.remove(&oldest);
        }
    }
}
