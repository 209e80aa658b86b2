//! ostler-server
