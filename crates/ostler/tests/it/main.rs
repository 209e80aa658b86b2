//! The `ostler` package's integration tests, in one test binary: the real daemon and
//! client processes against the real CLI (see `common`). One binary, not one per file:
//! each file used to be its own crate that compiled and linked `common`, the gRPC
//! client, the test kit and their generic code again (35 links of the same tree).
//! `cargo nextest run -p ostler -E 'binary_id(ostler::it)'` runs them all;
//! `cargo test -p ostler --test it daemon_options::` runs one file's tests.

mod common;

mod client_attention;
mod client_cli;
mod client_commands;
mod client_examples;
mod client_network;
mod client_run;
mod client_update;
mod client_watch;
mod daemon_auth;
mod daemon_capability;
mod daemon_control;
mod daemon_controls;
mod daemon_debug_log;
mod daemon_dialogs;
mod daemon_e2e;
mod daemon_elicitation;
mod daemon_env;
mod daemon_hooks;
mod daemon_metrics;
mod daemon_notify;
mod daemon_options;
mod daemon_partials;
mod daemon_proctree;
mod daemon_resume_at;
mod daemon_startup;
mod daemon_storage;
mod daemon_suspend;
mod daemon_suspend_kill;
mod daemon_tool_results;
mod daemon_tools;
mod daemon_typed_events;
mod daemon_update;
mod daemon_watch;
mod daemon_watch_retention;
mod decode_cli;
