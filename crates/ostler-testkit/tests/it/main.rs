//! The `ostler-testkit` package's integration tests, in one test binary (each file a module).

mod determinism;
mod fake_claude;
mod fake_server;
mod live_contracts;
