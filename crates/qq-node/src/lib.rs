//! qq-node
