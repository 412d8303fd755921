//! Generated gRPC code: `v1` is the client contract of docs/api.md (`qq.v1.Broker`), `internal` the
//! node-to-node service (Raft traffic, forwarding). Nothing hand-written lives here.

pub mod v1 {
    tonic::include_proto!("qq.v1");
}

pub mod internal {
    tonic::include_proto!("qq.internal.v1");
}
