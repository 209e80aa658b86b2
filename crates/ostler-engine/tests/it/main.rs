//! The `ostler-engine` package's integration tests, in one test binary (each file a module).

mod common;
mod control_surface;
mod fake_cli;
mod feed;
mod lifecycle;
mod permissions;
mod storage;
mod stream;
mod suspend;
