//! ostler-protocol
