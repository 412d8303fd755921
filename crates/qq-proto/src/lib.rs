//! Generated gRPC code: `v1` is the client contract of docs/api.md (`qq.v1.Broker`), `internal` the
//! node-to-node service (Raft traffic, forwarding). Nothing hand-written lives here but
//! [`codec`], the codec the generated services use.

pub mod codec;

pub mod v1 {
    tonic::include_proto!("qq.v1");

    /// The encoded `FileDescriptorSet` of `qq/v1/broker.proto` alone (not the internal
    /// service), for gRPC server reflection on the client port.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("qq_v1_descriptor");
}

pub mod internal {
    tonic::include_proto!("qq.internal.v1");
}
