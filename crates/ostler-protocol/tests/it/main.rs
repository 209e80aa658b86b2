//! The `ostler-protocol` package's integration tests, in one test binary (each file a module).

mod common;
mod contracts;
mod decode;
mod hostile;
mod subagent_identity;
mod tool_use_result;
mod typed_notices;
