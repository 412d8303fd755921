//! Consumer sessions: [`session`] runs one on the queue's leader; [`relay`] connects a client
//! attached to any node to the session on the leader.

pub mod relay;
pub mod session;
