//! ostler-proto: Rust code generated from `proto/ostler/v1/*.proto` (package `ostler.v1`),
//! plus the encoded file descriptor set for gRPC server reflection. Nothing else lives here.

#![allow(clippy::all, missing_docs, rust_2018_idioms)]

/// Package `ostler.v1`: messages, the `SessionService` / `DaemonService` servers and clients.
pub mod v1 {
    tonic::include_proto!("ostler.v1");
}

/// The encoded `google.protobuf.FileDescriptorSet` of every `ostler.v1` file, for
/// `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ostler_descriptor");
