//! The `ostler-server` package's integration tests, in one test binary (each file a module).

mod common;
mod connections;
mod edge;
mod grpc;
mod replay_depth;
mod tls;
