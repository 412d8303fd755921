//! The one encoding of everything the node puts in a Raft entry or sends to a peer (postcard).

use qq_raft::encoding::to_vec_exact;
use serde::{Serialize, de::DeserializeOwned};

use crate::error::NodeError;

pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, NodeError> {
    to_vec_exact(v).map_err(|e| NodeError::Internal(format!("encode: {e}")))
}

pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, NodeError> {
    postcard::from_bytes(b).map_err(|e| NodeError::Internal(format!("decode reply: {e}")))
}
